"""`build-engines`: fill a bundle's TensorRT engine cache ahead of time.

The one TensorRT path (docs/design.md "TensorRT") is onnxruntime's TensorRT execution provider on
the bundle's own graphs. It builds an engine per graph when a session is created (minutes on a
Jetson) and keeps it in `BUNDLE/.trt-cache` (runtime/trt_profiles.TRT_CACHE). This command opens
exactly the sessions the runtime opens (`Generator.load(bundle, provider="tensorrt")`: the same
graphs, session options, optimisation profiles and cache folder, from trt_profiles.tensorrt_options)
and runs one short plain and one speculative generation through them, so the first real load finds
its engines built. The manifest is not written: the runtime finds the cache by its fixed name.

>>> build_engines("bundle/")["files"]                          # doctest: +SKIP
['TensorrtExecutionProvider_TRTKernel_graph_main_graph_..._sm87.engine', ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..runtime import session
from ..runtime.bundle import read_bundle
from ..runtime.errors import DflashEdgeError
from ..runtime.trt_profiles import trt_cache_dir

TRT_EP = session.PROVIDERS["tensorrt"][0][0]  # TensorrtExecutionProvider
INSTALL_HINT = (
    "On a Jetson: JetPack's TensorRT (`sudo apt install nvidia-jetpack`) and NVIDIA's "
    "onnxruntime-gpu wheel for that JetPack from the Jetson AI Lab index (JetPack 6: `pip install "
    "onnxruntime-gpu --index-url https://pypi.jetson-ai-lab.io/jp6/cu126`; PyPI's "
    "onnxruntime-gpu has no aarch64 wheel). On x86 with an NVIDIA GPU: `pip uninstall "
    "onnxruntime; pip install onnxruntime-gpu tensorrt` (TensorRT 10, matching onnxruntime-gpu's "
    "CUDA)."
)
WARM_TOKENS = 8  # per warm-up generation: enough to run prefill, decode and verify shapes


class TensorRTMissingError(DflashEdgeError):
    """onnxruntime's TensorRT execution provider is not in this install (or cannot start)."""


def require_tensorrt_provider() -> None:
    """A TensorRTMissingError naming what to install, unless onnxruntime lists the provider."""
    import onnxruntime as ort

    if "tensorrt" not in session.available_providers():
        raise TensorRTMissingError(
            f"build-engines needs onnxruntime's {TRT_EP}, which this onnxruntime "
            f"({ort.__version__}: {', '.join(ort.get_available_providers())}) lacks. "
            f"{INSTALL_HINT}"
        )


def build_engines(bundle: str | Path, prompt_ids: tuple[int, ...] = (1, 2, 3, 4)) -> dict:
    """Build the TensorRT engines the runtime loads for `bundle` into its cache folder; returns
    {"cache", "files", "bytes", "load_seconds", "warm_seconds"}. Refuses, writing nothing, where the
    bundle does not read or onnxruntime has no TensorRT provider."""
    b = read_bundle(bundle)  # every sha256: an engine of a damaged graph is worth nothing
    require_tensorrt_provider()
    from ..runtime import Generator

    cache = trt_cache_dir(b.root)
    print(f"build-engines: building {b.root}'s TensorRT engines into {cache} ...", file=sys.stderr)
    t0 = time.perf_counter()
    gen = Generator.load(b, provider="tensorrt", use_tuned=False)
    loaded = time.perf_counter()
    check_engines_run(gen)
    for draft in ("none", "drafter"):  # every step shape the loop uses, both graphs
        gen.generate_ids(list(prompt_ids), WARM_TOKENS, draft=draft)
    files = sorted(p for p in cache.rglob("*") if p.is_file()) if cache.is_dir() else []
    if not files:
        raise DflashEdgeError(
            f"onnxruntime's TensorRT provider wrote no engine into {cache}; run with "
            f"ORT_LOG_SEVERITY_LEVEL=0 or check that TensorRT's libraries load (libnvinfer)"
        )
    return {
        "cache": str(cache),
        "files": [str(p.relative_to(cache)) for p in files],
        "bytes": sum(p.stat().st_size for p in files),
        "load_seconds": round(loaded - t0, 1),
        "warm_seconds": round(time.perf_counter() - loaded, 1),
    }


def check_engines_run(gen) -> None:
    """TensorRTMissingError where a session fell back from TensorRT (onnxruntime drops a
    provider that fails to start, e.g. without TensorRT's libraries, and carries on)."""
    runners = {"target": gen.target.runner, "drafter": gen.drafter.runner}
    fell = [n for n, r in runners.items() if TRT_EP not in r.session.get_providers()]
    if fell:
        raise TensorRTMissingError(
            f"onnxruntime could not start {TRT_EP} for {', '.join(fell)} (TensorRT's libraries "
            f"missing or of another version?). {INSTALL_HINT}"
        )
