"""TensorRT optimisation profiles (min / opt / max shape per input), derived from the I/O table +
manifest.

Pure Python (no tensorrt import): the engine builder and the TensorRT runner share it.

Ranges of the dynamic symbols (docs/design.md §4):
    T (target tokens)        min 1 (decode), opt B (verify), max max(P, B) (prefill chunk)
    S (cached positions)     min 0 (first prefill chunk), opt max_context // 2, max max_context
    C (new drafter context)  min 1, opt B, max max(P, B) (a prefill chunk or an accepted block)

>>> trt_profiles(read_bundle("bundle/"))["target"]["input_ids"]      # doctest: +SKIP
{'min': (1, 1), 'opt': (1, 16), 'max': (1, 64)}
"""

from __future__ import annotations

from pathlib import Path

from .io_tables import GRAPHS, model_dims, portable_graphs, resolve_shape

Shape = tuple[int, ...]


def symbol_ranges(manifest: dict) -> dict[str, tuple[int, int, int]]:
    """Dynamic symbol -> (min, opt, max) for a bundle's manifest."""
    b, p, ctx = manifest["block_size"], manifest["prefill_chunk"], manifest["max_context"]
    chunk = max(p, b)
    return {"T": (1, b, chunk), "S": (0, max(ctx // 2, 1), ctx), "C": (1, b, chunk)}


def trt_profiles(bundle) -> dict[str, dict[str, dict[str, Shape]]]:
    """graph -> input name -> {"min", "opt", "max"} shapes, for every portable graph of `bundle`.

    `bundle` is a `Bundle`, a manifest dict, or a bundle directory.
    """
    manifest = _manifest(bundle)
    dims = model_dims(manifest["model"], manifest["block_size"])
    ranges = symbol_ranges(manifest)
    out = {}
    for graph in portable_graphs(manifest["graphs"]):  # fused flavours are onnxruntime-only
        if graph not in GRAPHS:
            continue  # a graph this version has no I/O table for: nothing to derive
        out[graph] = {
            spec.name: {
                level: resolve_shape(spec, {**dims, **{s: r[i] for s, r in ranges.items()}})
                for i, level in enumerate(("min", "opt", "max"))
            }
            for spec in GRAPHS[graph]["inputs"]
        }
    return out


def _manifest(bundle) -> dict:
    if isinstance(bundle, dict):
        return bundle
    if isinstance(bundle, (str, Path)):
        from .bundle import read_bundle

        bundle = read_bundle(bundle, verify=False)
    return bundle.manifest
