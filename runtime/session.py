"""The execution-provider seam: the one place that turns a bundle graph into something the loop can
run.

The loop only needs a *graph runner*: an object with `device` ("cpu" | "cuda": where its KV buffers
live), `binding()` (a fresh IOBinding-like object: `bind_input/bind_output(name, device, device_id,
dtype, shape, ptr)`) and `run(binding)`. `OrtGraph` is that runner for onnxruntime's CPU, CUDA and
TensorRT execution providers (TensorRT runs through onnxruntime's provider only: docs/design.md
"TensorRT"; its options come from trt_profiles.tensorrt_options).

>>> graph = open_graph("bundle/target.onnx", "cpu")          # doctest: +SKIP
>>> b = graph.binding(); ...; graph.run(b)                  # doctest: +SKIP
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass

from .bundle import inside
from .errors import DflashEdgeError
from .trt_profiles import tensorrt_options

# our provider name -> (onnxruntime execution providers, most preferred first; device the buffers
# live on)
PROVIDERS: dict[str, tuple[tuple[str, ...], str]] = {
    "cpu": (("CPUExecutionProvider",), "cpu"),
    "cuda": (("CUDAExecutionProvider", "CPUExecutionProvider"), "cuda"),
    "tensorrt": (
        ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
        "cuda",
    ),
}


class ProviderUnavailableError(DflashEdgeError):
    """The requested execution provider is unknown or not in this onnxruntime build."""


@dataclass(frozen=True)
class SessionConfig:
    """How sessions are built. threads 0 = one intra-op thread per CPU this process may use."""

    provider: str = "cpu"
    threads: int = 0
    device_id: int = 0
    trt_cache_dir: str | None = None  # TensorRT engine + timing cache (trt_profiles.TRT_CACHE)
    spin: bool = True  # busy-wait between ops within a run: lower latency on idle cores
    fp16: bool = False  # the graph is fp16 (manifest precision): TensorRT builds fp16 kernels
    # DequantizeLinear low-bit weights (export/dq_format.py): the accuracy level of the MatMulNBits
    # onnxruntime fuses them into (the manifest's; None: onnxruntime's default, 4)
    accuracy_level: int | None = None


QDQ_ACCURACY = "session.qdq_matmulnbits_accuracy_level"
# The oldest onnxruntime that runs a graph (measured on the default bundle, docs/BENCHMARKS.md):
# opset 21 (blocked DequantizeLinear, int4) needs IR 10, read from 1.19, which also fuses int4
# DequantizeLinear + MatMul into MatMulNBits (1.32 int8 too); opset 23 (the fused target) needs IR
# 11, read from 1.23; GroupQueryAttention over an int8 cache (its scale inputs) runs from 1.30.
ORT_FOR_OPSET = {21: (1, 19), 23: (1, 23)}
ORT_FOR_INT8_CACHE = (1, 30)


def oldest_onnxruntime(entry: dict) -> tuple[tuple[int, int], str]:
    """(the oldest onnxruntime (major, minor) that runs a manifest graph entry, what needs it)."""
    need, why = (1, 17), "the bundle format"
    for opset, version in ORT_FOR_OPSET.items():
        if entry.get("opset", 0) >= opset and version > need:
            need, why = version, f"its opset-{entry['opset']} graphs"
    if (entry.get("kv_cache") or {}).get("dtype") == "int8" and ORT_FOR_INT8_CACHE > need:
        need, why = ORT_FOR_INT8_CACHE, "its int8 KV cache (GroupQueryAttention with scales)"
    return need, why


def low_bit_settings(entry: dict) -> int | None:
    """The accuracy level a manifest graph entry's DequantizeLinear weights run at (None: not
    such a graph); refuses, naming the fix, an onnxruntime too old for the graph."""
    import onnxruntime as ort

    have = tuple(int(p) for p in ort.__version__.split(".")[:2] if p.isdigit())
    need, why = oldest_onnxruntime(entry)
    if have < need:
        raise DflashEdgeError(
            f"this bundle needs onnxruntime >= {need[0]}.{need[1]} for {why}; onnxruntime "
            f"{ort.__version__} is installed: pip install -U 'onnxruntime>={need[0]}.{need[1]}' "
            f"(1.32 tested)"
            + (", or re-export with --low-bit-ops contrib" if need == ORT_FOR_OPSET[21] else "")
            + (", or re-export with --kv-cache fp32" if need == ORT_FOR_INT8_CACHE else "")
        )
    settings = _settings(entry)
    standard = settings.get("low_bit_ops") in ("standard", "tensorrt")
    return settings.get("accuracy_level") if standard else None


def _settings(entry: dict) -> dict:
    """A manifest graph entry's weight-format settings (export/weight_format.py), {} if none."""
    return (entry.get("quantization") or {}).get("settings") or {}


class NotRowExactWarning(UserWarning):
    """The target's kernels may give a token different bits in a verify than in a decode."""


def warn_not_row_exact(entry: dict, provider: str) -> None:
    """TensorRT's int4 blocks (64 / 128) on onnxruntime's CPU: its int4 kernels give a row the same
    bits whatever the step's length only for blocks of 16 / 32 (docs/BENCHMARKS.md), so drafting
    can change a near-tie token of plain decoding. Said once at load, not refused (it runs)."""
    settings = _settings(entry)
    if (
        provider == "cpu"
        and entry.get("precision") == "int4"
        and settings.get("low_bit_ops") == "tensorrt"
    ):
        import warnings

        warnings.warn(
            "this bundle's int4 weights are in TensorRT's blocks of 64/128, whose onnxruntime CPU "
            "kernels are not row-exact: drafting may change a token of plain decoding; on a CPU "
            "use a bundle exported without --low-bit-ops tensorrt",
            NotRowExactWarning,
            stacklevel=3,
        )


def available_providers() -> list[str]:
    """Our provider names whose onnxruntime execution provider is present in this install."""
    import onnxruntime as ort

    present = set(ort.get_available_providers())
    return [name for name, (eps, _) in PROVIDERS.items() if eps[0] in present]


def check_provider(provider: str) -> None:
    if provider not in PROVIDERS:
        raise ProviderUnavailableError(
            f"unknown provider {provider!r}; choose one of {', '.join(PROVIDERS)} "
            f"(available here: {', '.join(available_providers())})"
        )
    if provider not in available_providers():
        hint = {
            "cuda": "pip install onnxruntime-gpu (and a matching CUDA runtime)",
            "tensorrt": "pip install onnxruntime-gpu and TensorRT",
        }.get(provider, "")
        raise ProviderUnavailableError(
            f"provider {provider!r} is not available in this onnxruntime build; "
            f"available: {', '.join(available_providers())}. To use it: {hint}"
        )


def default_threads() -> int:
    """One intra-op thread per CPU we may run on (affinity-aware: containers often limit it)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # macOS, Windows
        return max(os.cpu_count() or 1, 1)


class OrtGraph:
    """One bundle graph in an onnxruntime session, run through IOBinding; times its own run
    calls."""

    def __init__(self, session, device: str, device_id: int = 0, initializers: dict | None = None):
        self.session = session
        self.device = device
        self.device_id = device_id
        # user-owned weights given to the session must outlive it
        self.initializers = dict(initializers or {})
        self.run_s = 0.0  # wall time spent inside run_with_iobinding (overhead accounting)
        self.calls = 0

    def binding(self):
        return self.session.io_binding()

    def run(self, binding) -> None:
        t = time.perf_counter()
        self.session.run_with_iobinding(binding)
        self.run_s += time.perf_counter() - t
        self.calls += 1


def open_graph(
    path,
    config: SessionConfig = SessionConfig(),
    profile: dict | None = None,
    initializers: dict | None = None,
) -> OrtGraph:
    """An onnxruntime session for `path` on `config.provider` (graph optimisations ALL, sized thread
    pool).

    `profile` (input name -> {"min","opt","max"} shapes, from `trt_profiles`) becomes the TensorRT
    EP's optimisation profile, so one engine serves every step shape. `initializers` (name ->
    OrtValue, from `shared_initializers`) replace the graph's own copies of those weights."""
    import onnxruntime as ort

    check_provider(config.provider)
    device = PROVIDERS[config.provider][1]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = config.threads or default_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # spin: the intra-op threads busy-wait between the ops of one run (onnxruntime's default), and
    # stop when
    # the run returns, so the target's idle threads never compete with the drafter's run or other
    # work
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if config.spin else "0")
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    if config.accuracy_level is not None:
        opts.add_session_config_entry(QDQ_ACCURACY, str(config.accuracy_level))
    for name, value in (initializers or {}).items():
        opts.add_initializer(name, value)
    session = ort.InferenceSession(str(path), opts, providers=provider_list(config, profile))
    return OrtGraph(session, device, config.device_id, initializers)


def shared_initializers(
    root, manifest: dict, config: SessionConfig = SessionConfig(), maps: list | None = None
) -> dict[str, dict]:
    """graph -> {initializer name: OrtValue}: each weight the manifest lists under
    `shared_weights.tensors` (the embedding / LM head the drafter borrows from the target), read
    once and given to every session.

    On the CPU the value is a read-only memory map of the bundle file (file-backed pages, loaded
    once; the maps are appended to `maps` for `release_pages`); on CUDA/TensorRT it is copied to the
    device once. Bundles without the list share nothing."""

    import numpy as np
    import onnxruntime as ort

    check_provider(config.provider)
    device = PROVIDERS[config.provider][1]
    out: dict[str, dict] = {}
    files: dict[str, mmap.mmap] = {}
    for i, entry in enumerate((manifest.get("shared_weights") or {}).get("tensors", [])):
        if entry["file"] not in files:
            with open(inside(root, entry["file"], f"shared_weights.tensors[{i}].file"), "rb") as f:
                files[entry["file"]] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        shape = tuple(entry["shape"])
        array = np.frombuffer(
            files[entry["file"]], entry["dtype"], int(np.prod(shape)), entry["offset"]
        ).reshape(shape)
        # cpu: wraps, keeps `array`
        value = ort.OrtValue.ortvalue_from_numpy(array, device, config.device_id)
        for graph, name in entry["names"].items():
            out.setdefault(graph, {})[name] = value
    if maps is not None:
        maps.extend(files.values())
    return out


def release_pages(maps: list) -> None:
    """Drop the resident pages of the shared tables' maps after a session is built: building
    prepacks the LM head into the session's own layout (the mapped original is not read again) and
    touches the whole embedding table; from here on only the embedding rows a Gather reads come back
    (from the page cache). Linux only."""

    for m in maps:
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            m.madvise(mmap.MADV_DONTNEED)


def provider_list(config: SessionConfig, profile: dict | None = None) -> list[tuple[str, dict]]:
    """The (execution provider, options) list a session on `config.provider` is created with,
    most preferred first (`profile`: the graph's TensorRT optimisation profile)."""
    return [(ep, _provider_options(ep, config, profile)) for ep in PROVIDERS[config.provider][0]]


def _provider_options(ep: str, config: SessionConfig, profile: dict | None) -> dict:
    if ep == "CUDAExecutionProvider":
        return {"device_id": config.device_id}
    if ep == "TensorrtExecutionProvider":
        return tensorrt_options(config.device_id, config.fp16, config.trt_cache_dir, profile)
    return {}
