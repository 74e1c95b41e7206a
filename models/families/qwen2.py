"""Qwen2 / Qwen2.5 family: q/k/v projections always carry a bias, o_proj never does."""

from ..dense_family import *  # noqa: F403  (the dense interface; below, what differs)
from ..dense_family import attention
from ..spec import ArchSpec, AttentionSpec

GGUF = ArchSpec(
    "qwen2", "Qwen2ForCausalLM", "qwen2", qkv_bias=True, qk_norm=False, rotary_permuted=False
)


def attention_spec(cfg) -> AttentionSpec:
    """Biased q/k/v, unbiased o_proj, whatever config.json says."""
    return attention(cfg, qkv_bias=True, o_bias=False)
