"""Build TensorRT engines for a bundle's graphs and record them in its manifest.

Plans are written to `BUNDLE/engines/<graph>.<precision>.plan` (atomically) and recorded under
`manifest["engines"][graph][precision]`: file (path, bytes, sha256), precision, TensorRT version,
device, the optimisation profile and the build time. A plan only runs on the GPU model and TensorRT
version that built it; the runtime must check both.

>>> build_engines(EngineOptions("bundle/", precision="fp16"))      # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from ..runtime.bundle import file_entry, inside, read_bundle, write_manifest
from ..runtime.errors import DflashEdgeError
from ..runtime.io_tables import portable_graphs
from ..runtime.trt_profiles import trt_profiles
from .readiness import check_trt_readiness, trt_flavour

# precision -> TensorRT builder flags. fp32 graphs: TensorRT picks per layer among the enabled
# types.
PRECISION_FLAGS = {"fp16": ("FP16",), "int8": ("FP16", "INT8"), "fp8": ("FP16", "FP8")}
INSTALL_HINT = (
    "On Jetson, TensorRT ships with JetPack (`sudo apt install nvidia-jetpack`; use the system "
    "python3, which has the `tensorrt` module); on a machine with an NVIDIA GPU and driver, "
    "`pip install 'dflash-edge[tensorrt]'` (PyPI's tensorrt>=10 wheels download from NVIDIA)."
)


@dataclass
class EngineOptions:
    bundle: str | Path
    precision: str = "fp16"  # fp16 | int8 | fp8
    device: str | None = None  # label recorded in the manifest (default: the detected GPU name)
    workspace_gb: float = 4.0  # builder scratch memory limit
    graphs: tuple[str, ...] | None = (
        None  # default: every portable graph of the bundle (TensorRT parses those)
    )


def import_tensorrt():
    """The `tensorrt` module (>= 10), or a DflashEdgeError saying how to install it."""
    try:
        import tensorrt as trt
    except ImportError as err:
        raise DflashEdgeError(
            f"TensorRT is not installed (cannot import `tensorrt`: {err}). {INSTALL_HINT}"
        ) from err
    if int(trt.__version__.split(".")[0]) < 10:
        raise DflashEdgeError(
            f"TensorRT {trt.__version__} is too old: build-engines needs TensorRT >= 10. "
            f"{INSTALL_HINT}"
        )
    return trt


def detect_device_name() -> str:
    """The GPU's marketing name (nvidia-smi), the Jetson board model, or 'unknown-gpu'."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.splitlines()[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    board = Path("/proc/device-tree/model")  # Jetson has no nvidia-smi
    if board.is_file():
        return board.read_text(errors="replace").strip("\x00 \n")
    return "unknown-gpu"


def build_engines(opts: EngineOptions) -> dict:
    """Check, build and record one engine per graph; returns the manifest's updated `engines`
    section."""

    if opts.precision not in PRECISION_FLAGS:
        raise DflashEdgeError(
            f"--precision {opts.precision!r} is not one of {', '.join(PRECISION_FLAGS)}"
        )
    flavour = trt_flavour(Path(opts.bundle))
    if flavour is not None:  # the bundle's TensorRT flavour (export/tensorrt_flavour.py)
        print(f"build-engines: building {flavour}, this bundle's TensorRT flavour", file=sys.stderr)
        opts = replace(opts, bundle=flavour)
    bundle = read_bundle(opts.bundle)
    graphs = _chosen_graphs(bundle, opts.graphs)
    trt = import_tensorrt()
    _warn_precision(opts.precision)
    typed = _strongly_typed(bundle, graphs)
    profiles = trt_profiles(bundle)
    device = opts.device or detect_device_name()
    engines = bundle.manifest.setdefault("engines", {})
    for graph in graphs:
        t0 = time.perf_counter()
        print(
            f"building {graph} ({opts.precision}) with TensorRT {trt.__version__} on {device} ...",
            file=sys.stderr,
        )
        plan = _build_plan(trt, bundle.graph_path(graph), profiles[graph], opts, typed[graph])
        rel = f"engines/{graph}.{opts.precision}.plan"
        _write_atomic(inside(bundle.root, rel, f"engines.{graph} (graph name)"), plan)
        seconds = time.perf_counter() - t0
        engines.setdefault(graph, {})[opts.precision] = {
            "file": file_entry(bundle.root, rel),
            "precision": opts.precision,
            "tensorrt_version": trt.__version__,
            "device": device,
            "profiles": [_jsonable(profiles[graph])],
            "calibrated": False if opts.precision in ("int8", "fp8") else None,
            "strongly_typed": typed[graph],
            "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "build_seconds": round(seconds, 1),
        }
        # after each graph: an interrupted run keeps what is done
        write_manifest(bundle.root, bundle.manifest)
        print(f"built {rel} ({len(plan) / 1e6:.1f} MB) in {seconds:.0f} s", file=sys.stderr)
    return engines


def _chosen_graphs(bundle, wanted: tuple) -> tuple:
    """`wanted` (default: the bundle's portable graphs), each one the bundle has and TensorRT can
    parse; else a DflashEdgeError naming the ones to build."""
    have = bundle.manifest["graphs"]
    graphs = wanted or tuple(portable_graphs(have))
    unknown = sorted(set(graphs) - set(have))
    if unknown:
        raise DflashEdgeError(
            f"graph(s) {unknown} are not in {bundle.root}; it has {', '.join(have)}"
        )
    fused = sorted(set(graphs) - set(portable_graphs(graphs)))
    if fused:
        portable = ", ".join(portable_graphs(have))
        raise DflashEdgeError(
            f"graph(s) {fused} use onnxruntime-only fused ops that TensorRT cannot parse; "
            f"build the portable graphs instead ({portable})"
        )
    return graphs


def _strongly_typed(bundle, graphs) -> dict[str, bool]:
    """graph -> strongly typed (weight-only low-bit: its types are the graph's own), once each
    graph passed the readiness check (a DflashEdgeError with its report otherwise)."""
    typed = {}
    for graph in graphs:
        report = check_trt_readiness(bundle.graph_path(graph), graph)
        typed[graph] = weight_only(report)
        if not report.ok:
            raise DflashEdgeError(
                f"{bundle.graph_path(graph)} is not ready for TensorRT:\n{report}\n"
                f"re-export the bundle with a dflash-edge whose graphs pass this check"
            )
    return typed


def _jsonable(profile: dict) -> dict:
    return {name: {level: list(shape) for level, shape in s.items()} for name, s in profile.items()}


def _warn_precision(precision: str) -> None:
    if precision == "int8":
        warnings.warn(
            "int8 without calibration data: TensorRT runs only layers with known dynamic ranges in "
            "int8 and keeps the rest in fp16; accuracy needs calibration or a QDQ-quantised bundle "
            "(`dflash-edge quantize`)",
            stacklevel=3,
        )
    elif precision == "fp8":
        warnings.warn(
            "fp8 needs a QDQ-quantised bundle (FP8 Q/DQ nodes) and an fp8-capable GPU (Ada, "
            "Hopper, "
            "Blackwell / Jetson Thor; not Jetson Orin); without Q/DQ nodes the engine runs in fp16",
            stacklevel=3,
        )


def weight_only(report) -> bool:
    """Whether a graph holds low-bit weights as DequantizeLinear (readiness report): TensorRT builds
    those as a strongly typed network."""
    return report.ops.get("DequantizeLinear", 0) > 0


def network_flags(trt, strongly_typed: bool) -> int:
    """`create_network` flags: STRONGLY_TYPED for weight-only low-bit graphs (TensorRT's explicit
    quantization: each tensor keeps the graph's type, no precision flags), else none (TensorRT
    10: explicit batch is the only mode)."""
    if not strongly_typed:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def _build_plan(
    trt, onnx_path: Path, shapes: dict, opts: EngineOptions, strongly_typed: bool = False
) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, strongly_typed))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # resolves external data next to the .onnx
        errors = "\n  ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise DflashEdgeError(f"TensorRT's ONNX parser rejected {onnx_path}:\n  {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(opts.workspace_gb * (1 << 30)))
    if not strongly_typed:  # a strongly typed network takes no precision flags or layer precisions
        for flag in PRECISION_FLAGS[opts.precision]:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        _keep_norms_fp32(trt, network, config)
    config.add_optimization_profile(_profile(builder, network, shapes, onnx_path))
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise DflashEdgeError(
            f"TensorRT could not build an engine for {onnx_path} ({opts.precision}); see its log "
            f"above. Try a larger --workspace-gb or another --precision"
        )
    return bytes(memoryview(plan))


def _profile(builder, network, shapes: dict, onnx_path: Path):
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if tensor.name not in shapes:
            raise DflashEdgeError(
                f"{onnx_path} has input {tensor.name!r}, which its I/O table does not declare; "
                f"re-export the bundle"
            )
        s = shapes[tensor.name]
        declared = tuple(tensor.shape)
        if -1 in declared:
            profile.set_shape(tensor.name, s["min"], s["opt"], s["max"])
        elif declared != tuple(s["min"]) or declared != tuple(s["max"]):
            raise DflashEdgeError(
                f"{onnx_path}: input {tensor.name!r} is static {declared} in the graph but the "
                f"manifest implies {s['min']}..{s['max']}; re-export the bundle"
            )
    return profile


def _keep_norms_fp32(trt, network, config) -> None:
    """Keep RMSNorm's variance chain (x**2 -> mean -> + eps -> sqrt -> divide) in fp32.

    In fp16, x**2 overflows once |x| > 256, which LLM hidden states reach. Seeds are Pow and Reduce
    layers; fp32 spreads to layers whose other inputs are build-time constants, and stops at the
    first layer that mixes in a runtime tensor (the divide by the rms), which is pinned too."""
    config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    static, chain = set(), set()
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        ins = [
            layer.get_input(j).name
            for j in range(layer.num_inputs)
            if layer.get_input(j) is not None
        ]
        outs = [layer.get_output(j).name for j in range(layer.num_outputs)]
        if all(n in static for n in ins):
            static.update(outs)
            continue
        seed = layer.type == trt.LayerType.REDUCE or _is_pow(trt, layer)
        from_chain = any(n in chain for n in ins)
        floats = all(
            layer.get_output(j).dtype in (trt.float32, trt.float16)
            for j in range(layer.num_outputs)
        )
        if not floats or not (seed or from_chain):
            continue
        layer.precision = trt.float32
        for j in range(layer.num_outputs):
            layer.set_output_type(j, trt.float32)
        if seed or all(n in chain or n in static for n in ins):
            chain.update(outs)


def _is_pow(trt, layer) -> bool:
    if layer.type != trt.LayerType.ELEMENTWISE:
        return False
    # the Python API's documented downcast (as in Polygraphy)
    layer.__class__ = trt.IElementWiseLayer
    return layer.op == trt.ElementWiseOperation.POW


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
