"""Llama family (SmolLM2, Llama 3.x): optional bias on all four attention projections."""

from ..dense_family import *  # noqa: F403  (the dense interface; below, what differs)
from ..dense_family import attention
from ..spec import ArchSpec, AttentionSpec

# llama.cpp permuted Q/K rows for its interleaved rope: the importer undoes it
GGUF = ArchSpec(
    "llama", "LlamaForCausalLM", "llama", qkv_bias=False, qk_norm=False, rotary_permuted=True
)


def attention_spec(cfg) -> AttentionSpec:
    """config.json's `attention_bias` on q, k, v and o alike."""
    return attention(cfg)
