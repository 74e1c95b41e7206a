"""Llama family (SmolLM2, Llama 3.x): optional bias on all four attention projections."""
from .spec import AttentionSpec


def attention_spec(cfg) -> AttentionSpec:
    return AttentionSpec(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                         cfg.rms_norm_eps, qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias)
