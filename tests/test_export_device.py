"""`export --device` on a GPU / Jetson profile (issue 47): the fastest precision that fits, no fp32
graph and no fp32 KV cache, a drafter at 16 bits or less (int8 where fp16 overflows), and a bundle
that still decodes losslessly on onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_edge.cli import main
from dflash_edge.runtime.bundle import read_bundle

from fixtures_bundle import export_args, export_tiny

ORIN = "jetson-orin-nx-16gb"
PROMPT = [5, 6, 7, 8, 9]


def float32_matrices(path) -> list[str]:
    """Names of the float32 initializers of graph `path` that a MatMul multiplies by or a Gather
    looks rows up in: weights, as opposed to norms, scales and the RoPE tables (rope.*, gathered
    by position)."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    fp32 = {
        i.name
        for i in g.initializer
        if i.data_type == onnx.TensorProto.FLOAT and not i.name.startswith("rope.")
    }
    slots = {"MatMul": (0, 1), "Gemm": (0, 1), "Gather": (0,)}
    return sorted(
        {n.input[k] for n in g.node for k in slots.get(n.op_type, ()) if n.input[k] in fp32}
    )


def cache_dtypes(path) -> set[int]:
    """The element types of graph `path`'s KV cache inputs and outputs."""
    import onnx

    from dflash_edge.export.kv16 import cache_names, is_cache

    model = onnx.load(str(path), load_external_data=False)
    graph = path.stem
    names = cache_names(graph)
    io = (*model.graph.input, *model.graph.output)
    return {v.type.tensor_type.elem_type for v in io if is_cache(v.name, names)}


def assert_no_fp32(out) -> dict:
    """No graph of bundle `out` is fp32, stores fp32 weight matrices or keeps an fp32 cache."""
    import onnx

    m = read_bundle(out).manifest
    assert m["kv_cache"]["dtype"] == "float16"
    for name, entry in m["graphs"].items():
        path = out / entry["files"][0]["path"]
        assert entry["precision"] != "fp32", name
        assert float32_matrices(path) == [], name
        assert onnx.TensorProto.FLOAT not in cache_dtypes(path), name
    return m


@pytest.fixture(scope="module")
def orin_bundle(tiny_checkpoints, tmp_path_factory):
    """A tiny qwen3 target (random drafter) exported with --device jetson-orin-nx-16gb, and the
    export's stderr."""
    out = tmp_path_factory.mktemp("orin") / "bundle"
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(export_args(out, tiny_checkpoints["qwen3"][1], "random", "--device", ORIN)) == 0
    return out, err.getvalue()


def test_orin_export_writes_no_fp32_graph_or_cache(orin_bundle):
    out, _ = orin_bundle
    m = assert_no_fp32(out)
    graphs = m["graphs"]
    assert {n: g["precision"] for n, g in graphs.items()} == {
        "target": "int4",
        "target_fused": "int4",
        "drafter": "fp16",
    }
    assert graphs["target_fused"]["kv_cache"]["dtype"] == "int8"  # calibrated, its own
    for name in ("target", "drafter"):
        kv = [s["dtype"] for s in graphs[name]["io"]["inputs"] if s["name"] == "past_key"]
        assert kv == ["float16"], name


def test_orin_plan_prints_each_candidate_and_why(orin_bundle):
    _, err = orin_bundle
    assert f"export --device {ORIN}: candidates at context 256" in err
    lines = {ln.split()[0]: ln for ln in err.splitlines() if "tok/s DFlash" in ln}
    assert set(lines) == {"fp32", "fp16", "int8", "int4"}
    assert all(" GB" in ln for ln in lines.values())
    assert "<- chosen" in lines["int4"] and "chose int4: the fastest that fits" in err
    assert "keeps its acceptance at int8 and int4" in err


@pytest.mark.parametrize("graph", ["target", "target_fused"])
def test_orin_bundle_runs_losslessly_on_the_cpu(orin_bundle, graph):
    """The 16-bit caches (numpy float16 buffers) and the fp16 drafter run on onnxruntime's CPU
    provider; drafting changes no token of plain decoding of the same bundle and graph."""
    from dflash_edge.runtime import Generator

    gen = Generator.load(orin_bundle[0], target_graph=graph)
    assert gen.target.kv.key.array.dtype == (np.int8 if graph == "target_fused" else np.float16)
    drafted = gen.generate_ids(PROMPT, 24, draft="drafter").token_ids
    assert drafted == gen.generate_ids(PROMPT, 24, draft="none").token_ids and len(drafted) == 24


def test_cpu_device_keeps_the_most_precise_that_fits(tiny_checkpoints, capsys):
    from dflash_edge.export.choices import resolve_choices
    from dflash_edge.export.exporter import ExportOptions

    opts = ExportOptions(out="x", target=tiny_checkpoints["qwen3"][1], draft="random", device="cpu")
    chosen, _ = resolve_choices(opts)
    assert (chosen.precision, chosen.draft_precision, chosen.kv16) == ("fp32", "fp32", False)
    assert "candidates" not in capsys.readouterr().err


def _hot_drafter(tiny_target, root):
    """A tiny drafter whose MLP output passes float16's range (its weights fit it)."""
    from safetensors.numpy import load_file, save_file

    from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter

    cfg = DraftConfig.for_target(tiny_target.config, num_layers=1, block_size=4, mask_token_id=5)
    save_drafter(new_drafter(cfg, seed=1), root)
    path = root / "model.safetensors"
    w = load_file(str(path))
    w["layers.0.mlp.down_proj.weight"] *= 6e4 / np.abs(w["layers.0.mlp.down_proj.weight"]).max()
    w["layers.0.mlp.up_proj.weight"] *= 300.0
    save_file(w, str(path), metadata={"format": "pt"})
    return root


def test_an_overflowing_fp16_drafter_falls_back_to_int8(
    tiny_checkpoints, tiny_target, tmp_path, capsys
):
    """DFlash2's fp16 guard stays: the overflow at parity writes the drafter again with int8
    weights, said on stderr; asked for by name, fp16 is refused naming the node."""
    from dflash_edge.export.graph_builder import Float16Overflow

    ckpt = tiny_checkpoints["qwen3"][1]
    draft = str(_hot_drafter(tiny_target, tmp_path / "hot"))
    sizes = dict(block_size=4, max_context=256, prefill_chunk=16, device=ORIN)
    out = export_tiny(tmp_path / "b", ckpt, draft, **sizes)
    assert "the fp16 drafter overflows" in capsys.readouterr().err
    m = assert_no_fp32(out)
    assert m["graphs"]["drafter"]["precision"] == "int8"
    with pytest.raises(Float16Overflow, match="graph 'drafter' overflows"):
        export_tiny(tmp_path / "c", ckpt, draft, draft_precision="fp16", **sizes)


def test_planner_gives_a_gpu_drafter_16_bits():
    """Qwen3-8B's z-lab-recipe drafter beside an int4 target on an Orin NX: fp16, <= 2.3 GB (4.19
    GB at fp32); a CPU keeps fp32 beside int4."""
    from dflash_edge.devices.dims import preset
    from dflash_edge.devices.planner import PlanRequest, draft_precision_of, memory_plan
    from dflash_edge.devices.profiles import get_profile

    t, d, _ = preset("qwen3-8b")
    req = PlanRequest(t, d, get_profile(ORIN), "int4", 4096)
    assert draft_precision_of(req) == "fp16"
    assert memory_plan(req)["components_gb"]["drafter_weights"] <= 2.3
    cpu = PlanRequest(t, d, get_profile("cpu"), "int4", 4096)
    assert draft_precision_of(cpu) == "fp32"


@pytest.mark.tier2
def test_default_model_on_an_orin_nx(tmp_path):
    """`dflash-edge export --device jetson-orin-nx-16gb` of the default model: int4 target, no fp32
    graph or cache (its shipped drafter overflows fp16 at parity: int8 weights)."""
    out = tmp_path / "bundle"
    assert main(["export", "--out", str(out), "--device", ORIN]) == 0
    m = assert_no_fp32(out)
    precisions = {n: g["precision"] for n, g in m["graphs"].items()}
    assert precisions == {"target": "int4", "target_fused": "int4", "drafter": "int8"}
