"""dflash_edge.export — the bundle writer: checkpoints -> ONNX graphs written node by node, parity, manifest (DESIGN.md §2)."""
