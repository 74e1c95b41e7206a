"""dflash_edge.export — torch reference models, fetch/import, ONNX export (DESIGN.md §2)."""
