"""What differs between families, as data: attention, sparse MLP and GGUF entries (torch-free: the
streamed graph builders read them too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSpec:
    """What differs between families' attention blocks (the rest is shared).

    >>> AttentionSpec(64, 4, 2, 16, 1e-6, qk_norm=True).num_heads // 2
    2
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False


@dataclass(frozen=True)
class ArchSpec:
    """What an importable llama.cpp `general.architecture` looks like on the Hugging Face side (a
    family's `GGUF` entry; models/gguf_import.py reads it)."""

    arch: str  # GGUF `general.architecture`
    hf_class: str
    model_type: str
    qkv_bias: bool  # q/k/v projections carry biases (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)
    rotary_permuted: bool  # llama.cpp permuted Q/K rows for its interleaved rope; undo it


@dataclass(frozen=True)
class MoESpec:
    """One sparse MLP: a softmax router over `num_experts`; the `top_k` best run, their weights
    renormalised to sum 1 when `norm_topk_prob`."""

    hidden_size: int
    num_experts: int
    top_k: int
    intermediate: int  # each expert's SwiGLU width (moe_intermediate_size)
    norm_topk_prob: bool
