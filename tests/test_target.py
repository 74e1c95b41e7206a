"""Reference targets vs transformers, cache behaviour, and bad checkpoints (tier 1)."""

import json
import shutil

import pytest
import torch

from dflash_edge.models import load_target
from dflash_edge.models.families import available
from dflash_edge.runtime.errors import ContextOverflowError, CorruptFileError, ModelFormatError

from tiny import FAMILY_EXTRAS


@pytest.mark.parametrize("variant", list(FAMILY_EXTRAS))
def test_logits_and_hidden_match_transformers(tiny_checkpoints, variant):
    hf, path = tiny_checkpoints[variant]
    ours = load_target(path)
    ids = torch.randint(
        0, hf.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        out = ours(ids, ours.new_cache(64), capture=(0, 3))
    assert (ref.logits - out.logits).abs().max().item() <= 1e-3
    want = torch.cat(
        [ref.hidden_states[1], ref.hidden_states[4]], dim=-1
    )  # HF index = layer id + 1
    assert (want - out.hidden).abs().max().item() <= 1e-3


def test_chunked_cache_equals_one_pass(tiny_target):
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = tiny_target(ids, tiny_target.new_cache(40)).logits
        cache = tiny_target.new_cache(40)
        parts = [tiny_target(ids[:, a:b], cache).logits for a, b in ((0, 11), (11, 12), (12, 30))]
    assert cache.length == 30
    assert torch.allclose(full, torch.cat(parts, dim=1), atol=1e-5)


def test_rollback_is_a_pointer_move(tiny_target):
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(3))
    cache = tiny_target.new_cache(32)
    buffer = cache.k.data_ptr()
    with torch.no_grad():
        tiny_target(ids[:, :10], cache)
        tiny_target(torch.randint(0, 96, (1, 8)), cache)  # a rejected block
        cache.crop(10)
        again = tiny_target(ids[:, 10:], cache).logits
        ref = tiny_target(ids, tiny_target.new_cache(32)).logits[:, 10:]
    assert cache.k.data_ptr() == buffer
    assert torch.allclose(again, ref, atol=1e-5)


def test_cache_overflow_is_an_error(tiny_target):
    with pytest.raises(ContextOverflowError, match="exceed the cache size 8"):
        tiny_target(torch.zeros(1, 9, dtype=torch.long), tiny_target.new_cache(8))


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_unknown_model_type_lists_supported(tiny_checkpoints, tmp_path):
    path = _copy(tiny_checkpoints["llama"][1], tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelFormatError, match="'mamba' is not supported; supported: " + ", ".join(available())
    ):
        load_target(path)


def test_missing_and_misshaped_tensors_are_named(tiny_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy(tiny_checkpoints["qwen2"][1], tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.2.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.k_proj.bias"] = torch.zeros(3)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ModelFormatError) as err:
        load_target(path)
    assert "missing tensors model.layers.2.mlp.up_proj.weight" in str(err.value)
    assert "model.layers.0.self_attn.k_proj.bias: file (3,) vs model (16,)" in str(err.value)


def test_truncated_safetensors_is_named(tiny_checkpoints, tmp_path):
    path = _copy(tiny_checkpoints["llama"][1], tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match=r"model.safetensors: .* truncated or corrupt"):
        load_target(path)


def test_missing_config_says_how_to_fetch(tmp_path):
    with pytest.raises(ModelFormatError, match="dflash-edge fetch"):
        load_target(tmp_path)
