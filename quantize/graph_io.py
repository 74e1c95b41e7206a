"""Load a bundle graph with its weights; save one the way the exporter does (`NAME.onnx` + `NAME.onnx.data`)."""
from __future__ import annotations

from pathlib import Path


def load_graph(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=True)


def save_graph(model, path: Path) -> list[str]:
    """Write `path` and its external data file; returns the two file names (relative to path's folder).

    A graph loaded whole has its tensors written to `path.data` here; a streamed one (stream.py) placed
    them there already, tensor by tensor (the file exists), so only its proto is written.
    """
    import onnx

    data = path.name + ".data"
    if (path.parent / data).exists():
        onnx.save_model(model, str(path))
    else:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
    return [path.name, data]
