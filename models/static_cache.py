"""The reference loop's static KV cache: one buffer allocated once, a host-side length pointer.

Rollback after a rejected draft is `crop(n)`: the pointer moves, nothing is copied or freed.
"""

from __future__ import annotations

import torch

from ..runtime.errors import ContextOverflowError


class StaticKVCache:
    """K and V for `num_layers` layers, batch 1, up to `max_len` positions.

    >>> cache = StaticKVCache(num_layers=2, num_kv_heads=1, head_dim=4, max_len=8)
    >>> cache.length
    0
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
    ):
        # [L, 1, Hkv, S, D]
        self.k = torch.zeros(num_layers, 1, num_kv_heads, max_len, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_config(cls, cfg, max_len: int, dtype: torch.dtype) -> StaticKVCache:
        """A cache shaped for `cfg`'s layers and KV heads (a target's or a drafter's config)."""
        return cls(
            cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, max_len, dtype=dtype
        )

    def past(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The live prefix of one layer, as views (no copy)."""
        return self.k[layer, :, :, : self.length], self.v[layer, :, :, : self.length]

    def check_room(self, num_new: int) -> None:
        if self.length + num_new > self.max_len:
            raise ContextOverflowError(
                f"{self.length} cached + {num_new} new positions exceed the cache size "
                f"{self.max_len}; "
                f"shorten the prompt or raise max_context"
            )

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Store new K/V [1, Hkv, T, D] right after the live prefix (call `advance` once per
        step)."""
        end = self.length + k_new.shape[2]
        self.k[layer, :, :, self.length : end] = k_new
        self.v[layer, :, :, self.length : end] = v_new

    def advance(self, num_new: int) -> None:
        self.length += num_new

    def crop(self, length: int) -> None:
        """Roll back to `length` positions: a pointer move."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length
