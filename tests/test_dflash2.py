"""DFlash2 drafters (issue 38): config + loader, the torch reference, the identity conversion from
DFlash1, the exported lattice graph and the runtime's walk over it (tier 1: tiny models)."""

import json
import shutil

import pytest
import torch

from dflash_edge.models.dflash2 import draft_lattice, greedy_walk
from dflash_edge.models.dflash2_config import DFlash2Config, read_draft_config
from dflash_edge.models.dflash2_weights import from_dflash1
from dflash_edge.models.draft_config import DraftConfig
from dflash_edge.models.drafter import load_drafter, new_drafter
from dflash_edge.models.families.qwen3 import attention_spec
from dflash_edge.models.names import drafter_tensors
from dflash_edge.runtime.errors import ModelFormatError
from dflash_edge.runtime.sampling import SamplingParams

from dflash2_fixture import write_dflash2
from runtime_cases import PROMPTS, SAMPLERS, reference
from tiny import check_two_token_distribution, drafted_pairs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def d2_folder(tiny_target, tmp_path_factory):
    return write_dflash2(tmp_path_factory.mktemp("d2") / "drafter", tiny_target.config)


def test_published_layout_loads_with_every_tensor(d2_folder, tiny_target):
    drafter = load_drafter(d2_folder, target_config=tiny_target.config)
    cfg = drafter.config
    assert isinstance(cfg, DFlash2Config) and len(drafter.candidate_selector.successor_codebook)
    assert (cfg.block_size, cfg.selector_top_k, cfg.selector_rank, cfg.conv_groups) == (8, 16, 8, 2)
    assert cfg.final_logit_softcapping == 20.0 and cfg.output_multiplier == 0.75
    assert cfg.causal is False and cfg.window_layers == [0, 1] and cfg.sliding_window == 48
    names = drafter_tensors(cfg, attention_spec(cfg))
    assert set(names) == set(drafter.state_dict())
    assert names["candidate_selector.predecessor_codebook"] == (96, 8)
    assert names["layers.1.mlp_conv.kernel_projection.weight"] == (2 * 2 * 2, 32)


def test_fields_read_from_dflash_config_first_then_top_level(d2_folder):
    raw = json.loads((d2_folder / "config.json").read_text())
    raw["selector_top_k"] = 7  # dflash_config's 16 wins
    raw["dflash_config"].pop("conv_group_size")
    raw["conv_group_size"] = 8  # only at the top level: read there
    cfg = read_draft_config(raw)
    assert (cfg.selector_top_k, cfg.conv_group_size, cfg.conv_groups) == (16, 8, 4)
    raw["architectures"] = ["Qwen3DFlash2DraftModel"]
    assert isinstance(read_draft_config(raw), DFlash2Config)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["dflash_config"].pop("selector_rank"), r"lacks \['selector_rank'\]"),
        (lambda r: r["dflash_config"].update(conv_group_size=12), "does not divide hidden_size"),
        (lambda r: r.update(architectures=["Qwen3ForCausalLM"]), "is not a DFlash drafter"),
    ],
)
def test_bad_configs_are_refused_by_name(d2_folder, edit, message):
    raw = json.loads((d2_folder / "config.json").read_text())
    edit(raw)
    with pytest.raises(ModelFormatError, match=message):
        read_draft_config(raw)


def test_config_round_trips_through_to_dict(d2_folder):
    cfg = read_draft_config(json.loads((d2_folder / "config.json").read_text()))
    again = read_draft_config(json.loads(json.dumps(cfg.to_dict())))
    again.torch_dtype = cfg.torch_dtype  # to_dict writes bfloat16, z-lab's published dtype
    assert again == cfg and again.to_dict()["architectures"] == ["DFlash2DraftModel"]


def _block(target, drafter, ctx_len=9, block=8, seed=0):
    """One denoising step of `drafter` on random context features: its normed block hidden."""
    g = torch.Generator().manual_seed(seed)
    cfg = drafter.config
    feats = torch.randn(1, ctx_len, len(cfg.target_layer_ids) * cfg.hidden_size, generator=g)
    ids = torch.tensor([[11] + [cfg.mask_token_id] * (block - 1)])
    empty = torch.zeros(1, cfg.num_key_value_heads, 0, cfg.head_dim)
    pos = torch.arange(ctx_len + block)
    layers = cfg.num_hidden_layers
    with torch.no_grad():
        embeds = target.model.embed_tokens(ids)
        past = [(empty, empty)] * layers
        h, _, _ = drafter.step(embeds, pos[ctx_len:], feats, pos[:ctx_len], past)
    return h, ids


def test_identity_conversion_keeps_dflash1_hidden_and_drafts(tiny_target):
    cfg1 = DraftConfig.for_target(tiny_target.config, num_layers=2, block_size=8, mask_token_id=5)
    d1 = new_drafter(cfg1, seed=3)
    cfg2 = DFlash2Config(**{**vars(cfg1), "selector_rank": 4, "conv_group_size": 16})
    d2 = from_dflash1(d1, cfg2)
    for seed in range(3):
        h1, ids = _block(tiny_target, d1, seed=seed)
        h2, _ = _block(tiny_target, d2, seed=seed)
        assert torch.equal(h1, h2)  # a neutral conv is exact: 1 * x + 0 * shifted
        with torch.no_grad():
            want = tiny_target.lm_head(h1[:, 1:]).argmax(-1)
            cand, scores = draft_lattice(d2, tiny_target.lm_head, h2[:, 1:], ids[:, 0])
        assert torch.equal(greedy_walk(cand, scores), want)


# ---- export + runtime ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def d2_bundle(tiny_checkpoints, tmp_path_factory):
    """A tiny qwen3 target + the published-layout DFlash2 drafter, exported with parity on."""
    from dflash_edge.models import load_target
    from dflash_edge.runtime import Generator

    from fixtures_bundle import TinyBundle
    from tiny import add_tiny_tokenizer

    root = tmp_path_factory.mktemp("d2-bundle")
    shutil.copytree(tiny_checkpoints["qwen3"][1], root / "target")
    add_tiny_tokenizer(root / "target")
    target = load_target(root / "target")
    write_dflash2(root / "drafter", target.config)
    out = _export(root, root / "target", root / "drafter")
    drafter = load_drafter(root / "drafter", target_config=target.config)
    return TinyBundle(out, target, drafter, Generator.load(out))


def test_export_writes_the_lattice_and_parity_checks_it(d2_bundle):
    manifest = json.loads((d2_bundle.path / "manifest.json").read_text())
    assert manifest["model"]["draft_selector_top_k"] == 16
    outputs = [o["name"] for o in manifest["graphs"]["drafter"]["io"]["outputs"]]
    assert outputs[-2:] == ["candidate_ids", "lattice_scores"]
    parity = manifest["source"]["parity"]
    assert parity["drafter.candidate_ids.agreement"] == 1.0
    assert parity["drafter.draft_ids.agreement"] == 1.0
    assert (
        parity["drafter.lattice_scores.max_abs_diff"]
        < 1e-3 * parity["drafter.lattice_scores.max_abs"]
    )


def _recording(gen, monkeypatch):
    """Wrap `gen`'s drafter model so each draft call records (graph draft_ids, its lattice or
    Nones, ctx_end); undone after the test."""
    model, calls = gen.drafter, []
    run = model.draft

    def draft(last, ctx_end):
        ids = run(last, ctx_end)
        cand, scores = model.lattice() if "candidate_ids" in model.step.arrays else (None, None)
        copies = [None if a is None else a.copy() for a in (ids, cand, scores)]
        calls.append((*copies, ctx_end))
        return ids

    monkeypatch.setattr(model, "draft", draft)
    return calls


def test_greedy_is_lossless_and_the_host_walk_is_the_graphs(d2_bundle, monkeypatch):
    from dflash_edge.runtime.lattice import greedy_walk

    gen = d2_bundle.generator
    calls = _recording(gen, monkeypatch)
    for prompt in PROMPTS:
        want = reference(d2_bundle, prompt, stop=())
        spec = gen.generate_ids(prompt, 40, draft="drafter", stop_token_ids=())
        plain = gen.generate_ids(prompt, 40, draft="none", stop_token_ids=())
        assert spec.token_ids == plain.token_ids == want.token_ids
        steps = spec.stats.acceptance_lengths
        assert steps and all(1 <= a <= 8 for a in steps) and sum(steps) + 1 >= 40
    assert len(calls) > 40
    for ids, cand, scores, _ in calls:
        assert greedy_walk(cand, scores).tolist() == ids.tolist()
        assert cand.shape == (7, 16) and scores.shape == (7, 16, 16)


@pytest.mark.parametrize("sampling", SAMPLERS)
def test_sampling_same_seed_same_tokens(d2_bundle, sampling, monkeypatch):
    """Rejection rule (the default): a seed gives the same tokens on every run, whatever ran
    between (not plain sampling's tokens: lattice.py). The coupling gives the target's own."""
    gen = d2_bundle.generator
    assert gen.sampled_rule == "rejection"

    def run():
        return gen.generate_ids(PROMPTS[1], 48, sampling, draft="drafter", stop_token_ids=())

    first = run()
    gen.generate_ids(PROMPTS[0], 20, sampling, draft="drafter", stop_token_ids=())
    again = run()
    assert first.token_ids == again.token_ids and len(first.token_ids) == 48
    assert first.stats.acceptance_lengths == again.stats.acceptance_lengths
    monkeypatch.setattr(gen, "sampled_rule", "coupling")
    want = reference(d2_bundle, PROMPTS[1], 48, sampling, stop=())
    assert run().token_ids == want.token_ids


def test_under_auto_a_seed_fixes_the_tokens_only_with_the_coupling(d2_bundle, monkeypatch):
    """`draft="auto"` picks each step from measured step times. Step clocks that differ (injected:
    a fast and a slow one) change which steps draft; under the coupling the tokens stay plain
    sampling's for the seed whatever ran, under the rejection rule they follow the drafts (what
    lattice.py and docs/design.md §5 say a seed guarantees)."""
    import itertools

    import dflash_edge.runtime.generator as generator

    gen, sampling = d2_bundle.generator, SamplingParams(temperature=0.9, seed=5)

    def run(rule: str, tick: float) -> list[list[int]]:
        clock = itertools.count()
        monkeypatch.setattr(generator.time, "perf_counter", lambda: next(clock) * tick)
        monkeypatch.setattr(gen, "sampled_rule", rule)
        return [
            gen.generate_ids(p, 40, sampling, draft="auto", stop_token_ids=()).token_ids
            for p in PROMPTS[:3]
        ]

    plain = [
        gen.generate_ids(p, 40, sampling, draft="none", stop_token_ids=()).token_ids
        for p in PROMPTS[:3]
    ]
    assert run("coupling", 1e-4) == run("coupling", 5e-2) == plain
    assert run("rejection", 1e-4) != run("rejection", 5e-2)  # the steps drafted decide


@pytest.mark.parametrize("rule", ["rejection", "coupling"])
def test_sampling_distribution_matches_target(d2_bundle, rule, monkeypatch):
    monkeypatch.setattr(d2_bundle.generator, "sampled_rule", rule)
    sample_pair = drafted_pairs(d2_bundle.generator, PROMPTS[0])
    check_two_token_distribution(d2_bundle.target, PROMPTS[0], sample_pair)


def test_the_generator_verifies_sampled_drafts_with_their_q_rows(d2_bundle, monkeypatch):
    """Each sampled draft reaches the rule with the q row it was drawn from (candidates [Kc], q
    summing to 1, the draft among the candidates); a bad rule name is refused by name."""
    import numpy as np

    from dflash_edge.runtime import lattice
    from dflash_edge.runtime.validate import InvalidArgumentError

    seen = []

    def spy(p, draft, dist, params, position):
        seen.append((draft, (dist[0].copy(), dist[1].copy())))  # views: copy
        return lattice.rejected_token(p, draft, dist, params, position)

    monkeypatch.setitem(lattice.RULES, "spy", lattice.Rule(1, spy))
    gen = d2_bundle.generator
    monkeypatch.setattr(gen, "sampled_rule", "spy")
    gen.generate_ids(PROMPTS[1], 24, SAMPLERS[0], draft="drafter", stop_token_ids=())
    assert len(seen) >= 10
    for draft, (cand, q) in seen:
        assert cand.shape == q.shape == (16,) and draft in cand.tolist()
        assert abs(q.sum() - 1) < 1e-9 and q[cand.tolist().index(draft)] > 0
    monkeypatch.setattr(gen, "sampled_rule", "exact")
    with pytest.raises(InvalidArgumentError, match="sampled_rule='exact'"):
        gen.generate_ids(PROMPTS[1], 4, SAMPLERS[0], draft="drafter", stop_token_ids=())
    assert np.isfinite(q).all()


def test_sampled_walk_draws_the_targets_token_when_the_distributions_agree():
    """The coupling's walk (uniform stream 0) shares the target's uniform per position (lattice.py):
    where the selector's q over the candidates equals the target's p, every draw is the target's
    own token."""
    import numpy as np

    from dflash_edge.runtime.lattice import sampled_walk
    from dflash_edge.runtime.sampling import SamplingParams, select_token

    rng = np.random.default_rng(0)
    vocab, top, rows = 50, 16, 5
    for trial in range(40):
        params = SamplingParams(temperature=0.8, seed=trial)
        cand = np.stack([rng.permutation(vocab)[:top] for _ in range(rows)])  # [R, Kc]
        logits = np.full((rows, vocab), -1e9)
        for r in range(rows):
            logits[r, cand[r]] = rng.normal(size=top) * 2
        scores = np.repeat(logits[np.arange(rows)[:, None], cand][:, None], top, axis=1)
        first = 10 + trial
        want = [select_token(logits[r], params, first + r) for r in range(rows)]
        assert sampled_walk(cand, scores, params, first)[0].tolist() == want


def test_identity_conversion_drafts_what_dflash1_drafts_through_the_runtime(
    tiny_bundle, tmp_path, monkeypatch
):
    """DFlash1 -> DFlash2 with a neutral conv and a zero selector, exported: the same drafts at
    every step and the same acceptance lengths on every prompt."""
    from dflash_edge.models.drafter import save_drafter
    from dflash_edge.runtime import Generator

    tb = tiny_bundle("qwen3", 8)
    cfg1 = tb.drafter.config
    cfg2 = DFlash2Config(**{**vars(cfg1), "selector_rank": 4, "conv_group_size": 16})
    save_drafter(from_dflash1(tb.drafter, cfg2), tmp_path / "d2", dtype=torch.float32)
    target_dir = json.loads((tb.path / "manifest.json").read_text())["source"]["target"]
    out = _export(tmp_path, target_dir, tmp_path / "d2")
    gen2 = Generator.load(out)
    drafts1, drafts2 = _recording(tb.generator, monkeypatch), _recording(gen2, monkeypatch)
    for prompt in PROMPTS:
        one = tb.generator.generate_ids(prompt, 40, draft="drafter", stop_token_ids=())
        two = gen2.generate_ids(prompt, 40, draft="drafter", stop_token_ids=())
        assert one.token_ids == two.token_ids
        assert one.stats.acceptance_lengths == two.stats.acceptance_lengths
    assert len(drafts1) == len(drafts2) > 40
    for (ids1, *_, end1), (ids2, *_, end2) in zip(drafts1, drafts2):
        assert end1 == end2 and ids1.tolist() == ids2.tolist()


def _export(root, target_dir, drafter_dir, **opts):
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    from fixtures_bundle import MAX_CONTEXT, PREFILL_CHUNK

    return export_bundle(
        ExportOptions(
            out=root / "bundle",
            target=str(target_dir),
            draft=str(drafter_dir),
            max_context=MAX_CONTEXT,
            prefill_chunk=PREFILL_CHUNK,
            force=True,
            **{"block_size": 8, **opts},
        ),
        progress=False,
    )


def test_the_drafters_trained_block_is_the_default_and_a_larger_one_is_refused(
    d2_bundle, tmp_path, capsys
):
    """A block-8 drafter exports at block 8 when no block is asked for (said on stderr); an explicit
    16 is refused by name."""
    from dflash_edge.runtime.errors import DflashEdgeError

    target_dir, drafter = d2_bundle.path.parent / "target", d2_bundle.path.parent / "drafter"
    out = _export(tmp_path, target_dir, drafter, block_size=None)
    assert json.loads((out / "manifest.json").read_text())["block_size"] == 8
    assert "block size 8, the drafter's trained block" in capsys.readouterr().err
    with pytest.raises(DflashEdgeError, match="--block-size 16 is larger than the drafter"):
        _export(tmp_path / "x", target_dir, drafter, block_size=16)


def test_float16_overflow_is_refused_with_the_layer_named(d2_bundle, tmp_path):
    """A body whose MLP product passes 65,504 (a real DFlash2's trap): NaN turned to 0 further on
    still fails parity, which then names where the inf first appears; nothing is published."""
    from dflash_edge.export.parity import ParityError

    target_dir = d2_bundle.path.parent / "target"
    hot = write_dflash2(tmp_path / "hot", d2_bundle.target.config, scale_mlp=3e3)
    with pytest.raises(
        ParityError, match=r"overflows: .* after the weight layers\.0\.mlp\.up_proj"
    ):
        _export(tmp_path, target_dir, hot, precision="fp16", draft_precision="fp16")
    assert not (tmp_path / "bundle").exists()


def test_int4_drafter_keeps_conv_and_selector_at_8_bits_and_stays_lossless(d2_bundle, tmp_path):
    import onnx

    from dflash_edge.runtime import Generator

    target_dir = d2_bundle.path.parent / "target"
    out = _export(
        tmp_path,
        target_dir,
        d2_bundle.path.parent / "drafter",
        precision="int4",
        draft_precision="int4",
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert ">= 8 bits" in manifest["graphs"]["drafter"]["quantization"]["dflash2"]
    # its own low-bit layers at fp32 activations: the reference's candidates (issue 46)
    assert manifest["graphs"]["drafter"]["quantization"]["settings"]["accuracy_level"] == 0
    assert manifest["source"]["parity"]["drafter.candidate_ids.agreement"] == 1.0
    graph = onnx.load(str(out / "drafter.onnx"), load_external_data=False).graph
    width = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}  # else 8 (int8 / uint8)
    types = {i.name: i.data_type for i in graph.initializer}
    bits = {  # the weight-only layers: DequantizeLinear (standard form) or MatMulNBits (contrib)
        **{
            n.input[0]: width.get(types[n.input[0]], 8)
            for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in types
        },
        **{
            n.input[1]: next(a.i for a in n.attribute if a.name == "bits")
            for n in graph.node
            if n.op_type == "MatMulNBits"
        },
    }
    wide = {k: b for k, b in bits.items() if "_conv." in k or "candidate_selector" in k}
    assert len(wide) == 2 * 2 + 1 and set(wide.values()) == {8}  # 2 layers x 2 convs + selector
    assert 4 in bits.values()  # the body itself is 4-bit
    books = [i for i in graph.initializer if i.name.endswith("_codebook")]
    assert len(books) == 2 and all(i.data_type == onnx.TensorProto.FLOAT for i in books)
    gen = Generator.load(out)
    for prompt in PROMPTS[:2]:  # the int4 target's own tokens
        want = gen.generate_ids(prompt, 40, draft="none", stop_token_ids=())
        got = gen.generate_ids(prompt, 40, draft="drafter", stop_token_ids=())
        assert got.token_ids == want.token_ids


def test_device_plans_count_the_conv_and_selector(d2_folder):
    from dflash_edge.devices.dims import draft_dims_from_config, preset
    from dflash_edge.devices.planner import PlanRequest, draft_step, weight_bytes
    from dflash_edge.devices.profiles import get_profile

    raw = json.loads((d2_folder / "config.json").read_text())
    d2 = draft_dims_from_config(raw)
    d1 = draft_dims_from_config({**raw, "architectures": ["DFlashDraftModel"]})
    # 2 layers x 2 convs x ([2*K*G, H] + [2, K, H]) + the selector projection [rank, H]
    assert d2.wide_params == 2 * 2 * (2 * 2 * 2 * 32 + 2 * 2 * 32) + 8 * 32
    assert d2.codebook_params == 2 * 96 * 8 and d1.wide_params == d1.codebook_params == 0
    target, _, _ = preset("qwen3-8b")
    device = get_profile("jetson-orin-nx-16gb")
    fp32 = [weight_bytes(PlanRequest(target, d, device, "fp32", 512))[1] for d in (d1, d2)]
    assert fp32[1] - fp32[0] == (d2.wide_params + d2.codebook_params) * 4
    # beside an int4 target a GPU drafter is fp16 throughout (planner.default_draft_precision)
    int4 = [weight_bytes(PlanRequest(target, d, device, "int4", 512))[1] for d in (d1, d2)]
    assert int4[1] - int4[0] == (d2.wide_params + d2.codebook_params) * 2
    low = [
        weight_bytes(PlanRequest(target, d, device, "int4", 512, draft_precision="int4"))[1]
        for d in (d1, d2)
    ]
    assert low[1] - low[0] > d2.wide_params + d2.codebook_params * 4  # >= 8-bit projections
    big = {**raw, "hidden_size": 4096, "vocab_size": 151936, "num_hidden_layers": 5}
    big["dflash_config"] = {**raw["dflash_config"], "selector_rank": 256}
    d1, d2 = (
        draft_dims_from_config({**big, "architectures": [arch]})
        for arch in ("DFlashDraftModel", "DFlash2DraftModel")
    )
    steps = [draft_step(PlanRequest(target, d, device, "int4", 512), 8) for d in (d1, d2)]
    assert steps[1]["memory_ms"] > steps[0]["memory_ms"]
    assert steps[1]["compute_ms"] > steps[0]["compute_ms"]


def test_policy_and_tune_take_the_selector_like_any_drafter(d2_bundle, monkeypatch):
    """The selector walk is the bundle's `drafter` proposal source: `auto` may choose it, lookup or
    nothing per step (lossless whatever it picks), and `tune` times its pass + walk."""
    from dflash_edge.runtime import lattice
    from dflash_edge.runtime.calibrate import tune

    gen = d2_bundle.generator
    walks = []
    real = lattice.LatticeDrafter.draft

    def draft(self, last, ctx_end):
        walks.append(ctx_end)
        return real(self, last, ctx_end)

    monkeypatch.setattr(lattice.LatticeDrafter, "draft", draft)
    for prompt in PROMPTS[:2]:
        want = reference(d2_bundle, prompt, 40, stop=())
        got = gen.generate_ids(prompt, 40, draft="auto", stop_token_ids=())
        assert got.token_ids == want.token_ids and got.stats.probe_steps
    assert walks  # the policy's probes ran the selector
    walks.clear()
    tuned = tune(gen, ["t5 t6 t7"], budget_s=3, max_new_tokens=24, context=48)
    assert tuned.draft_ms > 0 and len(tuned.acceptance) == 7 and walks


def test_torch_reference_loop_drafts_what_the_runtime_drafts(d2_bundle):
    """models/reference_loop walks the same lattice: lossless, and the same acceptance per step as
    the bundle's runtime (greedy)."""
    gen = d2_bundle.generator
    for prompt in PROMPTS[:3]:
        want = reference(d2_bundle, prompt, 40, stop=())
        spec = reference(d2_bundle, prompt, 40, stop=(), speculative=True)
        got = gen.generate_ids(prompt, 40, draft="drafter", stop_token_ids=())
        assert spec.token_ids == got.token_ids == want.token_ids
        assert spec.acceptance_lengths == got.stats.acceptance_lengths
