"""Building blocks shared by every family and by the drafter: RMSNorm, RoPE, GQA attention, SwiGLU.

Written functionally around the KV cache: a layer takes the cached prefix (`past_k`, `past_v`) and
returns only the K/V of the tokens it was given. The caller owns the buffer (docs/design.md §4), so
the same modules serve the torch reference loop and the ONNX export."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .rope import ROPE_TYPES, rope_at, rope_inv_freq, rope_tables  # noqa: F401  (re-exported)
from .spec import AttentionSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


# ---------------------------------------------------------------- RoPE
class RotaryTable(nn.Module):
    """cos/sin of the positions asked for, computed on the CPU from the config's frequencies
    (models/rope.py: the rows the graphs' tables hold, bit for bit) rather than a table of all
    `max_pos` positions (268 MB per model at 262,144 positions and head_dim 128)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_pos: int):
        super().__init__()
        # numpy, even on "meta"
        self.inv_freq, self.scale = rope_inv_freq(head_dim, theta, scaling, max_pos)
        self.max_pos = max_pos

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        where = positions.detach().cpu().numpy()
        if where.size and not 0 <= where.min() <= where.max() < self.max_pos:
            raise IndexError(
                f"positions {where.min()}..{where.max()} outside the model's {self.max_pos}"
            )
        cos, sin = rope_at(where, self.inv_freq, self.scale)
        # [..., D]
        return torch.from_numpy(cos).to(positions.device), torch.from_numpy(sin).to(
            positions.device
        )


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = rope  # [T, D] or [b, T, D]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [b, 1, T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------- attention + MLP
class Attention(nn.Module):
    def __init__(self, s: AttentionSpec):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * s.head_dim, bias=s.qkv_bias)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=s.qkv_bias)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=s.qkv_bias)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=s.o_bias)
        if s.qk_norm:
            self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int, norm: str) -> torch.Tensor:
        t = proj(x).view(x.shape[0], x.shape[1], n, self.s.head_dim)  # [b, T, H, D]
        if self.s.qk_norm:
            t = getattr(self, norm)(t)
        return t.transpose(1, 2)  # [b, H, T, D]

    def forward(self, x, rope_q, kv_in, rope_kv, past_k, past_v, mask):
        """Queries from `x`, new keys/values from `kv_in`, attending to [past ; new].

        Returns (output [b, T, H], new_k [b, Hkv, Tkv, D], new_v [b, Hkv, Tkv, D]). `mask` is
        additive [T, S_past + Tkv] or per row [b, T, S_past + Tkv] (None: all keys visible)."""
        s, b = self.s, x.shape[0]
        q = apply_rope(self._heads(x, self.q_proj, s.num_heads, "q_norm"), rope_q)  # [b, Hq, T, D]
        k_new = apply_rope(self._heads(kv_in, self.k_proj, s.num_kv_heads, "k_norm"), rope_kv)
        v_new = (
            self.v_proj(kv_in).view(b, kv_in.shape[1], s.num_kv_heads, s.head_dim).transpose(1, 2)
        )
        k = torch.cat([past_k, k_new], dim=2)  # [b, Hkv, S, D]
        v = torch.cat([past_v, v_new], dim=2)
        rep = s.num_heads // s.num_kv_heads
        q = q.reshape(b, s.num_kv_heads, rep * q.shape[2], s.head_dim)  # [b, Hkv, rep*T, D]
        scores = q @ k.transpose(-1, -2) / math.sqrt(s.head_dim)  # [b, Hkv, rep*T, S]
        if mask is not None:
            mask = mask[:, None, None] if mask.dim() == 3 else mask  # [b, 1, 1, T, S]
            # [b, Hkv, rep, T, S]
            scores = scores.view(b, s.num_kv_heads, rep, -1, k.shape[2]) + mask
            scores = scores.reshape(b, s.num_kv_heads, -1, k.shape[2])
        out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v  # [b, Hkv, rep*T, D]
        out = out.reshape(b, s.num_heads, -1, s.head_dim).transpose(1, 2)  # [b, T, Hq, D]
        return self.o_proj(out.reshape(b, out.shape[1], -1)), k_new, v_new


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer. `ctx` (drafter only) is prepended to the layer's key/value input."""

    def __init__(self, s: AttentionSpec, intermediate: int, mlp: nn.Module | None = None):
        """`mlp`: the layer's MLP when it is not the dense SwiGLU of width `intermediate` (an MoE
        layer's)."""
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = mlp if mlp is not None else MLP(s.hidden_size, intermediate)

    def forward(self, x, rope_q, past_k, past_v, mask, ctx=None, rope_kv=None):
        h = self.input_layernorm(x)
        kv_in = h if ctx is None else torch.cat([ctx, h], dim=1)  # [b, C + T, H]
        attn, k_new, v_new = self.self_attn(
            h, rope_q, kv_in, rope_kv or rope_q, past_k, past_v, mask
        )
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_new, v_new


def causal_mask(num_new: int, num_past: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask [T, S_past + T]: new token i sees the whole past and new tokens 0..i."""
    keep = torch.ones(num_new, num_new, dtype=torch.bool).tril()
    keep = torch.cat([torch.ones(num_new, num_past, dtype=torch.bool), keep], dim=1)
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
