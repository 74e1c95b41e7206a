"""Sliding-window DFlash drafters (issue 26): z-lab's `layer_types` / `sliding_window` honoured end
to end (tier 1).

A z-lab-layout drafter with a sliding layer (window W = 5, far shorter than the prompts) exports
with parity, decodes losslessly, and its runtime drafts equal the torch reference drafter's, whose
full cache is masked per layer while the runtime keeps only the W-1 positions a sliding layer can
see."""

import copy
import json

import pytest
import torch

from dflash_edge.models import load_target
from dflash_edge.models.config import TargetConfig
from dflash_edge.models.drafter import (
    DraftConfig,
    attention_mask,
    load_drafter,
    new_drafter,
    save_drafter,
)
from dflash_edge.models.target import lm_logits
from dflash_edge.runtime import Generator
from dflash_edge.runtime.bundle import BundleError, validate_manifest
from dflash_edge.runtime.errors import ModelFormatError
from dflash_edge.runtime.sampling import SamplingParams

from fixtures_bundle import export_tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WINDOW, BLOCK, CHUNK = 5, 4, 8
LAYER_TYPES = ["sliding_attention", "full_attention"]


def _drafter_dir(tmp_path, target_cfg, layer_types=LAYER_TYPES, window=WINDOW, name="draft"):
    cfg = DraftConfig.for_target(
        target_cfg, num_layers=len(layer_types), block_size=BLOCK, mask_token_id=5
    )
    cfg.layer_types, cfg.sliding_window = list(layer_types), window
    return save_drafter(new_drafter(cfg, seed=7), tmp_path / name, dtype=torch.float32)


def _export(out, ckpt, draft):
    """A bundle of block BLOCK, context 96 and chunk CHUNK (what every test here exports)."""
    return export_tiny(out, ckpt, str(draft), block_size=BLOCK, max_context=96, prefill_chunk=CHUNK)


@pytest.fixture(scope="module")
def windowed(tiny_checkpoints, tmp_path_factory):
    """(bundle dir, torch target, torch drafter, Generator) for a tiny qwen3 target and a W=5
    sliding drafter."""
    root = tmp_path_factory.mktemp("sliding")
    ckpt = tiny_checkpoints["qwen3"][1]
    target = load_target(ckpt)
    draft = _drafter_dir(root, target.config)
    out = _export(root / "bundle", ckpt, draft)
    drafter = load_drafter(draft, target_config=target.config)
    return out, target, drafter, Generator.load(out, threads=1)


def test_zlab_config_round_trips_windows(tiny_checkpoints, tmp_path):
    target = load_target(tiny_checkpoints["qwen3"][1])
    raw = json.loads((_drafter_dir(tmp_path, target.config) / "config.json").read_text())
    assert raw["layer_types"] == LAYER_TYPES and raw["sliding_window"] == WINDOW
    cfg = DraftConfig.from_dict(raw)
    assert cfg.window_layers == [0] and cfg.window(0) == WINDOW and cfg.window(1) is None
    assert cfg.layer_causal(0) and not cfg.layer_causal(1)  # z-lab / vLLM / SGLang defaults
    assert DraftConfig.from_dict({**raw, "is_causal": False}).layer_causal(0) is False


def test_mask_rule_matches_the_documented_semantics():
    """Query at p sees keys p-W < k <= p on a sliding layer (causal), everything on a full one."""
    keys = torch.arange(-2, 10)
    got = attention_mask(torch.tensor([6, 7]), keys, window=3, causal=True).eq(0)
    assert [keys[row].tolist() for row in got] == [[4, 5, 6], [5, 6, 7]]
    assert attention_mask(torch.tensor([6]), torch.arange(8), window=None, causal=False) is None
    got = attention_mask(torch.tensor([6]), keys, window=None, causal=False).eq(0)[
        0
    ]  # empty rows (k < 0) hidden
    assert keys[got].tolist() == list(range(10))


def test_export_parity_and_manifest(windowed):
    out, *_ = windowed
    m = json.loads((out / "manifest.json").read_text())
    assert (
        m["model"]["draft_layer_types"] == LAYER_TYPES
        and m["model"]["draft_sliding_window"] == WINDOW
    )
    io = m["graphs"]["drafter"]["io"]
    assert [t["name"] for t in io["inputs"]][-2:] == ["window_key", "window_value"]
    assert io["inputs"][-1]["shape"] == ["Wm1", "Lw", "Hkv", "D"]
    parity = m["source"]["parity"]
    assert parity["drafter.draft_ids.agreement"] == 1.0
    assert (
        parity["drafter.new_window_key.max_abs_diff"]
        <= 1e-4 * parity["drafter.new_window_key.max_abs"]
    )


def test_runtime_is_lossless_past_the_window(windowed):
    *_, gen = windowed
    prompt = [(11 * i + 3) % 90 + 6 for i in range(37)]  # 37 tokens >> W
    plain = gen.generate_ids(prompt, 30, draft="none").token_ids
    drafted = gen.generate_ids(prompt, 30, draft="drafter")
    assert drafted.token_ids == plain and len(plain) == 30
    assert drafted.stats.draft_calls > 0


def _torch_drafts(target, drafter, cache, last, feats):
    with torch.no_grad():
        ids = torch.tensor([[last] + [5] * (BLOCK - 1)])
        hidden = drafter(target.model.embed_tokens(ids), torch.from_numpy(feats.copy()), cache)
        return lm_logits(target.lm_head, hidden[:, 1:]).argmax(-1)[0].tolist()


def test_runtime_drafts_equal_torch_reference_and_window_memory_is_bounded(windowed):
    """The runtime's drafter (window cache of W-1 rows, slid as the context grows) drafts what the
    torch reference drafts with its whole context cached and masked; the window actually changes the
    drafts' hidden states (the mask is not a no-op)."""
    _, target, drafter, gen = windowed
    ids = [(7 * i + 2) % 90 + 6 for i in range(29)]
    gen._prefill(ids, SamplingParams(), reuse=False)  # features of positions 0..28
    feats = gen.target.hidden.array  # [capacity, N]
    unwindowed = copy.deepcopy(drafter)  # same weights, every layer full
    unwindowed.config.layer_types = ["full_attention"] * len(LAYER_TYPES)
    cache, other = drafter.new_cache(128), unwindowed.new_cache(128)
    got = gen.drafter.draft(ids[-1], ctx_end=len(ids)).tolist()  # 29 rows in pieces of 8: slides
    assert got == _torch_drafts(target, drafter, cache, ids[-1], feats[None, : len(ids)])
    differs = got != _torch_drafts(target, unwindowed, other, ids[-1], feats[None, : len(ids)])
    for extra in ([9, 17, 30], [44], [12, 13]):  # later steps: a few new rows each
        start = gen.target.kv.pos
        step = gen.target.step(len(extra))
        step["input_ids"][0] = extra
        gen.target.forward(len(extra), start)
        gen.target.kv.pos = start + len(extra)
        end = gen.target.kv.pos
        got = gen.drafter.draft(extra[-1], ctx_end=end).tolist()
        assert got == _torch_drafts(target, drafter, cache, extra[-1], feats[None, start:end])
        differs |= got != _torch_drafts(
            target, unwindowed, other, extra[-1], feats[None, start:end]
        )
    assert differs  # the window decided some draft
    win = gen.drafter.kv.window
    assert (
        win.key.rows == (WINDOW - 1) + CHUNK and win.key.row_shape[0] == 1
    )  # 1 sliding layer, W-1 + C rows
    assert gen.drafter.kv.key.row_shape[0] == 1  # the full layer keeps it all


def test_drafter_whose_layers_all_slide(tiny_checkpoints, tmp_path):
    """Every layer sliding: no full-layer cache at all (no past_key input), still parity-checked and
    lossless."""
    ckpt = tiny_checkpoints["qwen3"][1]
    draft = _drafter_dir(tmp_path, load_target(ckpt).config, ["sliding_attention"], name="all")
    out = _export(tmp_path / "b", ckpt, draft)
    m = json.loads((out / "manifest.json").read_text())
    assert [t["name"] for t in m["graphs"]["drafter"]["io"]["inputs"]] == [
        "block_ids",
        "ctx_hidden",
        "start",
        "window_key",
        "window_value",
    ]
    assert m["source"]["parity"]["drafter.draft_ids.agreement"] == 1.0
    gen = Generator.load(out, threads=1)
    prompt = [(5 * i + 1) % 90 + 6 for i in range(23)]
    plain = gen.generate_ids(prompt, 20, draft="none").token_ids
    assert gen.generate_ids(prompt, 20, draft="drafter").token_ids == plain
    assert gen.drafter.kv.nbytes == gen.drafter.kv.window.nbytes  # nothing grows with the context


def test_window_changes_the_reference(tiny_checkpoints, tmp_path):
    target = load_target(tiny_checkpoints["qwen3"][1])
    slid = load_drafter(_drafter_dir(tmp_path, target.config), target.config)
    full = load_drafter(
        _drafter_dir(tmp_path, target.config, ["full_attention"] * 2, None, "full"), target.config
    )
    g = torch.Generator().manual_seed(0)
    ctx = torch.randn(
        1, 20, len(slid.config.target_layer_ids) * target.config.hidden_size, generator=g
    )
    block = torch.randn(1, BLOCK, target.config.hidden_size, generator=g)
    with torch.no_grad():
        a, b = slid(block, ctx, slid.new_cache(32)), full(block, ctx, full.new_cache(32))
    assert not torch.allclose(a, b, atol=1e-4)  # the same weights (same seed), windowed or not


def test_bad_windows_are_named(tiny_checkpoints, tmp_path):
    ckpt = tiny_checkpoints["qwen3"][1]
    target = load_target(ckpt)
    raw = json.loads((_drafter_dir(tmp_path, target.config) / "config.json").read_text())
    with pytest.raises(ModelFormatError, match=r"unknown layer type\(s\) \['chunked_attention'\]"):
        DraftConfig.from_dict({**raw, "layer_types": ["chunked_attention", "full_attention"]})
    with pytest.raises(ModelFormatError, match="sliding_window=None"):
        DraftConfig.from_dict({**raw, "sliding_window": None})
    with pytest.raises(ModelFormatError, match="use_swa"):
        DraftConfig.from_dict({**raw, "dflash_config": {**raw["dflash_config"], "use_swa": True}})
    with pytest.raises(ModelFormatError, match="sliding_attention"):  # targets still refuse windows
        TargetConfig.from_dict(
            {**json.loads((tmp_path / "draft" / "config.json").read_text()), "model_type": "qwen3"}
        )
    big = _drafter_dir(tmp_path, target.config, window=200, name="big")
    with pytest.raises(
        ModelFormatError,
        match=r"sliding_window=200 is larger than the bundle's context "
        r"\(--max-context 96\)",
    ):
        _export(tmp_path / "b", ckpt, big)


def test_manifest_window_is_checked(windowed):
    out, *_ = windowed
    m = json.loads((out / "manifest.json").read_text())
    m.pop("checksum")
    validate_manifest(m)
    m["model"]["draft_sliding_window"] = m["max_context"] + 1
    with pytest.raises(BundleError, match="draft_sliding_window"):
        validate_manifest(m)
    m["model"]["draft_layer_types"] = ["sliding_attention"]
    with pytest.raises(BundleError, match="draft_layer_types"):
        validate_manifest(m)


@pytest.mark.parametrize("at", [3, 30, 60])  # before the window (a reset), inside it, a new turn
def test_a_kept_window_drafts_as_a_cold_one(windowed, at):
    """Issue 45: after a sequence, a request sharing its first `at` ids rewinds the drafter (a
    window that no longer holds the W-1 rows before `at` starts over): the drafts, so the accepts,
    are a cold run's."""
    out, *_, gen = windowed
    cold = Generator.load(out, threads=1)
    prompt = [(11 * i + 3) % 90 + 6 for i in range(37)]
    first = gen.generate_ids(prompt, 30, draft="drafter")
    ids = (prompt + first.token_ids)[:at] + [9, 8, 7]
    warm = gen.generate_ids(ids, 20, draft="drafter")
    want = cold.generate_ids(ids, 20, draft="drafter", cache_prompt=False)
    assert warm.stats.cached_tokens == at
    assert warm.token_ids == want.token_ids
    assert warm.stats.acceptance_lengths == want.stats.acceptance_lengths
