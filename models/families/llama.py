"""Llama family (SmolLM2, Llama 3.x): optional bias on all four attention projections."""

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

# llama.cpp permuted Q/K rows for its interleaved rope: the importer undoes it
GGUF = ArchSpec(
    "llama", "LlamaForCausalLM", "llama", qkv_bias=False, qk_norm=False, rotary_permuted=True
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
    )
