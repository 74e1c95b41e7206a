"""DFlash drafter: z-lab format round trip, context caching, fit checks (tier 1)."""

import json

import pytest
import torch

from dflash_edge.models.drafter import (
    DraftConfig,
    default_target_layer_ids,
    load_drafter,
    new_drafter,
    save_drafter,
)
from dflash_edge.runtime.errors import ModelFormatError

ZLAB_KEYS = {
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "vocab_size",
    "attention_bias",
    "layer_types",
    "sliding_window",
    "block_size",
    "num_target_layers",
    "dflash_config",
}


@pytest.fixture
def drafter(tiny_target):
    return new_drafter(
        DraftConfig.for_target(tiny_target.config, num_layers=2, block_size=8, mask_token_id=5),
        seed=3,
    )


def test_default_layer_ids_follow_zlab_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B's published drafter
    assert default_target_layer_ids(30, 1) == [15]
    assert default_target_layer_ids(30, 3) == [1, 14, 27]


def _run(model, seed=0, ctx_len=6):
    g = torch.Generator().manual_seed(seed)
    h = model.config.hidden_size
    block = torch.randn(1, model.config.block_size, h, generator=g)
    ctx = torch.randn(1, ctx_len, len(model.config.target_layer_ids) * h, generator=g)
    with torch.no_grad():
        return model(block, ctx, model.new_cache(32))


def test_save_load_round_trip_is_identical(drafter, tiny_target, tmp_path):
    path = save_drafter(drafter, tmp_path / "draft", dtype=torch.float32)
    cfg = json.loads((path / "config.json").read_text())
    assert ZLAB_KEYS <= set(cfg) and cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [1, 3]}
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "layers.1.self_attn.k_norm.weight",
        "layers.0.mlp.down_proj.weight",
    } <= names
    loaded = load_drafter(path, target_config=tiny_target.config)
    assert torch.equal(_run(drafter), _run(loaded))


def test_context_cache_equals_single_pass(drafter):
    """Feeding context in pieces through the cache gives the block the same view as feeding it at
    once."""
    h = drafter.config.hidden_size * 2
    g = torch.Generator().manual_seed(4)
    ctx, block = (
        torch.randn(1, 9, h, generator=g),
        torch.randn(1, 8, drafter.config.hidden_size, generator=g),
    )
    with torch.no_grad():
        once = drafter(block, ctx, drafter.new_cache(32))
        cache = drafter.new_cache(32)
        drafter(block, ctx[:, :4], cache)  # the block's own K/V must not stay in the cache
        pieces = drafter(block, ctx[:, 4:], cache)
    assert cache.length == 9
    assert torch.allclose(once, pieces, atol=1e-5)


def test_block_attention_is_not_causal(drafter):
    """Changing the last block position changes the first one's output (bidirectional)."""
    g = torch.Generator().manual_seed(5)
    ctx = torch.randn(1, 3, drafter.config.hidden_size * 2, generator=g)
    block = torch.randn(1, 8, drafter.config.hidden_size, generator=g)
    other = block.clone()
    other[:, -1] += 1.0
    with torch.no_grad():
        a = drafter(block, ctx, drafter.new_cache(16))
        b = drafter(other, ctx, drafter.new_cache(16))
    assert not torch.allclose(a[:, 0], b[:, 0])


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("hidden_size", 48, "drafter hidden_size=48 does not fit the target's 32"),
        ("vocab_size", 100, "drafter vocab_size=100 does not fit the target's 96"),
        ("num_target_layers", 12, "drafter num_target_layers=12 does not fit the target's 6"),
        (
            "target_layer_ids",
            [1, 6],
            r"target_layer_ids \[1, 6\] out of range for a 6-layer target",
        ),
        ("mask_token_id", 96, "mask_token_id 96 is outside the vocabulary"),
    ],
)
def test_mismatched_drafter_is_refused(drafter, tiny_target, tmp_path, field, value, message):
    path = save_drafter(drafter, tmp_path / "draft")
    cfg = json.loads((path / "config.json").read_text())
    if field in ("mask_token_id", "target_layer_ids"):
        cfg["dflash_config"][field] = value
    else:
        cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match=message):
        load_drafter(path, target_config=tiny_target.config)


def test_target_config_is_not_a_drafter(tiny_checkpoints):
    with pytest.raises(ModelFormatError, match="is not a DFlash drafter"):
        load_drafter(tiny_checkpoints["qwen3"][1])


def test_drafter_weights_must_match(drafter, tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_drafter(drafter, tmp_path / "draft")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"][:, :10].contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ModelFormatError, match=r"fc.weight: file \(32, 10\) vs model \(32, 64\)"):
        load_drafter(path)
