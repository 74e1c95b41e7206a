"""DFlash2 drafters (issue 38): config + loader, the torch reference, the identity conversion from
DFlash1, the exported lattice graph and the runtime's walk over it (tier 1: tiny models)."""

import json

import pytest
import torch

from dflash_edge.models.dflash2 import DFlash2Drafter, from_dflash1, greedy_walk
from dflash_edge.models.dflash2_config import DFlash2Config
from dflash_edge.models.draft_config import DraftConfig
from dflash_edge.models.drafter import load_drafter, new_drafter
from dflash_edge.models.families.qwen3 import attention_spec
from dflash_edge.models.names import drafter_tensors
from dflash_edge.runtime.errors import ModelFormatError

from dflash2_fixture import write_dflash2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def d2_folder(tiny_target, tmp_path_factory):
    return write_dflash2(tmp_path_factory.mktemp("d2") / "drafter", tiny_target.config)


def test_published_layout_loads_with_every_tensor(d2_folder, tiny_target):
    drafter = load_drafter(d2_folder, target_config=tiny_target.config)
    cfg = drafter.config
    assert isinstance(drafter, DFlash2Drafter) and isinstance(cfg, DFlash2Config)
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
    cfg = DraftConfig.from_dict(raw)
    assert (cfg.selector_top_k, cfg.conv_group_size, cfg.conv_groups) == (16, 8, 4)
    raw["architectures"] = ["Qwen3DFlash2DraftModel"]
    assert isinstance(DraftConfig.from_dict(raw), DFlash2Config)


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
        DraftConfig.from_dict(raw)


def test_config_round_trips_through_to_dict(d2_folder):
    cfg = DraftConfig.from_dict(json.loads((d2_folder / "config.json").read_text()))
    again = DraftConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
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
        past = [empty] * layers
        h, _, _ = drafter.step(embeds, pos[ctx_len:], feats, pos[:ctx_len], past, past)
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
            cand, scores = d2.lattice(tiny_target.lm_head, h2[:, 1:], ids[:, 0])
        assert torch.equal(greedy_walk(cand, scores), want)
