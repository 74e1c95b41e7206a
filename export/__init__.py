"""dflash_edge.export — the bundle writer: checkpoints -> ONNX graphs written node by node, parity,
manifest (docs/design.md §2)."""
