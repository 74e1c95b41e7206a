"""The fused-attention target flavour (issue 12): GroupQueryAttention over shared past/present
buffers (tier 1).

Every tiny family with head_dim 16 (GroupQueryAttention needs a multiple of 16): the fused graph's
greedy output equals the portable graph's and the torch reference's, with and without drafting,
through rejections and rollbacks, multi-chunk prefill and verify blocks of any T; its cache holds
the same K/V; the manifest names each file's flavour and TensorRT only ever sees the portable
graphs."""

import json

import numpy as np
import onnx
import pytest

from dflash_edge.runtime.errors import DflashEdgeError
from dflash_edge.runtime.io_tables import pick_graph
from dflash_edge.runtime.targets import FusedTargetModel, TargetModel

from fixtures_bundle import MAX_CONTEXT, build_tiny_bundle
from tiny import hf_model, save_hf

VARIANTS = ("llama", "llama-untied-llama3rope", "qwen2", "qwen2-yarn", "qwen3")
PROMPTS = [
    [5, 17, 33, 42, 8],
    [7],
    [(13 * i) % 90 + 3 for i in range(29)],
]  # 29: 3 chunks of 8 + overlap
BLOCK = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def fused_bundles(tmp_path_factory):
    """variant -> (TinyBundle with head_dim 16, a Generator forced onto the portable target
    graph)."""
    from dflash_edge.runtime import Generator

    built = {}

    def get(variant):
        if variant not in built:
            root = tmp_path_factory.mktemp(f"fused-{variant}")
            ckpt = save_hf(hf_model(variant, overrides={"head_dim": 16}), root / "ckpt")
            tb = build_tiny_bundle(root, ckpt, BLOCK)
            built[variant] = tb, Generator.load(tb.path, target_graph="target")
        return built[variant]

    return get


def reference(tb, prompt, n):
    from dflash_edge.models.reference_loop import GenerationConfig, target_generate

    return target_generate(
        tb.target,
        prompt,
        GenerationConfig(max_new_tokens=n, max_context=MAX_CONTEXT, stop_token_ids=()),
    ).token_ids


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_greedy_equals_portable_and_torch(fused_bundles, variant):
    tb, portable = fused_bundles(variant)
    fused = tb.generator
    assert type(fused.target) is FusedTargetModel and type(portable.target) is TargetModel
    for prompt in PROMPTS:
        want = reference(tb, prompt, 30)
        for gen in (fused, portable):
            for draft in ("drafter", "none"):
                got = gen.generate_ids(prompt, 30, stop_token_ids=(), draft=draft)
                assert got.token_ids == want, (variant, gen.target.GRAPH, draft)


@pytest.mark.parametrize("hit", [1.0, 0.7])
def test_rollback_after_rejection(fused_bundles, oracle, hit):
    tb, _ = fused_bundles("qwen3")
    gen = tb.generator
    for i, prompt in enumerate(PROMPTS):
        want = reference(tb, prompt, 40)
        oracle(
            gen, prompt + want, hit, seed=i, miss=lambda true: (true + 1) % 90
        )  # conftest.py: a miss is sure
        got = gen.generate_ids(
            prompt, 40, stop_token_ids=(), draft="drafter"
        )  # always draft: rollback every step
        assert got.token_ids == want
        steps = got.stats.acceptance_lengths
        assert max(steps) == BLOCK  # whole blocks accepted ...
        if hit < 1:
            assert min(steps) < BLOCK  # ... and partial ones rolled back


def test_any_verify_size_and_cache_contents_match_portable(fused_bundles):
    """T other than 1 / B / P works (the graph is dynamic in T); the shared buffers hold the same
    K/V rows."""
    from dflash_edge.runtime import Generator

    tb, _ = fused_bundles("llama-untied-llama3rope")
    fused, portable = (
        Generator.load(tb.path),
        Generator.load(tb.path, target_graph="target"),
    )  # fresh caches
    prompt = PROMPTS[2]
    for gen in (fused, portable):
        gen.generate_ids(prompt, 1, stop_token_ids=())  # prefill: 29 rows cached
    n, block = len(prompt), [11, 40, 2, 9, 33]
    outs = []
    for gen in (fused, portable):
        step = gen.target.step(len(block))  # a new T: bound on first use
        step["input_ids"][0] = block
        gen.target.forward(len(block), n)
        outs.append((step["logits"].copy(), step["next_ids"].copy()))
    np.testing.assert_allclose(outs[0][0], outs[1][0], atol=1e-4)
    assert (outs[0][1] == outs[1][1]).all()
    fk = fused.target.kv.key.array[:, :, : n + len(block)]  # [L, Hkv, S, D]: written in place
    pk = portable.target.kv.key.array[: n + len(block)].transpose(
        1, 2, 0, 3
    )  # [S, L, Hkv, D] -> [L, Hkv, S, D]
    np.testing.assert_allclose(fk, pk, atol=1e-5)
    assert np.abs(fk).max() > 0 and not fused.target.kv.key.array[:, :, n + len(block) :].any()


def test_manifest_flavours_share_one_weights_file(fused_bundles):
    from dflash_edge.runtime.bundle import read_bundle

    tb, _ = fused_bundles("qwen3")
    m = read_bundle(tb.path).manifest  # every sha256 checked
    graphs = m["graphs"]
    assert {n: g["flavour"] for n, g in graphs.items()} == {
        "target": "portable",
        "drafter": "portable",
        "target_fused": "fused",
    }
    assert (
        graphs["target_fused"]["files"][1] == graphs["target"]["files"][1]
    )  # target.onnx.data, once
    assert (
        graphs["target_fused"]["opset"] == 23
        and graphs["target_fused"]["io"]["inputs"][4]["per"] == "L"
    )
    assert (
        m["source"]["target_fused"]["appended_bytes"] < m["source"]["target_fused"]["reused_bytes"]
    )
    stored = {}  # graph -> names of its initializers in target.onnx.data, by offset
    for g in ("target", "target_fused"):
        inits = onnx.load(str(tb.path / f"{g}.onnx"), load_external_data=False).graph.initializer
        where = [
            ({e.key: e.value for e in i.external_data}, i.name) for i in inits if i.external_data
        ]
        stored[g] = {
            int(e["offset"]): name for e, name in where if e["location"] == "target.onnx.data"
        }
    only = {
        g: sorted(n for o, n in stored[g].items() if o not in stored[other])
        for g, other in (("target", "target_fused"), ("target_fused", "target"))
    }
    assert only["target"] == [
        "rope.cos",
        "rope.sin",
    ]  # the packed q/k/v too: one copy of every weight
    assert set(only["target_fused"]) <= {"rope.cos_cache", "rope.sin_cache"} | {
        n for n in only["target_fused"] if n.startswith("pad_row_")
    }
    parity = m["source"]["parity"]
    assert (
        parity["target_fused.logits.max_abs_diff"] <= 1e-3
        and parity["target_fused.next_ids.agreement"] == 1.0
    )
    assert "target_fused.new_key.max_abs_diff" in parity


def test_tensorrt_sees_only_portable_graphs(fused_bundles):
    """TensorRT gets profiles for the portable graphs only, and the runtime opens the portable
    target on it (the fused one's contrib ops are onnxruntime's)."""
    from dflash_edge.runtime.trt_profiles import trt_profiles

    tb, _ = fused_bundles("qwen3")
    assert set(trt_profiles(tb.path)) == {"target", "drafter"}
    names = json.loads((tb.path / "manifest.json").read_text())["graphs"]
    assert pick_graph(names, "target", "tensorrt", "float32") == "target"
    assert (
        pick_graph(names, "target", "cuda", "float32") == "target"
    )  # CUDA's GQA kernel: fp16/bf16 only
    assert pick_graph(names, "target", "cuda", "float16") == "target_fused"
    assert pick_graph(names, "target", "cpu", "float32") == "target_fused"


def test_head_dim_not_multiple_of_16_keeps_portable_only(tiny_bundle):
    tb = tiny_bundle("llama", 4)  # head_dim 8
    m = json.loads((tb.path / "manifest.json").read_text())
    assert "target_fused" not in m["graphs"] and "multiple of 16" in m["source"]["target_fused"]
    assert type(tb.generator.target) is TargetModel


def test_forcing_a_missing_target_graph_names_it(fused_bundles):
    from dflash_edge.runtime import Generator

    tb, _ = fused_bundles("qwen3")
    with pytest.raises(
        DflashEdgeError, match="target_graph='target_mystery'.*target, target_fused"
    ):
        Generator.load(tb.path, target_graph="target_mystery")
