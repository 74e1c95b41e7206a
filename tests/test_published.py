"""Published checkpoint layouts in (tier 1): sharded bf16 targets and z-lab drafters, parity with
transformers, and every bad input named."""

import json

import pytest
import torch

from dflash_edge.models import load_target
from dflash_edge.models.checkpoint import Checkpoint
from dflash_edge.models.drafter import DraftConfig, load_drafter, new_drafter, save_drafter
from dflash_edge.runtime.errors import ModelFormatError

from published import reduced, write_target, write_zlab_drafter, zlab_config

MODELS = ("Qwen3-4B", "Qwen3-8B", "Llama-3.1-8B")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    return {
        name: write_target(root / name, reduced(name), shards=3, seed=i)
        for i, name in enumerate(MODELS)
    }


@pytest.mark.parametrize("name", MODELS)
def test_published_layout_loads_with_parity_against_transformers(published, name):
    import transformers

    path = published[name]
    assert len(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]) > 10
    assert (
        len(list(path.glob("model-0000?-of-00003.safetensors"))) == 3
        and not (path / "model.safetensors").exists()
    )
    ours = load_target(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 200, 5, 9, 120, 64, 1, 250, 33]])
    with torch.no_grad():
        want = ref(ids).logits
        got = ours(ids, ours.new_cache(32)).logits
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), float((got - want).abs().max())
    assert ours.config.tie_word_embeddings == reduced(name)["tie_word_embeddings"]
    if ours.config.tie_word_embeddings:
        assert ours.lm_head.weight is ours.model.embed_tokens.weight


def test_eos_ids_merge_generation_config(published):
    assert load_target(published["Llama-3.1-8B"]).config.eos_token_id == [128001, 128008, 128009]
    assert load_target(published["Qwen3-8B"]).config.eos_token_id == [151645, 151643]


def test_checkpoint_dtype_is_kept_without_a_float32_copy(published):
    path = published["Qwen3-8B"]
    model = load_target(path, dtype="checkpoint")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ckpt = Checkpoint.open(path)
    name = "model.layers.2.mlp.up_proj.weight"
    assert torch.equal(model.get_parameter(name), ckpt.get(name))
    assert ckpt.nbytes == 2 * sum(p.numel() for p in model.parameters())


def test_zlab_drafter_derives_target_layer_ids_and_fits(published, tmp_path):
    target_cfg = reduced("Qwen3-8B")
    drafter = load_drafter(
        write_zlab_drafter(tmp_path / "d", zlab_config(target_cfg, num_layers=3)),
        target_config=load_target(published["Qwen3-8B"]).config,
    )
    assert drafter.config.target_layer_ids == [1, 2, 3]  # z-lab: spread over 1..L-3 (L = 6)
    assert drafter.config.num_target_layers == 6 and drafter.config.mask_token_id == 5
    assert drafter.fc.weight.shape == (64, 3 * 64)


def test_saved_drafter_names_zlab_code_by_reference(tiny_target, tmp_path):
    cfg = DraftConfig.for_target(tiny_target.config, num_layers=1, mask_token_id=5)
    path = save_drafter(new_drafter(cfg), tmp_path / "d")
    auto = json.loads((path / "config.json").read_text())["auto_map"]["AutoModel"]
    repo, cls = auto.split("--")
    assert repo.startswith("z-lab/") and cls == "dflash.DFlashDraftModel"
    assert not list(path.glob("*.py"))  # a reference, never a copy of their code


# ---------------------------------------------------------------- bad input
def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_missing_shard_is_named(published, tmp_path):
    path = _copy(published["Qwen3-4B"], tmp_path / "m")
    (path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(
        ModelFormatError, match=r"lists shard\(s\) model-00002-of-00003.safetensors that are not in"
    ):
        load_target(path)


def test_index_naming_a_tensor_no_shard_holds(published, tmp_path):
    path = _copy(published["Qwen3-4B"], tmp_path / "m")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        ModelFormatError,
        match=r"names tensor\(s\) no listed shard holds: model.layers.9.mlp.up_proj",
    ):
        load_target(path)


def test_dtype_mismatch_with_config(published, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy(published["Qwen3-4B"], tmp_path / "m")
    shard = path / "model-00003-of-00003.safetensors"
    tensors = load_file(str(shard))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].float()
    save_file(tensors, str(shard))
    with pytest.raises(ModelFormatError, match=rf"{name} \(F32\).*declares torch_dtype 'bfloat16'"):
        load_target(path)


def test_shape_mismatch_with_config(published, tmp_path):
    path = _copy(published["Qwen3-4B"], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(
        ModelFormatError,
        match=r"misshaped tensors .*mlp.down_proj.weight: file \(64, 128\) vs model \(64, 96\)",
    ):
        load_target(path)


def test_drafter_that_does_not_fit_the_target(published, tmp_path):
    target = load_target(published["Qwen3-8B"]).config
    cfg = zlab_config(reduced("Qwen3-8B"), num_layers=2)
    cfg["dflash_config"]["target_layer_ids"] = [1, 6]
    with pytest.raises(
        ModelFormatError, match=r"target_layer_ids \[1, 6\] out of range for a 6-layer target"
    ):
        load_drafter(write_zlab_drafter(tmp_path / "ids", cfg), target_config=target)
    wide = zlab_config(reduced("Qwen3-8B", hidden_size=96), num_layers=2)
    with pytest.raises(
        ModelFormatError, match=r"drafter hidden_size=96 does not fit the target's 64"
    ):
        load_drafter(write_zlab_drafter(tmp_path / "wide", wide), target_config=target)


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"layer_types": ["full_attention", "chunked_attention"], "sliding_window": 64},
            r"unknown layer type\(s\) \['chunked_attention'\]",
        ),
        (
            {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": None},
            r"sliding_window=None",
        ),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    ],
)
def test_drafter_config_features_we_cannot_run_are_refused_by_name(change, message):
    cfg = {**zlab_config(reduced("Qwen3-8B"), num_layers=2), **change}
    with pytest.raises(ModelFormatError, match=message):
        DraftConfig.from_dict(cfg)


@pytest.mark.parametrize(
    "change",
    [
        {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 64},
        {
            "layer_types": None,
            "use_sliding_window": True,
            "sliding_window": 64,
            "max_window_layers": 1,
        },
    ],
)
def test_drafter_sliding_windows_are_honoured(change):
    """z-lab's sliding-window drafters (issue 26: tests/test_sliding_window.py runs them end to
    end)."""
    cfg = DraftConfig.from_dict({**zlab_config(reduced("Qwen3-8B"), num_layers=2), **change})
    assert cfg.window_layers == [1] and cfg.window(1) == 64 and cfg.window(0) is None
