"""dflash_edge.engines — bundle -> TensorRT engines (`build.py`), and whether the portable graphs
only use operators TensorRT supports (`readiness.py`, from the documented table in `op_support.py`).
Floor 4, beside export/ and quantize/; TensorRT itself is imported only when an engine is built."""
