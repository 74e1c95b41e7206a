"""Qwen3 family (and DFlash drafters): per-head RMSNorm on queries and keys before RoPE."""

from ..dense_family import *  # noqa: F403  (the dense interface; below, what differs)
from ..dense_family import attention
from ..spec import ArchSpec, AttentionSpec

GGUF = ArchSpec(
    "qwen3", "Qwen3ForCausalLM", "qwen3", qkv_bias=False, qk_norm=True, rotary_permuted=False
)


def attention_spec(cfg) -> AttentionSpec:
    """Per-head q/k RMSNorm; config.json's `attention_bias` on the projections."""
    return attention(cfg, qk_norm=True)
