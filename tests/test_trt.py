"""The one TensorRT path (docs/design.md "TensorRT"): onnxruntime's TensorRT execution provider on
the bundle's own graphs, and `build-engines`, which opens the runtime's sessions to fill its engine
cache.

Here (no GPU, CPU onnxruntime) the provider options are checked as data, the TensorRT sessions'
options run on the CPU provider standing in (TensorrtExecutionProvider listed, its options recorded,
the session created on CPUExecutionProvider), and build-engines' refusals are checked to write
nothing. What only a GPU can show is scripts/gpu/trt_check.sh."""

import hashlib
import shutil

import onnx
import onnxruntime as ort
import pytest

from dflash_edge.cli import main as cli_main
from dflash_edge.runtime import Generator
from dflash_edge.runtime import session as session_mod
from dflash_edge.runtime.bundle import Bundle, read_bundle
from dflash_edge.runtime.loading import GraphSessions, LoadOptions
from dflash_edge.runtime.session import provider_list

TRT = "TensorrtExecutionProvider"
PROMPT = [3, 9, 14, 7, 21, 5, 30, 11, 2, 17]


@pytest.fixture(scope="module")
def bundle_dir(tiny_bundle):
    return tiny_bundle("qwen3", 8).path


@pytest.fixture(scope="module")
def cpu_tokens(bundle_dir):
    """A normal CPU run's greedy tokens on the portable target (real onnxruntime sessions)."""
    gen = Generator.load(bundle_dir, target_graph="target", use_tuned=False)
    return gen.generate_ids(PROMPT, 24, draft="none").token_ids


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path):
    return _copy(bundle_dir, tmp_path / "bundle")


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _snapshot(root):
    """Every file under `root` -> its sha256 (what a refused build must leave as it was)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _shapes(option: str) -> dict:
    """'a:1x8,b:1x2x0' -> {'a': (1, 8), 'b': (1, 2, 0)}."""
    out = {}
    for item in option.split(","):
        name, dims = item.rsplit(":", 1)
        out[name] = tuple(int(d) for d in dims.split("x"))
    return out


def _declared(path):
    """The graph file's own inputs: name -> dims (an int, or the symbol's name)."""
    model = onnx.load(str(path), load_external_data=False)
    return {
        i.name: tuple(
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in i.type.tensor_type.shape.dim
        )
        for i in model.graph.input
    }


def test_provider_options_follow_the_graphs_and_stay_in_the_bundle(bundle_dir):
    """For each graph the runtime opens on TensorRT: TensorRT first (CUDA, CPU behind it), engine
    and timing cache in BUNDLE/.trt-cache, fp16 kernels exactly for an fp16 graph, and one profile
    that names every input of the graph file, equal to the file's static dims and spanning its
    symbols' ranges (T: decode 1 .. a prefill chunk, S: 0 .. max context)."""
    b = read_bundle(bundle_dir)
    sessions = GraphSessions(b, LoadOptions(provider="tensorrt", share_weights=False))
    m = b.manifest
    block, chunk, ctx = m["block_size"], m["prefill_chunk"], m["max_context"]
    # decode .. a prefill chunk; no cache .. a full one; one .. a chunk of new drafter context
    ranges = {"T": (1, max(block, chunk)), "S": (0, ctx), "C": (1, max(block, chunk))}
    assert set(sessions.profiles) == {"target", "drafter"}  # the fused one is onnxruntime's
    for graph in ("target", "drafter"):
        providers = provider_list(sessions.config_for(graph), sessions.profiles[graph])
        assert [ep for ep, _ in providers] == [TRT, "CUDAExecutionProvider", "CPUExecutionProvider"]
        opts = providers[0][1]
        cache = str(bundle_dir / ".trt-cache")
        assert opts["trt_engine_cache_enable"] and opts["trt_timing_cache_enable"]
        assert opts["trt_engine_cache_path"] == opts["trt_timing_cache_path"] == cache
        assert opts["trt_fp16_enable"] is False  # the tiny bundle is fp32
        levels = {lv: _shapes(opts[f"trt_profile_{lv}_shapes"]) for lv in ("min", "opt", "max")}
        declared = _declared(b.graph_path(graph))
        assert set(levels["min"]) == set(declared), graph
        for name, dims in declared.items():
            for i, d in enumerate(dims):
                lo, opt, hi = (levels[lv][name][i] for lv in ("min", "opt", "max"))
                if isinstance(d, int):
                    assert lo == opt == hi == d, (graph, name, i)
                else:
                    assert lo <= opt <= hi, (graph, name, d)
                    assert (lo, hi) == ranges[d], (graph, name, d)
        if graph == "target":
            ids = [levels[lv]["input_ids"] for lv in ("min", "opt", "max")]
            assert ids == [(1, 1), (1, block), (1, max(block, chunk))]
    fp16 = {**m, "graphs": {g: {**e, "precision": "fp16"} for g, e in m["graphs"].items()}}
    half = GraphSessions(
        Bundle(b.root, fp16), LoadOptions(provider="tensorrt", share_weights=False)
    )
    assert provider_list(half.config_for("target"))[0][1]["trt_fp16_enable"] is True


@pytest.fixture
def cpu_stands_in(monkeypatch):
    """onnxruntime 'has' TensorRT: the runtime builds its TensorRT sessions as on a GPU (options
    recorded per session), and each is created on the CPU provider with the same SessionOptions;
    `engines`: files a TensorRT build would write into the cache path (none: a fallback)."""
    made, real = [], ort.InferenceSession
    state = {"engines": ("graph_sm87.engine",), "active": True}

    def session(path, opts, providers):
        made.append((path, opts, providers))
        trt = dict(providers[0][1]) if providers[0][0] == TRT else {}
        if trt.get("trt_engine_cache_enable"):
            from pathlib import Path

            cache = Path(trt["trt_engine_cache_path"])
            cache.mkdir(exist_ok=True)
            for name in state["engines"]:
                (cache / f"{Path(path).stem}_{name}").write_bytes(b"plan")
        s = real(path, opts, providers=["CPUExecutionProvider"])
        have = [TRT, *s.get_providers()] if state["active"] else s.get_providers()
        s.get_providers = lambda: have
        return s

    eps = session_mod.PROVIDERS["tensorrt"][0]
    monkeypatch.setitem(session_mod.PROVIDERS, "tensorrt", (eps, "cpu"))
    monkeypatch.setattr(session_mod, "available_providers", lambda: ["cpu", "tensorrt"])
    monkeypatch.setattr(ort, "InferenceSession", session)
    return made, state


def test_the_tensorrt_sessions_options_decode_like_a_cpu_run(
    bundle_dir, cpu_tokens, cpu_stands_in, tmp_path
):
    """The sessions `provider="tensorrt"` creates (their SessionOptions and graphs, on the CPU
    provider) give the tokens a plain CPU run of the portable target gives, plain and drafted;
    both sessions got the TensorRT options `provider_list` makes."""
    made, _ = cpu_stands_in
    bundle = _copy(bundle_dir, tmp_path / "b")
    gen = Generator.load(bundle, provider="tensorrt", use_tuned=False)
    assert gen.target_graph == "target"
    assert [p.rsplit("/", 1)[1] for p, _, _ in made] == ["target.onnx", "drafter.onnx"]
    sessions = GraphSessions(read_bundle(bundle), LoadOptions(provider="tensorrt"))
    for (path, _, providers), graph in zip(made, ("target", "drafter")):
        assert providers == provider_list(sessions.config_for(graph), sessions.profiles[graph])
    plain = gen.generate_ids(PROMPT, 24, draft="none").token_ids
    drafted = gen.generate_ids(PROMPT, 24, draft="drafter").token_ids
    assert plain == drafted == cpu_tokens and len(plain) == 24


def test_build_engines_without_tensorrt_names_what_to_install(bundle_copy, capsys):
    """CPU onnxruntime: exit 2, one message naming the Jetson and x86 installs; nothing written."""
    before = _snapshot(bundle_copy)
    assert cli_main(["build-engines", str(bundle_copy)]) == 2
    err = capsys.readouterr().err
    for what in (
        "TensorrtExecutionProvider",
        "JetPack",
        "pypi.jetson-ai-lab.io",
        "aarch64",
        "pip install onnxruntime-gpu tensorrt",
    ):
        assert what in err, (what, err)
    assert _snapshot(bundle_copy) == before and not (bundle_copy / ".trt-cache").exists()


def test_build_engines_opens_the_runtime_sessions_and_writes_only_the_cache(
    bundle_copy, cpu_stands_in, capsys
):
    """build-engines creates exactly the runtime's two TensorRT sessions (same options), runs
    them, prints the cache folder and leaves every bundle file as it was: the manifest records
    nothing (the runtime finds the cache by name)."""
    made, _ = cpu_stands_in
    before = _snapshot(bundle_copy)
    assert cli_main(["build-engines", str(bundle_copy)]) == 0
    cache = bundle_copy / ".trt-cache"
    assert capsys.readouterr().out.strip() == str(cache)
    after = _snapshot(bundle_copy)
    assert {k: v for k, v in after.items() if not k.startswith(".trt-cache/")} == before
    assert sorted(p.name for p in cache.iterdir()) == [
        "drafter_graph_sm87.engine",
        "target_graph_sm87.engine",
    ]
    gen_made = made[:]
    made.clear()
    Generator.load(bundle_copy, provider="tensorrt", use_tuned=False)
    assert [p[2] for p in made] == [p[2] for p in gen_made]  # what the runtime opens


def test_a_failed_build_leaves_the_manifest_alone(bundle_copy, cpu_stands_in, capsys):
    """onnxruntime drops a TensorRT provider that cannot start (no libnvinfer) and carries on; a
    build that fell back, or wrote no engine, fails naming the fix; the manifest is unchanged."""
    _, state = cpu_stands_in
    manifest = (bundle_copy / "manifest.json").read_bytes()
    state["active"] = False
    assert cli_main(["build-engines", str(bundle_copy)]) == 2
    assert (
        "could not start TensorrtExecutionProvider for target, drafter" in capsys.readouterr().err
    )
    state.update(active=True, engines=())
    shutil.rmtree(bundle_copy / ".trt-cache")
    assert cli_main(["build-engines", str(bundle_copy)]) == 2
    assert "wrote no engine" in capsys.readouterr().err
    assert (bundle_copy / "manifest.json").read_bytes() == manifest
