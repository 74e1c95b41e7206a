"""Qwen3.5 hybrid targets (issue 26): our torch reference (models/linear_attention.py) against
transformers' own Qwen3.5 on tiny random checkpoints in the published layouts; rollback of the
recurrent state (tier 1)."""

import json

import pytest
import torch

from dflash_edge.models.config import TargetConfig
from dflash_edge.models.families.qwen3_5 import HybridConfig, tensors
from dflash_edge.models.linear_attention import (
    HybridModel,
    delta_rule_chunked,
    delta_rule_steps,
    load_hybrid,
    rollback,
)
from dflash_edge.runtime.errors import ModelFormatError

from tiny import LINEAR_HEADS, SMALL

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = dict(
    vocab_size=96,
    **SMALL,
    linear_conv_kernel_dim=4,
    **LINEAR_HEADS,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=32,
    patch_size=4,
    num_position_embeddings=16,
)


def _randomise(model):
    """transformers zero-/one-inits norms and the delta-rule gates: randomise them so every weight
    matters."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                continue
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                p.add_(torch.randn_like(p) * 0.3)
            elif p.dim() >= 2:
                p.normal_(0, 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """layout -> (transformers model, checkpoint dir): the image-text layout and the text-only
    one."""
    import transformers

    root = tmp_path_factory.mktemp("qwen3_5")
    torch.manual_seed(0)
    multi = _randomise(
        transformers.Qwen3_5ForConditionalGeneration(
            transformers.Qwen3_5Config(text_config=TEXT, vision_config=VISION)
        )
    )
    text = _randomise(transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**TEXT)))
    out = {}
    for name, model in (("qwen3_5", multi), ("qwen3_5_text", text)):
        model.save_pretrained(root / name)
        out[name] = (model, root / name)
    return out


def _hf_logits(model, ids, cache=None):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=cache is not None)
    return out.logits[0]


@pytest.mark.parametrize("layout", ["qwen3_5", "qwen3_5_text"])
def test_config_and_names_follow_the_published_layout(published, layout):
    model, path = published[layout]
    cfg = TargetConfig.from_json(path)
    assert isinstance(cfg, HybridConfig) and cfg.model_type == "qwen3_5"
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] and cfg.rotary_dim == 8
    prefix = "model.language_model" if layout == "qwen3_5" else "model"
    assert cfg.weight_prefix == prefix
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items() if "visual" not in k}
    assert tensors(cfg) == theirs


@pytest.mark.parametrize("layout", ["qwen3_5", "qwen3_5_text"])
def test_prefill_logits_equal_transformers(published, layout):
    model, path = published[layout]
    ours = load_hybrid(path)
    ids = [(13 * i + 5) % 96 for i in range(70)]  # > one 64-token chunk of the delta rule
    with torch.no_grad():
        logits, _, _ = ours.step(torch.tensor(ids), ours.new_state())
    torch.testing.assert_close(logits, _hf_logits(model, ids), atol=2e-4, rtol=1e-4)


def test_token_by_token_decode_with_state_equals_transformers(published):
    from transformers import DynamicCache

    model, path = published["qwen3_5"]
    ours = load_hybrid(path)
    ids = [(7 * i + 3) % 96 for i in range(9)]
    cache = DynamicCache(config=model.config.text_config)
    want = [_hf_logits(model, ids[:5], cache)[-1]] + [
        _hf_logits(model, [t], cache)[-1] for t in ids[5:]
    ]
    with torch.no_grad():
        logits, state, _ = ours.step(torch.tensor(ids[:5]), ours.new_state())  # chunked prefill
        got = [logits[-1]]
        for t in ids[5:]:  # decode, state carried
            logits, state, _ = ours.step(torch.tensor([t]), state, per_position=True)
            got.append(logits[-1])
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=2e-4, rtol=1e-4)
    assert (
        state.length == len(ids)
        and state.rec[0].shape == (4, 8, 8)
        and state.conv[0].shape == (64, 3)
    )


def test_chunked_delta_rule_equals_token_by_token(monkeypatch):
    g = torch.Generator().manual_seed(3)
    t, h, dk, dv = 21, 3, 5, 4
    q, k = (
        torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g), dim=-1) for _ in range(2)
    )
    v = torch.randn(t, h, dv, generator=g)
    decay, beta = -torch.rand(t, h, generator=g), torch.rand(t, h, generator=g)
    state = torch.randn(h, dk, dv, generator=g)
    steps, states = delta_rule_steps(q, k, v, decay, beta, state)
    from dflash_edge.models import linear_attention

    monkeypatch.setattr(linear_attention, "CHUNK", 8)  # 3 chunks, the last short
    chunked, last = delta_rule_chunked(q, k, v, decay, beta, state)
    torch.testing.assert_close(chunked, steps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, states[-1], atol=1e-5, rtol=1e-5)


def test_rollback_after_a_verify_equals_re_running(published):
    """A verify of k tokens keeps per-position states; the state after a+1 of them is read back, not
    recomputed, and equals running only those a+1 tokens (then the next step's logits agree too)."""
    _, path = published["qwen3_5"]
    ours = load_hybrid(path)
    prompt, block = [4, 9, 33, 71, 2, 15], [50, 8, 61, 23, 40]
    with torch.no_grad():
        _, before, _ = ours.step(torch.tensor(prompt), ours.new_state())
        _, after, trail = ours.step(torch.tensor(block), before, per_position=True)
        for kept in (1, 3, 5):
            restored = rollback(after, trail, kept)
            _, rerun, _ = ours.step(torch.tensor(block[:kept]), before)
            assert restored.length == rerun.length == len(prompt) + kept
            for mine, theirs in zip(
                restored.rec + restored.conv + restored.keys, rerun.rec + rerun.conv + rerun.keys
            ):
                if mine is not None:
                    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
            nxt = torch.tensor([77])
            torch.testing.assert_close(
                ours.step(nxt, restored)[0], ours.step(nxt, rerun)[0], atol=1e-5, rtol=1e-5
            )
        with pytest.raises(ValueError, match="keeps 1..5"):
            rollback(after, trail, 6)


def test_bad_hybrid_configs_are_named(published):
    raw = json.loads((published["qwen3_5"][1] / "config.json").read_text())
    text = raw["text_config"]
    with pytest.raises(
        ModelFormatError,
        match=r"linear_num_value_heads=5 is not a multiple of linear_num_key_heads=2",
    ):
        HybridConfig.from_dict({**raw, "text_config": {**text, "linear_num_value_heads": 5}})
    with pytest.raises(ModelFormatError, match=r"unknown layer type\(s\) \['mamba'\]"):
        HybridConfig.from_dict({**raw, "text_config": {**text, "layer_types": ["mamba"] * 4}})
    with pytest.raises(ModelFormatError, match="lacks its text_config"):
        TargetConfig.from_dict({"model_type": "qwen3_5"})
    assert HybridModel(HybridConfig.from_dict(raw)).new_state().keys[:3] == [None] * 3


class _HybridGraph:
    """export/hybrid_target.py's graph in onnxruntime, with the carry a runtime would keep between
    calls."""

    def __init__(self, cfg, path, tmp_path, capture=(1,)):
        import numpy as np
        import onnxruntime as ort

        from dflash_edge.export.hybrid_target import build_hybrid_target
        from dflash_edge.export.target_job import TargetJob
        from dflash_edge.export.weight_store import WeightStore
        from dflash_edge.models.checkpoint import Checkpoint

        job = TargetJob(cfg, Checkpoint.open(path), capture, WeightStore(tmp_path))
        onnx_path = build_hybrid_target(job, tmp_path / "h.onnx")
        self.session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        lin, hv, dk, dv = (
            len(cfg.linear_layers),
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
        )
        kv = np.zeros(
            (0, cfg.num_hidden_layers - lin, cfg.num_key_value_heads, cfg.head_dim), np.float32
        )
        self.feeds = {
            "past_key": kv,
            "past_value": kv,
            "kept": np.array([0], np.int64),
            "conv_base": np.zeros((lin, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1), np.float32),
            "rec_base": np.zeros((lin, hv, dk, dv), np.float32),
            "prev_qkv": np.zeros((0, lin, cfg.conv_dim), np.float32),
            "prev_k": np.zeros((0, lin, hv, dk), np.float32),
            "prev_u": np.zeros((0, lin, hv, dv), np.float32),
            "prev_decay": np.zeros((0, lin, hv), np.float32),
        }
        self.length, self.last = 0, 0

    def run(self, ids, kept=None):
        """Run `ids` after keeping `kept` of the previous call's tokens (default: all of them)."""
        import numpy as np

        from dflash_edge.export.parity import next_hybrid_feeds

        kept = self.last if kept is None else kept
        start = self.length - self.last + kept  # K/V rows after the kept tokens
        f = {
            **self.feeds,
            "kept": np.array([kept], np.int64),
            "past_key": self.feeds["past_key"][:start],
            "past_value": self.feeds["past_value"][:start],
        }
        out = dict(
            zip(
                self.names,
                self.session.run(
                    None,
                    {
                        "input_ids": np.array([ids], np.int64),
                        "logits_from": np.array([0], np.int64),
                        "start": np.array([start], np.int64),
                        **f,
                    },
                ),
            )
        )
        self.feeds = next_hybrid_feeds(f, out)
        self.length, self.last = start + len(ids), len(ids)
        return out


def test_hybrid_target_graph_equals_the_reference(published, tmp_path):
    """export/hybrid_target.py (standard ops) in onnxruntime against HybridModel.step: a prefill, a
    verify of 5 tokens, then a call keeping 2 of them: the graph's rebuilt starting states equal the
    reference's states after exactly those tokens, and every call's logits equal the reference's
    from the same state."""
    import numpy as np

    _, path = published["qwen3_5"]
    cfg = TargetConfig.from_json(path)
    ours = load_hybrid(path, cfg)
    graph = _HybridGraph(cfg, path, tmp_path)
    lin = cfg.linear_layers
    with torch.no_grad():
        prompt, block = [4, 9, 33, 71, 2, 15, 60], [50, 8, 61, 23, 40]
        want, before, _ = ours.step(torch.tensor(prompt), ours.new_state())
        np.testing.assert_allclose(
            graph.run(prompt)["logits"][0], want.numpy(), atol=1e-4, rtol=1e-4
        )
        want, after, trail = ours.step(torch.tensor(block), before, per_position=True)
        out = graph.run(block)
        np.testing.assert_allclose(out["logits"][0], want.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(
            out["rec_start"], torch.stack([before.rec[i] for i in lin]).numpy(), atol=1e-5
        )
        kept = rollback(after, trail, 2)  # accept 1 draft + the bonus row
        want, _, _ = ours.step(torch.tensor([77, 5]), kept)
        out = graph.run([77, 5], kept=2)
        np.testing.assert_allclose(
            out["rec_start"], torch.stack([kept.rec[i] for i in lin]).numpy(), atol=1e-5
        )
        np.testing.assert_allclose(
            out["conv_start"], torch.stack([kept.conv[i] for i in lin]).numpy(), atol=2e-5
        )
        np.testing.assert_allclose(out["logits"][0], want.numpy(), atol=1e-4, rtol=1e-4)


def test_greedy_tokens_equal_transformers_generate(published, tmp_path):
    """~300-token prompt: transformers' own greedy tokens from our torch reference (chunked prefill,
    then token by token with the states carried) and from the exported hybrid graph (verify-shaped
    calls of 1 token)."""
    model, path = published["qwen3_5"]
    prompt = [(31 * i + 7) % 96 for i in range(300)]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[
            0, 300:
        ].tolist()
    ours = load_hybrid(path)
    got, state = [], ours.new_state()
    ids = torch.tensor(prompt)
    with torch.no_grad():
        for _ in range(12):
            logits, state, _ = ours.step(ids, state)
            got.append(int(logits[-1].argmax()))
            ids = torch.tensor(got[-1:])
    assert got == want
    graph = _HybridGraph(ours.config, path, tmp_path)
    for i in range(0, 300, 60):  # 60-token prefill chunks, then decode
        out = graph.run(prompt[i : i + 60])
    tokens = [int(out["next_ids"][0, -1])]
    for _ in range(11):
        tokens.append(int(graph.run(tokens[-1:])["next_ids"][0, -1]))
    assert tokens == want


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_text"])
def hybrid_bundle(published, tmp_path_factory, request):
    """(transformers model, Generator): a published layout exported (target_hybrid + a random
    2-layer drafter, block 4, prefill chunks of 8) and loaded by the runtime."""
    import shutil

    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter
    from dflash_edge.runtime import Generator

    from tiny import add_tiny_tokenizer

    model, path = published[request.param]
    root = tmp_path_factory.mktemp(f"bundle-{request.param}")
    ckpt = root / "target"
    shutil.copytree(path, ckpt)
    add_tiny_tokenizer(ckpt)
    cfg = DraftConfig.for_target(
        TargetConfig.from_json(ckpt).dense_view(), num_layers=2, block_size=4, mask_token_id=5
    )
    save_drafter(new_drafter(cfg, seed=4), root / "drafter")
    out = export_bundle(
        ExportOptions(
            out=root / "bundle",
            target=str(ckpt),
            draft=str(root / "drafter"),
            block_size=4,
            max_context=400,
            prefill_chunk=8,
            force=True,
        ),
        progress=False,
    )
    return model, Generator.load(out)


@pytest.mark.parametrize("length", [5, 300])
def test_generator_on_a_hybrid_bundle_gives_transformers_greedy_tokens(
    hybrid_bundle, length, oracle
):
    """Exported and run by the runtime: transformers' own greedy tokens, decoding plainly, drafting
    every step (the random drafter's misses: the recurrent state rolls back to the bonus token) and
    with drafts that are right at random (partial accepts of 1-3 tokens). Prompts of 5 (one short
    chunk) and 300 tokens (37 chunks + a short one: no position runs twice)."""
    model, gen = hybrid_bundle
    assert gen.target_graph == "target_hybrid"
    assert set(gen.bundle.manifest["graphs"]) == {"target_hybrid", "drafter"}
    assert gen.bundle.model["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    prompt = [(31 * i + 7) % 96 for i in range(length)]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[
            0, length:
        ].tolist()
    for draft in ("none", "drafter"):
        assert (
            gen.generate_ids(
                prompt, 24, draft=draft, verify_len=3 if draft != "none" else None
            ).token_ids
            == want
        )
    oracle(gen, prompt + want, 0.6, seed=length)
    res = gen.generate_ids(prompt, 24, draft="drafter", verify_len=3)
    assert res.token_ids == want
    assert 1.5 < res.stats.mean_acceptance_length < 4  # partial accepts, not all-or-nothing
    sampled = gen.generate_ids(prompt, 24, draft="none", temperature=0.9, seed=7).token_ids
    oracle(gen, prompt + sampled, 0.6, seed=length + 1)  # sampling: each token keyed by position
    res = gen.generate_ids(prompt, 24, draft="drafter", verify_len=3, temperature=0.9, seed=7)
    assert res.token_ids == sampled and res.stats.mean_acceptance_length > 1.5
    for bad in (0, 99):  # more than the last call ran, or none of it
        with pytest.raises(
            ValueError, match=rf"keep\({bad}\): the last call ran \d+ tokens; keep 1\.\.\d+"
        ):
            gen.target.keep(bad)


def test_hybrid_export_refuses_what_its_graph_cannot_carry():
    from types import SimpleNamespace

    from dflash_edge.export.hybrid_target import MAX_TOKENS, check_options
    from dflash_edge.runtime.errors import DflashEdgeError

    ok = SimpleNamespace(prefill_chunk=MAX_TOKENS, block_size=16, precision="fp32")
    check_options(ok)
    with pytest.raises(DflashEdgeError, match=r"--prefill-chunk 65: .* at most 64 tokens.*<= 64"):
        check_options(SimpleNamespace(**{**vars(ok), "prefill_chunk": 65}))
    check_options(SimpleNamespace(**{**vars(ok), "precision": "int4"}))
    with pytest.raises(DflashEdgeError, match=r"--precision fp16: .*fp32, int8 or int4"):
        check_options(SimpleNamespace(**{**vars(ok), "precision": "fp16"}))


def test_int4_hybrid_bundle_is_lossless(published, tmp_path, oracle):
    """The hybrid target written at int4 as its weights are read (export/weight_format.py:
    projections, the shared embedding / head in blocks): drafting, with partial accepts through the
    recurrent state, changes no token of its own plain decoding."""
    import shutil

    from dflash_edge.cli import main
    from dflash_edge.runtime import Generator

    from fixtures_bundle import export_args
    from tiny import add_tiny_tokenizer

    ckpt = tmp_path / "target"
    shutil.copytree(published["qwen3_5"][1], ckpt)
    add_tiny_tokenizer(ckpt)
    out = (
        tmp_path / "b"
    )  # the CLI: --kv-cache auto asks int8 of an int4 target, which a hybrid lacks
    assert main(export_args(out, ckpt, "random", "--precision", "int4", context=400, chunk=8)) == 0
    entry = json.loads((out / "manifest.json").read_text())["graphs"]["target_hybrid"]
    assert entry["precision"] == "int4" and entry["quantization"]["weights_by_source"]["rtn"] > 0
    gen = Generator.load(out)
    prompt = [(31 * i + 7) % 96 for i in range(40)]
    plain = gen.generate_ids(prompt, 24, draft="none").token_ids
    oracle(gen, prompt + plain, 0.6, seed=3)
    res = gen.generate_ids(prompt, 24, draft="drafter", verify_len=3)
    assert res.token_ids == plain and res.stats.mean_acceptance_length > 1.5


def test_hybrid_target_is_parity_checked_at_export(published, tmp_path, monkeypatch):
    """Export compares target_hybrid (and the drafter on its features) with models/
    linear_attention.py on the weights as stored: int4 blocks with fp32 activations hold the fp32
    bounds; a broken graph fails."""
    import shutil

    from dflash_edge.export import parity
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    from tiny import add_tiny_tokenizer

    ckpt = tmp_path / "target"
    shutil.copytree(published["qwen3_5"][1], ckpt)
    add_tiny_tokenizer(ckpt)
    opts = ExportOptions(
        out=tmp_path / "b",
        target=str(ckpt),
        draft="random",
        block_size=4,
        max_context=400,
        prefill_chunk=8,
        precision="int4",
        accuracy_level=0,
    )
    out = export_bundle(opts, progress=False)
    report = json.loads((out / "manifest.json").read_text())["source"]["parity"]
    assert report["target_hybrid.logits.max_abs_diff"] <= 1e-3
    assert "drafter.new_key.max_abs_diff" in report
    run = parity.run_hybrid

    def broken(session, probe):
        inputs, got, features, last = run(session, probe)
        got["target_hybrid"][1] = (got["target_hybrid"][1][0] + 1.0, *got["target_hybrid"][1][1:])
        return inputs, got, features, last

    monkeypatch.setattr(parity, "run_hybrid", broken)
    with pytest.raises(parity.ParityError, match="'target_hybrid' output 'logits'"):
        export_bundle(ExportOptions(**{**vars(opts), "out": tmp_path / "c"}), progress=False)


def test_a_hybrid_target_resumes_a_conversation_losslessly(hybrid_bundle):
    """The recurrent state is kept when the next prompt extends the whole cached sequence (a chat
    turn); an edited prompt resumes from the nearest prefill chunk's snapshot (chunks of 8, the
    newest 8 kept), or from 0 where none holds. Either way the tokens are a cold run's."""
    _, gen = hybrid_bundle

    def warm_equals_cold(prompt, **opts):
        warm = gen.generate_ids(prompt, 10, stop_token_ids=(), draft="drafter", **opts)
        cold = gen.generate_ids(
            prompt, 10, stop_token_ids=(), draft="drafter", cache_prompt=False, **opts
        )
        assert warm.token_ids == cold.token_ids
        gen.generate_ids(prompt, 10, stop_token_ids=(), draft="drafter", **opts)  # cached again
        return warm.stats.cached_tokens

    ids = [1 + (5 * i) % 40 for i in range(30)]
    first = gen.generate_ids(ids, 10, stop_token_ids=(), draft="drafter")
    turn = ids + first.token_ids + [7, 8, 9]
    assert warm_equals_cold(turn) >= len(ids)
    assert warm_equals_cold(turn[:12] + [3] + turn[13:]) == 12  # the chunk at 8's snapshot
    long = [1 + (3 * i) % 37 for i in range(100)]
    assert warm_equals_cold(long, temperature=0.8, seed=2) <= 1  # both start with token 1
    # an edit at 90: from the chunk at 88; at 5 (older than the newest 8 chunks): from 0
    assert warm_equals_cold(long[:90] + [2] + long[91:]) == 90
    assert warm_equals_cold(long[:5] + [2] + long[6:]) == 0
    assert gen.target.max_snapshots == 8 and len(gen.target.snapshots) <= 8


def test_hybrid_prefill_chunks_compute_the_last_row_as_one_full_step(hybrid_bundle):
    from test_prompt_cache import prefill_equals_one_full_step

    _, gen = hybrid_bundle
    # one step holds at most the state's 8 per-token rows: 8 ids in chunks of 3 + 3 + 2
    prefill_equals_one_full_step(gen.target, [1 + (5 * i) % 40 for i in range(8)], 3)


def test_alternating_conversations_on_a_hybrid_target(hybrid_bundle):
    """A hybrid's recurrent state goes to the prompt cache with its KV rows: each of two
    alternating conversations resumes its own, and decodes as a cold run."""
    _, gen = hybrid_bundle
    gen.keep_prompts(64)
    try:
        talks = [[1 + (5 * i) % 40 for i in range(30)], [2 + (7 * i) % 41 for i in range(26)]]
        for turn in range(2):
            for i, ids in enumerate(talks):
                warm = gen.generate_ids(ids, 8, stop_token_ids=(), draft="drafter")
                cold = gen.generate_ids(
                    ids, 8, stop_token_ids=(), draft="drafter", cache_prompt=False
                )
                assert warm.token_ids == cold.token_ids
                assert warm.stats.cached_tokens >= (len(ids) - 12 if turn else 0)
                talks[i] = ids + warm.token_ids + [7, 8 + turn]
                gen.generate_ids(talks[i][:-2], 1, stop_token_ids=(), draft="none")
    finally:
        gen.keep_prompts(0)
