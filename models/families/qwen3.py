"""Qwen3 family (and DFlash drafters): per-head RMSNorm on queries and keys before RoPE."""

from ..dense_family import (  # noqa: F401  (the family interface, re-exported)
    Config,
    check_tensors,
    dense_view,
    manifest_fields,
    mlp_specs,
    planner_dims,
    reference,
    tensors,
    text_prefix,
)
from ..spec import ArchSpec, AttentionSpec

GGUF = ArchSpec(
    "qwen3", "Qwen3ForCausalLM", "qwen3", qkv_bias=False, qk_norm=True, rotary_permuted=False
)


def attention_spec(cfg) -> AttentionSpec:
    return AttentionSpec(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        qkv_bias=cfg.attention_bias,
        o_bias=cfg.attention_bias,
        qk_norm=True,
    )
