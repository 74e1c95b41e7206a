"""The TensorRT path's settings: optimisation profiles (min / opt / max shape per input, derived
from the I/O table + manifest) and the options of onnxruntime's TensorRT execution provider.

The one TensorRT path (docs/design.md "TensorRT"): onnxruntime's TensorRT provider runs the bundle's
own portable graphs, its engines and timing cache kept in `BUNDLE/.trt-cache`. `tensorrt_options` is
the one place those options are made: the runtime's sessions (session.open_graph) and
`build-engines` (engines/build.py, which opens the runtime's own sessions to fill the cache ahead of
time) both get them from here, so an engine built ahead is the engine the runtime loads.
Pure Python (no tensorrt import).

Ranges of the dynamic symbols (docs/design.md §4):
    T (target tokens)        min 1 (decode), opt B (verify), max max(P, B) (prefill chunk)
    S (cached positions)     min 0 (first prefill chunk), opt max_context // 2, max max_context
    C (new drafter context)  min 1, opt B, max max(P, B) (a prefill chunk or an accepted block)

>>> trt_profiles(read_bundle("bundle/"))["target"]["input_ids"]      # doctest: +SKIP
{'min': (1, 1), 'opt': (1, 16), 'max': (1, 64)}
"""

from __future__ import annotations

from pathlib import Path

from .io_tables import GRAPHS, model_dims, portable_graphs, present, resolve_shape

Shape = tuple[int, ...]
TRT_CACHE = ".trt-cache"  # inside the bundle: TensorRT's engines and timing cache (native code)


def trt_cache_dir(root) -> Path:
    """The TensorRT engine cache of the bundle at `root` (what `build-engines` fills)."""
    return Path(root) / TRT_CACHE


def tensorrt_options(
    device_id: int, fp16: bool, cache_dir: str | None, profile: dict | None
) -> dict:
    """onnxruntime's TensorrtExecutionProvider options for one graph session: fp16 kernels for an
    fp16 graph, the engine and timing caches in `cache_dir`, and `profile`
    (`trt_profiles(...)[graph]`) as the one explicit optimisation profile, so one engine serves
    every step shape and is built when the session is created.

    >>> tensorrt_options(0, True, "b/.trt-cache", {"x": {"min": (1, 1), "opt": (1, 4),
    ...     "max": (1, 8)}})["trt_profile_max_shapes"]
    'x:1x8'
    """
    opts = {"device_id": device_id, "trt_fp16_enable": fp16}
    if cache_dir:
        opts.update(
            trt_engine_cache_enable=True,
            trt_engine_cache_path=cache_dir,
            trt_timing_cache_enable=True,
            trt_timing_cache_path=cache_dir,
        )
    for level in ("min", "opt", "max") if profile else ():
        opts[f"trt_profile_{level}_shapes"] = ",".join(
            f"{name}:{'x'.join(str(d) for d in shapes[level])}" for name, shapes in profile.items()
        )
    return opts


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
            if present(spec, dims)  # a drafter's window inputs only where it has windows
        }
    return out


def _manifest(bundle) -> dict:
    if isinstance(bundle, dict):
        return bundle
    if isinstance(bundle, (str, Path)):
        from .bundle import read_bundle

        bundle = read_bundle(bundle, verify=False)
    return bundle.manifest
