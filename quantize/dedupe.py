"""One copy of each quantised tensor per bundle: a graph lowered after another references identical bytes.

The two target flavours (portable and fused) hold the same weights; quantised one after the other they
give byte-identical MatMulNBits / GatherBlockQuantized tensors (round-to-nearest is deterministic). Before
a graph is saved, `TensorIndex.share` points each initializer whose bytes an earlier graph already stored
at that graph's data file, so only the tensors new to it go into its own `.onnx.data`. A streamed graph
(stream.py) consults and fills `where` tensor by tensor as it writes, so identical tensors within one graph
(the tied embedding's two scale tensors) are stored once too.

>>> index = TensorIndex(Path("bundle-int4"))                    # doctest: +SKIP
>>> index.add(Path("bundle-int4/target.onnx"))                  # doctest: +SKIP
>>> shared_files = index.share(fused_model)                    # doctest: +SKIP   (then save it)
"""
from __future__ import annotations

import hashlib
from pathlib import Path


class TensorIndex:
    """sha256 of each external tensor's bytes -> (file, offset, length), over the graphs `add`ed so far."""

    def __init__(self, root: Path):
        self.root, self.where = Path(root), {}

    def add(self, model_path: Path) -> None:
        import onnx

        model = onnx.load(str(model_path), load_external_data=False)
        for init in model.graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in init.external_data}
            offset, length = int(info.get("offset", 0)), int(info["length"])
            with open(self.root / info["location"], "rb") as f:
                f.seek(offset)
                key = hashlib.sha256(f.read(length)).digest()
            self.where.setdefault(key, (info["location"], offset, length))

    def share(self, model, min_bytes: int = 1024) -> list[str]:
        """Turn `model`'s in-memory initializers already stored by an indexed graph into references to them;
        returns the files referenced (relative to the bundle)."""
        from dflash_edge.runtime.tensor_file import set_external

        used = set()
        for init in model.graph.initializer:
            if not init.HasField("raw_data") or len(init.raw_data) < min_bytes:
                continue
            hit = self.where.get(hashlib.sha256(init.raw_data).digest())
            if hit is None:
                continue
            set_external(init, *hit)
            used.add(hit[0])
        return sorted(used)
