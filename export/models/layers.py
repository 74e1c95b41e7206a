"""Building blocks shared by every family and by the drafter: RMSNorm, RoPE, GQA attention, SwiGLU.

Written functionally around the KV cache: a layer takes the cached prefix (`past_k`, `past_v`) and
returns only the K/V of the tokens it was given. The caller owns the buffer (DESIGN.md §4a), so the
same modules serve the torch reference loop and the ONNX export.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_edge.runtime.errors import ModelFormatError


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
def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, base: float, s: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    old_len = s.get("original_max_position_embeddings") or max_pos

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations):
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast", 32)), correction_dim(s.get("beta_slow", 1))
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolate = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolate) + (1 / pos_freqs) * extrapolate
    return inv_freq, attn


ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None, max_pos: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the attention (cos/sin) scale for the rope type a config declares."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, max_pos)
    raise ModelFormatError(f"rope_scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")


class RotaryTable(nn.Module):
    """cos/sin for every position up to `max_pos`, precomputed once (indexed, never recomputed)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_pos: int):
        super().__init__()
        with torch.device("cpu"):    # computed, never loaded: real values even when the model is built on "meta"
            inv_freq, scale = rope_inv_freq(head_dim, theta, scaling, max_pos)
            freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # [P, D/2]
            emb = torch.cat([freqs, freqs], dim=-1)                                    # [P, D]
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]                            # [T, D] each


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = rope                                                                # [T, D] or [b, T, D]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]                                      # [b, 1, T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------- attention + MLP
@dataclass(frozen=True)
class AttentionSpec:
    """What differs between families' attention blocks (the rest is shared)."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False


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
        t = proj(x).view(x.shape[0], x.shape[1], n, self.s.head_dim)               # [b, T, H, D]
        if self.s.qk_norm:
            t = getattr(self, norm)(t)
        return t.transpose(1, 2)                                                   # [b, H, T, D]

    def forward(self, x, rope_q, kv_in, rope_kv, past_k, past_v, mask):
        """Queries from `x`, new keys/values from `kv_in`, attending to [past ; new].

        Returns (output [b, T, H], new_k [b, Hkv, Tkv, D], new_v [b, Hkv, Tkv, D]).
        `mask` is additive [T, S_past + Tkv] or per row [b, T, S_past + Tkv] (None: all keys visible).
        """
        s, b = self.s, x.shape[0]
        q = apply_rope(self._heads(x, self.q_proj, s.num_heads, "q_norm"), rope_q)        # [b, Hq, T, D]
        k_new = apply_rope(self._heads(kv_in, self.k_proj, s.num_kv_heads, "k_norm"), rope_kv)
        v_new = self.v_proj(kv_in).view(b, kv_in.shape[1], s.num_kv_heads, s.head_dim).transpose(1, 2)
        k = torch.cat([past_k, k_new], dim=2)                                       # [b, Hkv, S, D]
        v = torch.cat([past_v, v_new], dim=2)
        rep = s.num_heads // s.num_kv_heads
        q = q.reshape(b, s.num_kv_heads, rep * q.shape[2], s.head_dim)              # [b, Hkv, rep*T, D]
        scores = q @ k.transpose(-1, -2) / math.sqrt(s.head_dim)                    # [b, Hkv, rep*T, S]
        if mask is not None:
            mask = mask[:, None, None] if mask.dim() == 3 else mask                 # [b, 1, 1, T, S]
            scores = scores.view(b, s.num_kv_heads, rep, -1, k.shape[2]) + mask     # [b, Hkv, rep, T, S]
            scores = scores.reshape(b, s.num_kv_heads, -1, k.shape[2])
        out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v                 # [b, Hkv, rep*T, D]
        out = out.reshape(b, s.num_heads, -1, s.head_dim).transpose(1, 2)           # [b, T, Hq, D]
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

    def __init__(self, s: AttentionSpec, intermediate: int):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, intermediate)

    def forward(self, x, rope_q, past_k, past_v, mask, ctx=None, rope_kv=None):
        h = self.input_layernorm(x)
        kv_in = h if ctx is None else torch.cat([ctx, h], dim=1)                    # [b, C + T, H]
        attn, k_new, v_new = self.self_attn(h, rope_q, kv_in, rope_kv or rope_q, past_k, past_v, mask)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_new, v_new


def causal_mask(num_new: int, num_past: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask [T, S_past + T]: new token i sees the whole past and new tokens 0..i."""
    keep = torch.ones(num_new, num_new, dtype=torch.bool).tril()
    keep = torch.cat([torch.ones(num_new, num_past, dtype=torch.bool), keep], dim=1)
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
