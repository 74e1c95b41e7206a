"""dflash_edge.engines — `build-engines` (`build.py`): a bundle's TensorRT engines built ahead of
time into the cache the runtime's TensorRT path (onnxruntime's TensorRT execution provider) loads.
Floor 4, beside export/ and quantize/."""
