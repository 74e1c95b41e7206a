"""Qwen2 / Qwen2.5 family: q/k/v projections always carry a bias, o_proj never does."""

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
    "qwen2", "Qwen2ForCausalLM", "qwen2", qkv_bias=True, qk_norm=False, rotary_permuted=False
)


def attention_spec(cfg) -> AttentionSpec:
    return AttentionSpec(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        qkv_bias=True,
        o_bias=False,
    )
