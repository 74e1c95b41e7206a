"""Qwen2 / Qwen2.5 family: q/k/v projections always carry a bias, o_proj never does."""
from .spec import AttentionSpec


def attention_spec(cfg) -> AttentionSpec:
    return AttentionSpec(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                         cfg.rms_norm_eps, qkv_bias=True, o_bias=False)
