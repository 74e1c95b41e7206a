"""What differs between families' attention blocks, as data (torch-free: the streamed graph builders read it too)."""
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
