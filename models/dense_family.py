"""What a dense decoder family (llama, qwen2, qwen3, qwen3_moe) shares behind the family interface
(models/families/__init__.py): a family module imports these names and defines what differs.

Torch-free; `reference` imports torch only when called.
"""

from __future__ import annotations

from ..devices.dims import ModelDims
from .config import TargetConfig
from .families import INTERFACE, family
from .names import target_tensors
from .spec import AttentionSpec

# what a family module takes with `from ..dense_family import *`: the whole interface but the
# attention, which each family defines (with `attention` below)
__all__ = [name for name in INTERFACE if name != "attention_spec"]

Config = TargetConfig
GGUF = None


def attention(cfg, qk_norm: bool = False, qkv_bias=None, o_bias=None) -> AttentionSpec:
    """The AttentionSpec of `cfg`'s dims; a bias left None follows config.json's
    `attention_bias`."""
    return AttentionSpec(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        qkv_bias=cfg.attention_bias if qkv_bias is None else qkv_bias,
        o_bias=cfg.attention_bias if o_bias is None else o_bias,
        qk_norm=qk_norm,
    )


def mlp_specs(cfg) -> tuple:
    """Every layer's MLP is dense."""
    return (None,) * cfg.num_hidden_layers


def tensors(cfg) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors (Hugging Face names); a tied model needs no `lm_head.weight`."""
    return target_tensors(cfg, family(cfg.model_type).attention_spec(cfg))


def check_tensors(cfg, names) -> None:
    """Nothing beyond the per-tensor name and shape check."""


def text_prefix(cfg) -> str:
    return "model"


def dense_view(cfg) -> TargetConfig:
    return cfg


def manifest_fields(cfg) -> dict:
    return {}


def planner_dims(cfg, linear=None, gated: bool = False) -> ModelDims:
    """The planner's dims of `cfg`; a hybrid family adds its linear layers and gated attention."""
    specs = family(cfg.model_type).mlp_specs(cfg)
    moe = bool(cfg.num_experts)
    return ModelDims(
        family=cfg.model_type,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=cfg.max_position_embeddings,
        num_experts=cfg.num_experts,
        experts_per_token=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
        dense_layers=specs.count(None) if moe else 0,
        linear=linear,
        attn_output_gate=gated,
    )


def reference(cfg):
    """The torch reference (models/target.py's TargetModel) with random weights."""
    from .target import TargetModel

    fam = family(cfg.model_type)
    return TargetModel(cfg, fam.attention_spec(cfg), fam.mlp_specs(cfg))
