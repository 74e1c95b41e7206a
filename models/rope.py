"""RoPE tables in numpy: the one definition the torch reference (`layers.RotaryTable`) and the
streamed ONNX graphs both use, so llama3 / yarn / linear scaling cannot drift between them.

>>> cos, sin = rope_tables(8, 10000.0, None, max_pos=4)
>>> cos.shape, float(cos[0, 0])
((4, 8), 1.0)
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.errors import ModelFormatError

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_F32 = np.float32


def _llama3_inv_freq(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = _F32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / _F32(factor), inv_freq)
    smooth = (_F32(old_len) / wavelen - _F32(low)) / _F32(high - low)
    smoothed = (1 - smooth) * scaled / _F32(factor) + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(medium, smoothed, scaled).astype(_F32)


def _yarn(dim: int, base: float, s: dict, max_pos: int) -> tuple[np.ndarray, float]:
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
    ramp = np.clip((np.arange(dim // 2, dtype=_F32) - _F32(low)) / _F32(high - low), 0, 1)
    pos_freqs = _F32(base) ** (np.arange(0, dim, 2, dtype=_F32) / _F32(dim))
    extrapolate = 1 - ramp
    inv_freq = (1 / (_F32(factor) * pos_freqs)) * (1 - extrapolate) + (1 / pos_freqs) * extrapolate
    return inv_freq.astype(_F32), attn


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict | None, max_pos: int
) -> tuple[np.ndarray, float]:
    """Inverse frequencies [D/2] (float32) and the attention (cos/sin) scale for the rope type a
    config declares."""
    inv_freq = (
        1.0 / _F32(theta) ** (np.arange(0, head_dim, 2, dtype=_F32) / _F32(head_dim))
    ).astype(_F32)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return (inv_freq / _F32(scaling["factor"])).astype(_F32), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, max_pos)
    raise ModelFormatError(
        f"rope_scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
    )


def rope_tables(
    head_dim: int, theta: float, scaling: dict | None, max_pos: int, rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [P, D] (float32), the attention scale (yarn) folded in; halves repeat ([f, f]). P
    = max_pos, or `rows` when fewer positions are reachable (a bundle's KV capacity): the same first
    rows, the scaling still computed for the model's `max_pos`."""
    inv_freq, scale = rope_inv_freq(head_dim, theta, scaling, max_pos)
    return rope_at(np.arange(min(rows, max_pos) if rows else max_pos), inv_freq, scale)


def rope_at(
    positions: np.ndarray, inv_freq: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [*positions.shape, D] of the given positions: exactly the rows `rope_tables`
    holds for them."""
    # [..., D/2]
    freqs = np.multiply.outer(np.asarray(positions).astype(_F32), inv_freq).astype(_F32)
    emb = np.concatenate([freqs, freqs], axis=-1)  # [..., D]
    return (np.cos(emb) * _F32(scale)).astype(_F32), (np.sin(emb) * _F32(scale)).astype(_F32)
