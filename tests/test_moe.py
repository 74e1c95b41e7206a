"""Mixture-of-experts targets, qwen3_moe (issue 25), tier 1.

A tiny random `Qwen3MoeForCausalLM` (transformers' own, saved by its `save_pretrained` in bf16
shards: the published per-expert layout) with a dense layer between sparse ones is exported with a
random drafter; both target flavours (portable gather graph, fused com.microsoft MoE) decode
greedily exactly as transformers' `generate` on short and ~300-token prompts, with the drafter off,
on, and forced through partial accepts. Bad checkpoints and configs are refused naming the tensor or
field."""

import copy
import json
import shutil

import numpy as np
import pytest
import torch

from dflash_edge.models.config import TargetConfig
from dflash_edge.runtime.errors import ModelFormatError

# sparse layers 0, 1, 3 (2 is dense); renormalised top-k / sparse every 2nd layer, raw top-k
VARIANTS = {
    "renorm": dict(
        num_hidden_layers=4, mlp_only_layers=[2], decoder_sparse_step=1, norm_topk_prob=True
    ),
    "step2": dict(
        num_hidden_layers=4, mlp_only_layers=[], decoder_sparse_step=2, norm_topk_prob=False
    ),
}
BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_experts=8,
    num_experts_per_tok=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    initializer_range=0.08,
)
SHORT = [5, 17, 33, 42, 8]
LONG = [(13 * i + i // 7) % 90 + 3 for i in range(300)]
NEW = 40

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def _hf_moe(variant: str, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(**BASE, **VARIANTS[variant])
    ).eval()
    with (
        torch.no_grad()
    ):  # norms are initialised to ones: randomise them so every weight is exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        for p in model.parameters():  # what the bf16 checkpoint holds, exactly
            p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """variant -> (transformers model, checkpoint folder, bundle folder)."""
    from tiny import add_tiny_tokenizer

    built = {}

    def get(variant):
        if variant not in built:
            root = tmp_path_factory.mktemp(f"moe-{variant}")
            model = _hf_moe(variant)
            ckpt = root / "ckpt"
            copy.deepcopy(model).to(torch.bfloat16).save_pretrained(
                ckpt, max_shard_size="100KB"
            )  # bf16 shards
            add_tiny_tokenizer(ckpt, BASE["vocab_size"])
            out = _export(root, ckpt, max_context=400, prefill_chunk=64)
            built[variant] = model, ckpt, out
        return built[variant]

    return get


def _hf_greedy(model, prompt, n):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def test_published_layout_is_per_expert_and_loads_with_parity(moe):
    from dflash_edge.models import load_target

    model, ckpt, _ = moe("renorm")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    assert (
        "model.layers.0.mlp.experts.7.down_proj.weight" in index
        and "model.layers.0.mlp.gate.weight" in index
    )
    assert (
        "model.layers.2.mlp.gate_proj.weight" in index
        and "model.layers.2.mlp.gate.weight" not in index
    )
    ours = load_target(ckpt)
    ids = torch.tensor([LONG[:40]])
    with torch.no_grad():
        want, got = model(ids).logits, ours(ids, ours.new_cache(64)).logits
    assert (got - want).abs().max() < 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_equals_transformers_generate_with_and_without_drafter(moe, variant):
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.targets import FusedTargetModel, TargetModel

    model, _, out = moe(variant)
    fused, portable = Generator.load(out), Generator.load(out, target_graph="target")
    assert type(fused.target) is FusedTargetModel and type(portable.target) is TargetModel
    for prompt in (SHORT, LONG):
        want = _hf_greedy(model, prompt, NEW)
        for gen in (fused, portable):
            for draft in ("none", "drafter"):
                got = gen.generate_ids(prompt, NEW, stop_token_ids=(), draft=draft).token_ids
                assert got == want, (variant, gen.target.GRAPH, draft, len(prompt))


def test_partial_accepts_through_the_experts_change_no_token(moe, oracle):
    """Verify blocks of several tokens route each token to its own experts: forced partial accepts
    stay exact."""
    from dflash_edge.runtime import Generator

    model, _, out = moe("renorm")
    for graph in ("target_fused", "target"):
        gen = Generator.load(out, target_graph=graph)
        for seed, prompt in enumerate((SHORT, LONG[:120])):
            want = _hf_greedy(model, prompt, NEW)
            oracle(gen, prompt + want, 0.7, seed=seed, miss=lambda true: (true + 1) % 90)
            got = gen.generate_ids(prompt, NEW, stop_token_ids=(), draft="drafter")
            assert got.token_ids == want, graph
            assert max(got.stats.acceptance_lengths) > 1 and min(got.stats.acceptance_lengths) < 4


def test_graphs_read_only_the_chosen_experts(moe):
    """Both flavours take the experts from one pair of stacked initializers per sparse layer,
    through a Gather on the router's TopK (portable) or onnxruntime's MoE op (fused): no MatMul runs
    over all experts."""
    import onnx

    _, _, out = moe("renorm")
    portable = onnx.load(str(out / "target.onnx"), load_external_data=False).graph
    fused = onnx.load(str(out / "target_fused.onnx"), load_external_data=False).graph
    fc1 = {
        i.name: list(i.dims)
        for i in portable.initializer
        if i.name.endswith("experts.fc1_interleaved")
    }
    assert sorted(fc1) == [f"model.layers.{i}.mlp.experts.fc1_interleaved" for i in (0, 1, 3)]
    assert fc1["model.layers.0.mlp.experts.fc1_interleaved"] == [8, 32, 32]  # [E, 2I, H]
    gathered = {n.input[0] for n in portable.node if n.op_type == "Gather"}
    assert set(fc1) <= gathered
    assert not any(set(n.input) & set(fc1) for n in portable.node if n.op_type == "MatMul")
    moe_nodes = [n for n in fused.node if n.op_type == "MoE"]
    assert len(moe_nodes) == 3 and {n.input[2] for n in moe_nodes} == set(fc1)

    def where(graph):
        return {i.name: [(e.key, e.value) for e in i.external_data] for i in graph.initializer}

    shared = where(portable)
    assert all(
        where(fused)[name] == shared[name] for name in fc1
    )  # one stored copy for both flavours


def test_parity_reference_reads_only_the_chosen_experts_one_at_a_time(moe):
    """The export's torch reference (models/weights.stream_layers) reads an expert only when a token
    chose it and drops it after: a sparse layer never holds all its experts (what keeps a 30B-A3B
    parity within the bundle's size), and the streamed model still gives the loaded model's
    logits."""
    from dflash_edge.models import build_target, load_target
    from dflash_edge.models.checkpoint import Checkpoint
    from dflash_edge.models.weights import stream_layers

    _, ckpt_dir, _ = moe("renorm")
    ckpt, reads, live = Checkpoint.open(ckpt_dir), [], []
    cfg = TargetConfig.from_json(ckpt_dir)
    real = ckpt.array

    def counted(name, *a, **k):
        reads.append(name)
        return real(name, *a, **k)

    ckpt.array = counted
    streamed = stream_layers(lambda: build_target(cfg), ckpt, "model.layers")
    for layer in streamed.model.layers:
        if hasattr(layer.mlp, "experts"):
            for expert in (
                layer.mlp.experts
            ):  # after each expert's own forward hook (registered first), count live
                expert.register_forward_hook(
                    lambda *_: live.append(
                        sum(
                            not p.is_meta
                            for x in streamed.model.layers
                            if hasattr(x.mlp, "experts")
                            for e in x.mlp.experts
                            for p in e.parameters()
                        )
                    )
                )
    ids = torch.tensor([[SHORT[0]]])
    with torch.no_grad():
        got = streamed(ids, streamed.new_cache(8)).logits
        want = load_target(ckpt_dir)(ids, streamed.new_cache(8)).logits
    assert torch.equal(got, want)
    experts_read = {n.rsplit(".", 2)[0] for n in reads if ".mlp.experts." in n}
    assert (
        len(experts_read) == 3 * BASE["num_experts_per_tok"]
    )  # 3 sparse layers x top-3, not 3 x 8
    assert (
        live
        and max(live) == 0
        and all(p.is_meta for p in streamed.model.layers[0].mlp.experts.parameters())
    )


# ---------------------------------------------------------------- bad input, named
def _cfg(**change) -> dict:
    raw = {"model_type": "qwen3_moe", **BASE, **VARIANTS["renorm"], **change}
    return {k: v for k, v in raw.items() if v is not None}


def test_config_reads_transformers5_and_published_expert_fields():
    from dflash_edge.models import layer_mlps

    cfg = TargetConfig.from_dict(
        _cfg(num_experts=None, num_local_experts=8)
    )  # transformers 5 writes this name
    assert cfg.num_experts == 8
    assert [m and m.top_k for m in layer_mlps(cfg)] == [3, 3, None, 3]
    step2 = TargetConfig.from_dict(_cfg(**VARIANTS["step2"]))
    assert [m is not None for m in layer_mlps(step2)] == [False, True, False, True]


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(num_experts_per_tok=9), ["num_experts_per_tok=9", "num_experts=8"]),
        (
            dict(model_type="qwen2_moe", shared_expert_intermediate_size=64),
            ["qwen2_moe", "shared_expert_intermediate_size"],
        ),
        (dict(model_type="gpt_oss"), ["gpt_oss", "sinks", "MXFP4"]),
        (dict(moe_intermediate_size=None), ["num_experts=8", "moe_intermediate_size=0"]),
    ],
)
def test_bad_configs_are_refused_by_name(change, words):
    from dflash_edge.models import layer_mlps

    with pytest.raises(ModelFormatError) as err:
        layer_mlps(TargetConfig.from_dict(_cfg(**change)))
    assert all(w in str(err.value) for w in words), str(err.value)


def _export(root, ckpt, max_context=64, **options):
    """`ckpt` exported into root/"b", a random drafter of block 4 (fp32 unless `options` say)."""
    from fixtures_bundle import export_tiny

    options = {"precision": "fp32", **options}
    return export_tiny(root / "b", str(ckpt), block_size=4, max_context=max_context, **options)


def _edited_copy(src, dst, config_change=None, drop=None):
    """A copy of checkpoint `src` with config.json fields changed and/or tensor `drop` removed from
    its shard."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    if config_change:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config_change}))
    if drop:
        index_file = dst / "model.safetensors.index.json"
        index = json.loads(index_file.read_text())
        shard = dst / index["weight_map"].pop(drop)
        tensors = load_file(str(shard))
        del tensors[drop]
        save_file(tensors, str(shard), metadata={"format": "pt"})
        index_file.write_text(json.dumps(index))
    return dst


def test_missing_expert_tensor_is_named(moe, tmp_path):
    _, ckpt, _ = moe("renorm")
    bad = _edited_copy(ckpt, tmp_path / "c", drop="model.layers.1.mlp.experts.5.up_proj.weight")
    with pytest.raises(
        ModelFormatError,
        match=r"missing tensors model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight",
    ):
        _export(tmp_path, bad)


@pytest.mark.parametrize("experts", [4, 16])
def test_expert_count_disagreeing_with_config_is_named(moe, tmp_path, experts):
    _, ckpt, _ = moe("renorm")
    bad = _edited_copy(ckpt, tmp_path / "c", config_change={"num_local_experts": experts})
    with pytest.raises(ModelFormatError, match=rf"holds 8 experts .* num_experts={experts}"):
        _export(tmp_path, bad)


def test_experts_in_a_layer_the_config_makes_dense_are_named(moe, tmp_path):
    _, ckpt, _ = moe("renorm")
    bad = _edited_copy(ckpt, tmp_path / "c", config_change={"mlp_only_layers": [1, 2]})
    with pytest.raises(
        ModelFormatError, match=r"model\.layers\.1\.mlp\.experts\.0 .*mlp_only_layers=\[1, 2\]"
    ):
        _export(tmp_path, bad)


def test_names_table_equals_the_torch_state_dict():
    from dflash_edge.models import build_target, family_spec
    from dflash_edge.models.names import target_tensors

    cfg = TargetConfig.from_dict(_cfg())
    with torch.device("meta"):
        model = build_target(cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert target_tensors(cfg, family_spec(cfg)) == want
    assert np.prod(want["model.layers.3.mlp.gate.weight"]) == 8 * 32


# ---------------------------------------------------------------- the planner (devices/)
def test_planner_holds_every_expert_and_reads_the_chosen_ones():
    """Memory budgets all 128 experts; a decode reads attention + 8 experts (as the dense twin of
    width 8 x 768); a verify of T tokens reads more distinct experts, never more than min(128, 8
    T)."""
    from dataclasses import replace

    from dflash_edge.devices.dims import preset
    from dflash_edge.devices.planner import (
        PlanRequest,
        class_factors,
        effective_bandwidth_gb_s,
        memory_plan,
        target_step,
    )
    from dflash_edge.devices.profiles import get_profile

    t, d, _ = preset("qwen3-coder-30b-a3b")
    dev = get_profile("jetson-agx-orin-64gb")
    req = PlanRequest(t, d, dev, "fp16", 4096)
    weights = (
        memory_plan(req)["components_gb"]["target_weights"]
        / class_factors(dev.device_class)["weights_residency"]
    )
    assert weights == pytest.approx(2 * t.total_params / 1e9, rel=1e-3) and t.total_params > 30e9

    def read(r, tokens):  # bytes one target call reads, from the roofline's memory time
        return target_step(r, tokens)["memory_ms"] / 1e3 * effective_bandwidth_gb_s(r) * 1e9

    dense = replace(
        req, target=replace(t, num_experts=0, intermediate_size=8 * t.moe_intermediate_size)
    )
    router = t.num_layers * t.hidden_size * t.num_experts * 2
    assert read(req, 1) == pytest.approx(read(dense, 1) + router, rel=1e-3)
    expert = (
        t.num_layers * 3 * t.hidden_size * t.moe_intermediate_size * 2
    )  # one expert in every layer
    touched = [8 + (read(req, n) - read(req, 1)) / expert for n in (1, 2, 4, 16, 64)]
    assert touched[0] == pytest.approx(8) and all(a < b for a, b in zip(touched, touched[1:]))
    assert (
        all(x <= min(128, 8 * n) + 1e-6 for x, n in zip(touched, (1, 2, 4, 16, 64)))
        and touched[-1] > 120
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_planner_counts_the_checkpoint_with_its_dense_layers(variant):
    """planner_dims' parameter counts equal the tensors a checkpoint of that config holds (norms
    aside), dense layers between sparse ones included; active = attention + k experts + router +
    dense MLPs + head."""
    from dflash_edge.models import family_spec, planner_dims
    from dflash_edge.models.names import target_tensors

    raw = _cfg(**VARIANTS[variant])
    cfg = TargetConfig.from_dict(raw)
    tensors = {
        k: int(np.prod(v))
        for k, v in target_tensors(cfg, family_spec(cfg)).items()
        if "norm" not in k
    }
    dims = planner_dims(raw)
    assert dims.total_params == sum(tensors.values())
    per_expert = 3 * 32 * 16
    assert (
        dims.total_params - dims.active_params
        == (8 - 3) * per_expert * (4 - dims.dense_layers) + 96 * 32
    )
    assert dims.dense_layers == {"renorm": 1, "step2": 2}[variant]


def test_plan_of_an_moe_bundle_holds_every_expert_and_reads_the_chosen_ones(moe):
    """`devices plan BUNDLE` reads the experts from the manifest: memory is the bundle's bytes
    (every expert), a decode reads attention + router + the k chosen experts + the dense layer + the
    head (counted here from the checkpoint's own tensors), a verify of more tokens reads more
    experts, never more than the bundle holds."""
    from argparse import Namespace
    from dataclasses import replace

    from dflash_edge.cli.devices import bundle_request
    from dflash_edge.devices.planner import (
        GB,
        effective_bandwidth_gb_s,
        target_step,
        weight_bytes,
    )
    from dflash_edge.devices.profiles import get_profile
    from dflash_edge.models import family_spec, planner_dims
    from dflash_edge.models.names import target_tensors

    _, ckpt, out = moe("renorm")
    dev = replace(
        get_profile("jetson-agx-orin-64gb"), bandwidth_gb_s=1e-3, decode_bandwidth_gb_s=None
    )  # slow: ms that 4 decimals resolve
    req = bundle_request(
        Namespace(bundle=str(out), precision=None, block=None, context=1, tau=None), dev
    )
    want = planner_dims(json.loads((ckpt / "config.json").read_text()))
    fields = (
        "num_experts",
        "experts_per_token",
        "moe_intermediate_size",
        "intermediate_size",
        "dense_layers",
    )
    assert (
        [getattr(req.target, f) for f in fields]
        == [getattr(want, f) for f in fields]
        == [8, 3, 16, 48, 1]
    )

    assert weight_bytes(req)[0] == req.target_weight_bytes  # memory: the bundle's bytes, as stored

    cfg = TargetConfig.from_dict(json.loads((ckpt / "config.json").read_text()))
    sizes = {
        k: int(np.prod(v))
        for k, v in target_tensors(cfg, family_spec(cfg)).items()
        if "norm" not in k
    }
    assert req.target_weight_bytes > 4 * sum(sizes.values())  # fp32: every expert is in the bundle
    layers = {k: v for k, v in sizes.items() if k.startswith("model.layers.")}
    experts = sum(v for k, v in layers.items() if ".experts." in k)
    active = (
        sum(layers.values()) - experts * (8 - 3) // 8
    )  # attention, router, 3 of 8 experts, dense

    def read(
        tokens,
    ):  # bytes of the decoder layers one target call reads (the roofline's memory time
        # less the LM head and the 1-position K/V)
        total = target_step(req, tokens)["memory_ms"] / 1e3 * effective_bandwidth_gb_s(req) * GB
        return total - 4 * sizes["lm_head.weight"] - 4 * 4 * 2 * 2 * 16

    # the bundle's bytes scale every layer alike: a decode reads the active share of what 4096
    # tokens read (all)
    assert read(1) / read(4096) == pytest.approx(active / sum(layers.values()), rel=1e-3)
    assert read(1) < read(2) < read(4) < read(4096)


# ---------------------------------------------------------------- low-bit experts (QMoE /
# dequantising gather)
LOW_BIT = {
    "int4": dict(precision="int4", kv_cache="fp32"),
    "int4-fp32-activations": dict(precision="int4", accuracy_level=0, kv_cache="fp32"),
    "int8": dict(precision="int8", kv_cache="fp32"),
}


@pytest.fixture(scope="module")
def moe_low_bit(moe, tmp_path_factory):
    """name -> the renorm checkpoint exported with low-bit experts (blocks of 16:
    moe_intermediate_size is 16)."""
    built = {}

    def get(name):
        if name not in built:
            _, ckpt, _ = moe("renorm")
            root = tmp_path_factory.mktemp(name)
            built[name] = _export(
                root, ckpt, 400, prefill_chunk=64, quant_block=16, **LOW_BIT[name]
            )
        return built[name]

    return get


@pytest.mark.parametrize("name", LOW_BIT)
def test_low_bit_experts_are_stored_per_expert_and_counted(moe_low_bit, name):
    """Codes + scales per sparse layer shared by both flavours (QMoE in the fused one, a Gather of
    the chosen experts' codes in the portable one); no fp32 expert stack is written;
    weights_by_source counts the experts."""
    import onnx

    out = moe_low_bit(name)
    bits = LOW_BIT[name]["precision"][-1]
    man = json.loads((out / "manifest.json").read_text())
    portable = onnx.load(str(out / "target.onnx"), load_external_data=False).graph
    fused = onnx.load(str(out / "target_fused.onnx"), load_external_data=False).graph
    codes = {i.name: list(i.dims) for i in portable.initializer if ".mlp.experts.fc" in i.name}
    assert sorted(codes) == sorted(
        f"model.layers.{i}.mlp.experts.{fc}_{part}"
        for i in (0, 1, 3)
        for fc in ("fc1", "fc2")
        for part in (f"Q{bits}", "scales")
    )
    per_byte = 8 // int(bits)
    assert codes[f"model.layers.0.mlp.experts.fc1_Q{bits}"] == [
        8,
        32,
        32 // per_byte,
    ]  # [E, 2I, H*bits/8]
    assert codes["model.layers.0.mlp.experts.fc2_scales"] == [8, 32, 1]  # [E, H, I/16]
    assert {n.input[0] for n in portable.node if n.op_type == "Gather"} >= set(codes)
    qmoe = [n for n in fused.node if n.op_type == "QMoE"]
    assert len(qmoe) == 3 and not [n for n in fused.node if n.op_type == "MoE"]
    assert {
        a.name: a.i for a in qmoe[0].attribute if a.name in ("expert_weight_bits", "block_size")
    } == {"expert_weight_bits": int(bits), "block_size": 16}
    for graph in ("target", "target_fused"):
        entry = man["graphs"][graph]
        # 72 expert tensors (3 sparse layers x 8 experts x gate/up/down) + 16 attention + 3 dense
        # MLP + table, head
        assert entry["precision"] == LOW_BIT[name]["precision"]
        assert entry["quantization"]["weights_by_source"] == {"rtn": 72 + 16 + 3 + 2}


def test_int4_experts_are_exact_against_the_dequantised_weights(moe_low_bit):
    """With fp32 activations (accuracy level 0) both flavours match the torch reference on the
    dequantised expert weights (parity's StoredWeights) to fp32 rounding: QMoE and the gather read
    exactly the stored experts."""
    parity = json.loads((moe_low_bit("int4-fp32-activations") / "manifest.json").read_text())[
        "source"
    ]["parity"]
    for graph in ("target", "target_fused"):
        assert (
            parity[f"{graph}.logits.max_abs_diff"] < 1e-5
            and parity[f"{graph}.next_ids.agreement"] == 1.0
        )


@pytest.mark.parametrize("name", ["int4", "int8"])
def test_low_bit_experts_decode_the_same_with_and_without_the_drafter(moe_low_bit, oracle, name):
    """Lossless at the bundle's own precision: forced partial accepts through QMoE / the gather
    change no token."""
    from dflash_edge.runtime import Generator

    out = moe_low_bit(name)
    for graph in ("target_fused", "target"):
        gen = Generator.load(out, target_graph=graph)
        for seed, prompt in enumerate((SHORT, LONG[:120])):
            want = gen.generate_ids(prompt, NEW, stop_token_ids=(), draft="none").token_ids
            oracle(gen, prompt + want, 0.7, seed=seed, miss=lambda true: (true + 1) % 90)
            got = gen.generate_ids(prompt, NEW, stop_token_ids=(), draft="drafter")
            assert got.token_ids == want, (name, graph, len(prompt))
            assert max(got.stats.acceptance_lengths) > 1 and min(got.stats.acceptance_lengths) < 4


def test_int8_experts_with_fp32_activations_are_refused_by_name(moe, tmp_path):
    from dflash_edge.runtime.errors import DflashEdgeError

    _, ckpt, _ = moe("renorm")
    with pytest.raises(DflashEdgeError, match="int8 experts with accuracy_level 0.*--no-fused"):
        _export(tmp_path, ckpt, precision="int8", accuracy_level=0, quant_block=16)


def test_expert_blocks_qmoe_cannot_take_are_refused_by_name(moe, tmp_path):
    from dflash_edge.runtime.errors import DflashEdgeError

    _, ckpt, _ = moe("renorm")  # moe_intermediate_size 16: blocks of 32 do not divide it
    with pytest.raises(DflashEdgeError, match="blocks of 32.*moe_intermediate_size 16"):
        _export(tmp_path, ckpt, precision="int4")


class _RandomExperts:
    """Checkpoint stand-in for one sparse layer: each named tensor random (seeded by its name),
    float32."""

    root = "random"

    def __init__(self, m):
        from dflash_edge.models.names import moe_tensors

        self.shapes = moe_tensors("model.layers.0", m)

    def array(self, name, shape=None):
        import zlib

        return (
            np.random.default_rng(zlib.crc32(name.encode())).standard_normal(
                self.shapes[name], np.float32
            )
            * 0.2
        )


@pytest.mark.parametrize("precision", ["fp32", "int4", "int8"])
def test_fused_experts_give_a_token_the_same_row_in_any_call(tmp_path, precision):
    """A token's output row from a 16-token call (a verify) equals its row alone (a decode) bit for
    bit, so greedy stays lossless: QMoE's own k-way sum would depend on the other tokens (an ulp off
    with k >= 3), so routing and the slot sum stay outside it. onnxruntime's fp32 MoE op is not
    row-stable (its GEMM differs with the rows per expert, ~4e-6 here), nor is the portable gather
    at full size (benchmarks/moe_slice.py op): known limits of fp32 fused and of portable MoE graphs
    on CPU. The gather computes the same function."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    from dflash_edge.export.graph_builder import MS, GraphBuilder
    from dflash_edge.export.moe_layers import moe_fused, moe_gather
    from dflash_edge.export.weight_format import WeightFormat
    from dflash_edge.export.weight_store import WeightStore
    from dflash_edge.models.spec import MoESpec

    m, store = MoESpec(64, 8, 3, 32, True), WeightStore(tmp_path)
    sessions = {}
    for form, write in (("fused", moe_fused), ("gather", moe_gather)):
        g = GraphBuilder("target", store, WeightFormat(precision, block_size=16))
        g.op("Identity", [write(g, "h", _RandomExperts(m), "model.layers.0", m)], "y")
        io = [helper.make_tensor_value_info(n, 1, [1, "T", 64]) for n in ("h", "y")]
        model = helper.make_model(
            helper.make_graph(g.nodes, form, io[:1], io[1:], g.inits),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
        )
        onnx.save_model(model, str(tmp_path / f"{form}.onnx"))
        sessions[form] = ort.InferenceSession(
            str(tmp_path / f"{form}.onnx"), providers=["CPUExecutionProvider"]
        )
    h = np.random.default_rng(1).standard_normal((1, 16, 64), np.float32)
    call = {form: s.run(None, {"h": h})[0] for form, s in sessions.items()}  # [1, 16, H]
    if precision != "fp32":
        alone = np.concatenate(
            [sessions["fused"].run(None, {"h": h[:, t : t + 1]})[0] for t in range(16)], axis=1
        )
        assert np.array_equal(alone, call["fused"])
    assert np.abs(call["fused"] - call["gather"]).max() < (
        1e-5 if precision == "fp32" else 0.05 * np.abs(h).max()
    )
