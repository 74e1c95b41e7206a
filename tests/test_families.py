"""A model family is one module per room, found by its `model_type` (docs/design.md §8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_edge.export.families import INTERFACE as EXPORT_INTERFACE
from dflash_edge.export.families import family_writers
from dflash_edge.models.config import TargetConfig
from dflash_edge.models.families import INTERFACE, available, family
from dflash_edge.runtime.errors import ModelFormatError

from tiny import LINEAR_HEADS, SMALL

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=64, **SMALL)
# model_type -> the fields its config needs beyond TINY (a new family adds its row)
EXTRA = {
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "qwen3_5": LINEAR_HEADS,
    "qwen3_5_text": LINEAR_HEADS,
}


def _files(folder: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / folder).glob("*.py") if p.stem != "__init__")


def test_every_family_file_is_found_by_its_model_type():
    assert list(available()) == _files("models/families") == _files("export/families")
    assert {"llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_text"} <= set(available())
    for name in available():
        assert family(name).__name__.rsplit(".", 1)[1] == name
        assert family_writers(name).__name__.rsplit(".", 1)[1] == name


@pytest.mark.parametrize("name", available())
def test_every_family_module_offers_the_same_interface(name):
    module = family(name)
    missing = [attr for attr in INTERFACE if not hasattr(module, attr)]
    assert not missing, f"models/families/{name}.py lacks {missing}"
    assert all(callable(getattr(module, attr)) for attr in INTERFACE if attr != "GGUF")
    assert module.GGUF is None or module.GGUF.model_type == name
    assert all(hasattr(family_writers(name), attr) for attr in EXPORT_INTERFACE)


@pytest.mark.parametrize("name", available())
def test_a_config_of_each_family_is_parsed_and_described_by_its_module(name):
    raw = {"model_type": name, **TINY, **EXTRA.get(name, {})}
    if name == "qwen3_5":  # the image-text layout nests the text model
        raw = {"model_type": name, "text_config": {**raw, "model_type": "qwen3_5_text"}}
    cfg = TargetConfig.from_dict(raw)
    module = family(name)
    assert isinstance(cfg, module.Config)
    assert len(module.mlp_specs(cfg)) == len(family_writers(name).mlp_writers(cfg)) == 4
    tensors = module.tensors(cfg)
    assert tensors[f"{module.text_prefix(cfg)}.embed_tokens.weight"] == (64, 32)
    module.check_tensors(cfg, list(tensors))
    dims = module.planner_dims(cfg)
    assert (dims.num_layers, dims.hidden_size, dims.vocab_size) == (4, 32, 64)
    assert module.dense_view(cfg).hidden_size == 32
    assert set(module.manifest_fields(cfg)) <= _manifest_model_keys()


def _manifest_model_keys() -> set[str]:
    from dflash_edge.runtime.bundle import SCHEMA

    return set(SCHEMA["model"])


def test_an_unknown_model_type_is_refused_by_name_with_the_families_present():
    with pytest.raises(ModelFormatError) as err:
        family("gemma3")
    assert "'gemma3' is not supported" in str(err.value)
    assert all(name in str(err.value) for name in _files("models/families"))
    with pytest.raises(ModelFormatError, match="'gemma3' is not supported"):
        family_writers("gemma3")
