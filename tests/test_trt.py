"""TensorRT: readiness check, profile derivation, build-engines (a fake `tensorrt` here; the real
one on GPU)."""

import json
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dflash_edge.cli import main as cli_main
from dflash_edge.engines.readiness import bundle_trt_readiness, check_trt_readiness
from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.models import load_target
from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter
from dflash_edge.runtime.bundle import read_bundle, sha256_file
from dflash_edge.runtime.errors import DflashEdgeError
from dflash_edge.runtime.trt_profiles import trt_profiles

FAMILIES, BLOCKS = ("qwen3", "llama"), (4, 8, 16)


@pytest.fixture(scope="module")
def tiny_bundles(tiny_checkpoints, tmp_path_factory):
    """(family, block) -> exported bundle dir (max_context 256, prefill chunk 16; parity is
    test_export's job)."""
    root, out = tmp_path_factory.mktemp("trt_bundles"), {}
    for family in FAMILIES:
        ckpt = tiny_checkpoints[family][1]
        cfg = DraftConfig.for_target(
            load_target(ckpt).config, num_layers=2, block_size=16, mask_token_id=5
        )
        draft = save_drafter(new_drafter(cfg, seed=1), root / f"draft-{family}")
        for block in BLOCKS:
            opts = ExportOptions(
                out=root / f"{family}-{block}",
                target=ckpt,
                draft=str(draft),
                block_size=block,
                max_context=256,
                prefill_chunk=16,
                verify=False,
            )
            out[family, block] = export_bundle(opts, progress=False)
    return out


# --- readiness
# -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block", BLOCKS)
def test_exported_graphs_are_trt_ready(tiny_bundles, family, block):
    summary = bundle_trt_readiness(tiny_bundles[family, block])
    assert summary["ok"], json.dumps(summary, indent=1)
    assert summary["tensorrt_version"] == "10.15" and set(summary["graphs"]) == {
        "target",
        "drafter",
    }
    for graph in summary["graphs"].values():
        assert graph["opset"] == 17 and graph["nodes"] > 50
        assert any(
            "INT64 graph I/O" in n for n in graph["notes"]
        )  # ids are int64: noted, not failed


def _model(nodes, inputs, outputs, opset=17, value_info=(), initializers=()):
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, initializer=list(initializers), value_info=list(value_info)
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, dtype=TensorProto.FLOAT, shape=(2, 3)):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def test_unsupported_and_unknown_ops_are_problems():
    m = _model(
        [helper.make_node("Unique", ["x"], ["u"]), helper.make_node("Relu", ["x"], ["y"])],
        [_vi("x")],
        [_vi("y"), _vi("u", shape=(None,))],
    )
    r = check_trt_readiness(m, "g")
    assert not r.ok and any("Unique" in p and "documented as unsupported" in p for p in r.problems)
    m.graph.node.append(
        helper.make_node("GroupQueryAttention", ["x"], ["z"], domain="com.microsoft")
    )
    r = check_trt_readiness(m)
    assert any("com.microsoft::GroupQueryAttention" in p and "plugin" in p for p in r.problems)


def test_control_flow_is_a_problem():
    def branch(v):
        return helper.make_graph(
            [helper.make_node("Identity", ["x"], [f"o{v}"])], f"b{v}", [], [_vi(f"o{v}")]
        )

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch(1), else_branch=branch(2))
    r = check_trt_readiness(_model([node], [_vi("c", TensorProto.BOOL, ()), _vi("x")], [_vi("y")]))
    assert not r.ok and any(p.startswith("If ") and "control flow" in p for p in r.problems)
    assert r.ops.get("Identity") == 2  # the branches' ops were checked too


@pytest.mark.parametrize("opset,ok", [(7, False), (17, True), (24, True), (25, False)])
def test_opset_range(opset, ok):
    r = check_trt_readiness(
        _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")], opset=opset)
    )
    assert r.ok == ok, r.problems
    if not ok:
        assert any(f"opset {opset} is outside" in p and "9..24" in p for p in r.problems)
    if opset == 24:
        assert any("opset 24 > 20" in n for n in r.notes)


def test_dtype_problems_and_int64_notes():
    mm = helper.make_node("MatMul", ["a", "b"], ["c"])  # MatMul: float types only
    r = check_trt_readiness(
        _model(
            [mm],
            [_vi("a", TensorProto.INT32, (2, 2)), _vi("b", TensorProto.INT32, (2, 2))],
            [_vi("c", TensorProto.INT32, (2, 2))],
        )
    )
    assert any("MatMul" in p and "INT32" in p and "FP32" in p for p in r.problems)
    ts = helper.make_node("TensorScatter", ["p", "u"], ["o"], axis=-2)  # INT32 listed, INT64 not
    i64 = lambda n: _vi(n, TensorProto.INT64, (1, 1, 4, 2))  # noqa: E731
    r = check_trt_readiness(_model([ts], [i64("p"), i64("u")], [i64("o")], opset=24))
    assert r.ok, r.problems
    assert any("TensorScatter" in n and "casts INT64 to INT32" in n for n in r.notes)


def test_computed_reduce_axes_is_a_problem():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceSum", ["x", "s"], ["y"]),
    ]
    r = check_trt_readiness(_model(nodes, [_vi("x")], [_vi("y", shape=())], opset=13))
    assert any("ReduceSum" in p and "`axes` must be an initializer" in p for p in r.problems)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    ok = _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"])],
        [_vi("x")],
        [_vi("y", shape=(2, 1))],
        opset=13,
        initializers=[axes],
    )
    assert check_trt_readiness(ok).ok


def test_readiness_without_manifest_globs_graphs(tiny_bundles, tmp_path):
    src = tiny_bundles["qwen3", 4]
    onnx.save(
        onnx.load(str(src / "drafter.onnx"), load_external_data=False),
        str(tmp_path / "drafter.onnx"),
    )
    assert set(bundle_trt_readiness(tmp_path)["graphs"]) == {"drafter"}


def test_export_prints_one_readiness_line(tiny_bundles, tmp_path):
    from dflash_edge.cli.export import trt_readiness_line

    assert trt_readiness_line(tiny_bundles["qwen3", 4]).endswith(
        f": ok (`dflash-edge build-engines {tiny_bundles['qwen3', 4]}` on a GPU machine)"
    )
    custom = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    model = _model([custom], [_vi("x")], [_vi("y")])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(tmp_path / "drafter.onnx"))
    line = trt_readiness_line(tmp_path)
    assert "\n" not in line and line.startswith(
        "TensorRT 10.15 readiness of drafter: not ready (1 problem(s); the "
        "first, drafter: com.microsoft::FastGelu"
    )


# --- profiles
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
def test_profiles_follow_io_table_and_manifest(tiny_bundles, block):
    bundle = read_bundle(tiny_bundles["qwen3", block])
    p, m = trt_profiles(bundle), bundle.model
    chunk = max(16, block)
    assert p["target"]["input_ids"] == {"min": (1, 1), "opt": (1, block), "max": (1, chunk)}
    kv = (m["num_layers"], m["num_kv_heads"], m["head_dim"])
    assert p["target"]["past_key"] == {"min": (0, *kv), "opt": (128, *kv), "max": (256, *kv)}
    assert p["target"]["start"] == {"min": (1,), "opt": (1,), "max": (1,)}
    assert p["drafter"]["block_ids"] == {"min": (1, block), "opt": (1, block), "max": (1, block)}
    n = len(m["target_layer_ids"]) * m["hidden_size"]
    assert p["drafter"]["ctx_hidden"] == {
        "min": (1, 1, n),
        "opt": (1, block, n),
        "max": (1, chunk, n),
    }
    assert p["drafter"]["past_value"]["max"] == (256, m["draft_num_layers"], *kv[1:])
    assert trt_profiles(bundle.manifest) == trt_profiles(str(bundle.root)) == p


# --- build-engines without TensorRT
# ----------------------------------------------------------------------


def test_cli_without_tensorrt_says_how_to_install(tiny_bundles, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    assert cli_main(["build-engines", str(tiny_bundles["qwen3", 4])]) == 2
    err = capsys.readouterr().err
    assert "TensorRT is not installed" in err and "JetPack" in err and "pip install" in err


def test_cli_rejects_bad_precision(tiny_bundles, capsys):
    with pytest.raises(SystemExit):
        cli_main(["build-engines", str(tiny_bundles["qwen3", 4]), "--precision", "int4"])
    assert "invalid choice" in capsys.readouterr().err


# --- build-engines with a fake tensorrt (the flow, the manifest, fp32 norms)
# -------------------------------


class _T:
    def __init__(self, name, shape=(), dtype="float32"):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype


class _Layer:
    def __init__(self, kind, op, ins, outs):
        self.type, self.op, self._ins, self._outs = kind, op, ins, outs
        self.precision, self.out_types = None, {}
        self.num_inputs, self.num_outputs = len(ins), len(outs)

    def get_input(self, j):
        return self._ins[j]

    def get_output(self, j):
        return self._outs[j]

    def set_output_type(self, j, t):
        self.out_types[j] = t


def _fake_tensorrt(calls, parse_ok=True):
    """Just enough of the TensorRT 10 Python API: the network mirrors the ONNX graph node by
    node."""
    trt = types.SimpleNamespace(__version__="10.99.0", float32="float32", float16="float16")
    trt.LayerType = types.SimpleNamespace(
        REDUCE="REDUCE",
        ELEMENTWISE="ELEMENTWISE",
        CONSTANT="CONSTANT",
        UNARY="UNARY",
        OTHER="OTHER",
    )
    trt.ElementWiseOperation = types.SimpleNamespace(
        POW="POW", SUM="SUM", PROD="PROD", DIV="DIV", SUB="SUB"
    )
    trt.BuilderFlag = types.SimpleNamespace(
        FP16="FP16",
        INT8="INT8",
        FP8="FP8",
        PREFER_PRECISION_CONSTRAINTS="PREFER_PRECISION_CONSTRAINTS",
    )
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.IElementWiseLayer = type("IElementWiseLayer", (_Layer,), {})
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
    elementwise = {"Pow": "POW", "Add": "SUM", "Mul": "PROD", "Div": "DIV", "Sub": "SUB"}

    class Network:
        def __init__(self):
            self.inputs, self.layers = [], []
            self.num_inputs = self.num_layers = 0

        def get_input(self, i):
            return self.inputs[i]

        def get_layer(self, i):
            return self.layers[i]

    class Parser:
        def __init__(self, network, logger):
            self.net, self.num_errors = network, 0 if parse_ok else 1

        def get_error(self, i):
            return "In node 7 (Foo): UNSUPPORTED_NODE"

        def parse_from_file(self, path):
            model = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False))

            def dyn(vi):
                return [
                    d.dim_value if d.HasField("dim_value") else -1
                    for d in vi.type.tensor_type.shape.dim
                ]

            floats = {
                v.name
                for v in list(model.graph.value_info)
                + list(model.graph.output)
                + list(model.graph.input)
                if v.type.tensor_type.elem_type == TensorProto.FLOAT
            }
            tensors = {}

            def get(n):
                return tensors.setdefault(n, _T(n, dtype="float32" if n in floats else "int64"))

            self.net.inputs = [_T(i.name, dyn(i)) for i in model.graph.input]
            tensors.update({t.name: t for t in self.net.inputs})
            for init in model.graph.initializer:
                self.net.layers.append(_Layer("CONSTANT", None, [], [get(init.name)]))
            for node in model.graph.node:
                kind = {"ReduceMean": "REDUCE", "Constant": "CONSTANT", "Sqrt": "UNARY"}.get(
                    node.op_type, "OTHER"
                )
                kind = "ELEMENTWISE" if node.op_type in elementwise else kind
                self.net.layers.append(
                    _Layer(
                        kind,
                        elementwise.get(node.op_type),
                        [get(i) for i in node.input if i],
                        [get(o) for o in node.output],
                    )
                )
            self.net.num_inputs, self.net.num_layers = len(self.net.inputs), len(self.net.layers)
            calls.setdefault("networks", []).append(self.net)
            return parse_ok

    class Config:
        def __init__(self):
            self.flags, self.profiles = [], []
            calls.setdefault("configs", []).append(self)

        def set_memory_pool_limit(self, pool, size):
            self.workspace = size

        def set_flag(self, flag):
            self.flags.append(flag)

        def add_optimization_profile(self, profile):
            self.profiles.append(profile)

    class Profile(dict):
        def set_shape(self, name, lo, opt, hi):
            self[name] = (tuple(lo), tuple(opt), tuple(hi))

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            assert flags == 0
            return Network()

        create_builder_config = staticmethod(Config)
        create_optimization_profile = staticmethod(Profile)

        def build_serialized_network(self, network, config):
            return b"PLAN:" + ",".join(sorted(config.profiles[0])).encode()

    trt.Builder, trt.OnnxParser = Builder, Parser
    return trt


@pytest.mark.parametrize(
    "precision,flags", [("fp16", ["FP16"]), ("int8", ["FP16", "INT8"]), ("fp8", ["FP16", "FP8"])]
)
def test_build_engines_with_fake_tensorrt(tiny_bundles, tmp_path, monkeypatch, precision, flags):
    import shutil

    from dflash_edge.engines.build import EngineOptions, build_engines

    bundle_dir = shutil.copytree(tiny_bundles["qwen3", 8], tmp_path / "b")
    calls = {}
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(calls))
    if precision == "fp16":
        build_engines(EngineOptions(bundle_dir, precision=precision, device="test-gpu"))
    else:
        with pytest.warns(UserWarning, match="QDQ-quantised bundle"):
            build_engines(EngineOptions(bundle_dir, precision=precision, device="test-gpu"))
    bundle = read_bundle(bundle_dir)  # manifest still valid, graphs intact
    profiles = trt_profiles(bundle)
    for graph in ("target", "drafter"):
        entry = bundle.manifest["engines"][graph][precision]
        plan = bundle_dir / entry["file"]["path"]
        assert entry["file"]["path"] == f"engines/{graph}.{precision}.plan" and plan.is_file()
        assert sha256_file(plan) == entry["file"]["sha256"]
        assert entry["tensorrt_version"] == "10.99.0" and entry["device"] == "test-gpu"
        assert entry["profiles"] == [
            {n: {k: list(v) for k, v in s.items()} for n, s in profiles[graph].items()}
        ]
    assert not list((bundle_dir / "engines").glob(".*"))  # no temp files left
    target_cfg = calls["configs"][0]
    assert target_cfg.flags == flags + ["PREFER_PRECISION_CONSTRAINTS"]
    dyn = target_cfg.profiles[0]  # only dynamic inputs get a range
    assert set(dyn) == {"input_ids", "past_key", "past_value"} and dyn["input_ids"] == (
        (1, 1),
        (1, 8),
        (1, 16),
    )


def test_norm_chains_stay_fp32(tiny_bundles, tmp_path, monkeypatch):
    import shutil

    from dflash_edge.engines.build import EngineOptions, build_engines

    bundle_dir = shutil.copytree(tiny_bundles["qwen3", 4], tmp_path / "b")
    calls = {}
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(calls))
    build_engines(EngineOptions(bundle_dir, graphs=("target",), device="x"))
    layers = calls["networks"][0].layers
    pinned = [layer for layer in layers if layer.precision == "float32"]
    n_norms = sum(1 for layer in layers if layer.type == "REDUCE")
    assert n_norms == 25  # 6 layers x (2 + q/k norms) + final norm
    # pow, mean, +eps, sqrt, 1/x, and the x * rsqrt that ends each chain
    assert len(pinned) == 6 * n_norms and all(layer.out_types == {0: "float32"} for layer in pinned)
    assert all(layer.precision is None for layer in layers if layer.type == "OTHER")


def test_build_engines_reports_parser_errors(tiny_bundles, monkeypatch):
    from dflash_edge.engines.build import EngineOptions, build_engines

    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt({}, parse_ok=False))
    with pytest.raises(
        DflashEdgeError, match=r"parser rejected .*target.onnx:\n  In node 7 \(Foo\)"
    ):
        build_engines(EngineOptions(tiny_bundles["qwen3", 4], device="x"))
    with pytest.raises(DflashEdgeError, match=r"graph\(s\) \['nope'\] are not in"):
        build_engines(EngineOptions(tiny_bundles["qwen3", 4], graphs=("nope",)))


# --- the real thing (tier 3: a GPU with TensorRT)
# ------------------------------------------------------------


def _run_plan(trt, torch, path, feeds: dict) -> dict:
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(path.read_bytes())
    ctx, keep, outs = engine.create_execution_context(), [], {}
    for name, arr in feeds.items():
        t = torch.from_numpy(np.ascontiguousarray(arr)).cuda()
        keep.append(t)
        ctx.set_input_shape(name, arr.shape)
        ctx.set_tensor_address(name, t.data_ptr())
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            outs[name] = torch.empty(
                tuple(ctx.get_tensor_shape(name)), dtype=getattr(torch, dtype.name), device="cuda"
            )
            ctx.set_tensor_address(name, outs[name].data_ptr())
    stream = torch.cuda.current_stream()
    assert ctx.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    return {k: v.cpu().numpy() for k, v in outs.items()}


@pytest.mark.gpu
def test_real_engines_match_onnxruntime(tiny_bundles, tmp_path):
    trt = pytest.importorskip("tensorrt")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT is installed but no CUDA device is visible")
    import shutil

    import onnxruntime as ort

    from dflash_edge.engines.build import EngineOptions, build_engines
    from dflash_edge.runtime.io_tables import GRAPHS, dummy_inputs, model_dims

    bundle_dir = shutil.copytree(tiny_bundles["qwen3", 8], tmp_path / "b")
    build_engines(EngineOptions(bundle_dir, precision="fp16", workspace_gb=1))
    bundle = read_bundle(bundle_dir)
    dims = {**model_dims(bundle.model, 8), "T": 8, "S": 5, "C": 3}
    for graph in ("target", "drafter"):
        feeds = dummy_inputs(graph, dims)
        ref = dict(
            zip(
                [o.name for o in GRAPHS[graph]["outputs"]],
                ort.InferenceSession(str(bundle.graph_path(graph))).run(None, feeds),
            )
        )
        got = _run_plan(trt, torch, bundle_dir / f"engines/{graph}.fp16.plan", feeds)
        for name, want in ref.items():
            assert got[name].shape == want.shape, (graph, name)
            if want.dtype.kind == "f":
                np.testing.assert_allclose(
                    got[name], want, atol=5e-2, rtol=5e-2, err_msg=f"{graph}.{name}"
                )
            else:
                assert (got[name] == want).mean() >= 0.8, (graph, name)
