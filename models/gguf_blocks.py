"""GGUF block-quantised weights as onnxruntime MatMulNBits operands, exactly (floor 3: numpy; gguf
lazily).

A GGUF low-bit tensor already is integer codes times per-block scales, so it maps onto MatMulNBits'
`(q - zero_point) * scale` with no re-quantisation. Symmetric types (x = s*(q - c)) map directly,
the codes stored shifted by 2^(bits-1) - c so that the op's default zero point is their centre (no
zero-point tensor: 1/16 byte a weight less for Q6_K at 8 bits, 1/32 for Q5_*). Affine types
(x = s*q + o) keep that fast integer zero point and move the rest into a per-block correction
(float zero points are exact too, but run ~16x slower: docs/BENCHMARKS.md, "Groundwork for exact
4-bit imports"):

    x = s*(q - c) + (o + c*s)   so   A @ W^T = MatMulNBits(A) + blocksum(A) @ correction

with blocksum(A) [M, K/bs] the sums of A over each block of `block_size` inputs and correction
[K/bs, N] = (o + c*s)^T. The result equals `gguf.quants.dequantize` up to float32 rounding.

    >>> from gguf import GGUFReader  # doctest: +SKIP
    >>> name = "blk.0.ffn_up.weight"  # doctest: +SKIP
    >>> t = next(t for t in GGUFReader(path).tensors if t.name == name)  # doctest: +SKIP
    >>> w = nbits_operands(t.data, t.tensor_type)  # doctest: +SKIP
    >>> w.bits, w.block_size, w.B.shape, w.scales.shape, w.correction.shape  # doctest: +SKIP
    (4, 32, (1536, 18, 16), (1536, 18), (18, 1536))

Mapped: Q4_0, Q4_1, Q4_K to 4 bits (blocks of 32); Q5_0, Q5_1, Q8_0, Q5_K to 8 bits (blocks of 32);
Q6_K to 8 bits (blocks of 16). Affine types also keep their own offset (`NBitsWeight.offset`): a
looked-up table row is then gguf's own value bit for bit (models/nbits.row_form). Any other type
raises `UnsupportedQuantType`: the caller re-quantises, with a warning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..runtime.errors import ModelFormatError
from .nbits import NBitsWeight


class UnsupportedQuantType(ModelFormatError):
    """A GGUF tensor type with no exact MatMulNBits mapping here (`qtype`: its name, e.g.
    "IQ4_XS")."""

    def __init__(self, qtype: str, shape=None):
        self.qtype = qtype
        where = f" (tensor shape {list(shape)})" if shape is not None else ""
        super().__init__(
            f"GGUF type {qtype}{where} has no exact MatMulNBits mapping; mapped: {', '.join(TYPES)}"
        )


# ---- byte fields of GGUF blocks (layouts as in gguf/quants.py's dequantize_blocks) ----


def _fields(blocks, *widths):
    """Split the bytes of blocks [..., type_size] into fields of `widths` bytes, plus the rest."""
    return np.split(blocks, np.cumsum(widths), axis=-1)


def _f16(field):
    """[..., 2] bytes -> [..., 1] float32."""
    return np.ascontiguousarray(field).view(np.float16).astype(np.float32)


def _unpack(field, width: int, group: int):
    """Bytes [..., G*group] -> codes [..., G*(8/width)*group]: per group of bytes, bits 0..width-1
    of each byte first, then the next `width` bits, ... (GGUF's order for nibbles, 5th bits and
    Q6_K's high 2 bits)."""
    shifts = np.arange(0, 8, width, dtype=np.uint8)[:, None]  # [8/width, 1]
    b = field.reshape(*field.shape[:-1], -1, 1, group)  # [..., G, 1, group]
    return ((b >> shifts) & np.uint8((1 << width) - 1)).reshape(*field.shape[:-1], -1)


def _high(low, high):
    """Codes from 4 low bits and the bits above them."""
    return low | (high << np.uint8(4))


def _k_scales(d, dmin, packed):
    """Q4_K/Q5_K super-block header -> (scale, offset) [..., 8]: x = d*sc*q - dmin*m, 6-bit sc and
    m."""
    s = packed.reshape(*packed.shape[:-1], 3, 4)  # [..., 3, 4]
    lo, mid, top = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)  # [..., 8]
    m = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)  # [..., 8]
    return _f16(d) * sc.astype(np.float32), -(_f16(dmin) * m.astype(np.float32))


# ---- one decoder per type: blocks [N, K/g, type_size] -> (codes [N, K/g, g] uint8, scale, offset
# or None),
# scale/offset [N, K/g, g/bs]; x = scale*(q - centre) (symmetric) or scale*q + offset (affine) ----


def _q4_0(b):
    d, qs = _fields(b, 2)
    return _unpack(qs, 4, 16), _f16(d), None


def _q4_1(b):
    d, m, qs = _fields(b, 2, 2)
    return _unpack(qs, 4, 16), _f16(d), _f16(m)


def _q5_0(b):
    d, qh, qs = _fields(b, 2, 4)
    return _high(_unpack(qs, 4, 16), _unpack(qh, 1, 1)), _f16(d), None


def _q5_1(b):
    d, m, qh, qs = _fields(b, 2, 2, 4)
    return _high(_unpack(qs, 4, 16), _unpack(qh, 1, 1)), _f16(d), _f16(m)


def _q8_0(b):
    d, qs = _fields(b, 2)
    return qs ^ np.uint8(0x80), _f16(d), None  # int8 bits -> q + 128 as uint8


def _q4_k(b):
    d, dmin, sc, qs = _fields(b, 2, 2, 12)
    return (_unpack(qs, 4, 32), *_k_scales(d, dmin, sc))


def _q5_k(b):
    d, dmin, sc, qh, qs = _fields(b, 2, 2, 12, 32)
    return (_high(_unpack(qs, 4, 32), _unpack(qh, 1, 32)), *_k_scales(d, dmin, sc))


def _q6_k(b):
    ql, qh, sc, d = _fields(b, 128, 64, 16)
    return (
        _high(_unpack(ql, 4, 64), _unpack(qh, 2, 32)),
        _f16(d) * sc.view(np.int8).astype(np.float32),
        None,
    )


@dataclass(frozen=True)
class _Type:
    gguf_block: int  # elements per GGUF block
    type_size: int  # bytes per GGUF block
    decode: Callable
    bits: int  # MatMulNBits bits
    block_size: int  # MatMulNBits block size (one scale each)
    centre: int  # the code of 0 (symmetric) / the integer part of the zero point (affine)


TYPES = {
    "Q4_0": _Type(32, 18, _q4_0, 4, 32, 8),
    "Q4_1": _Type(32, 20, _q4_1, 4, 32, 8),
    "Q5_0": _Type(32, 22, _q5_0, 8, 32, 16),
    "Q5_1": _Type(32, 24, _q5_1, 8, 32, 16),
    "Q8_0": _Type(32, 34, _q8_0, 8, 32, 128),
    "Q4_K": _Type(256, 144, _q4_k, 4, 32, 8),
    "Q5_K": _Type(256, 176, _q5_k, 8, 32, 16),
    "Q6_K": _Type(256, 210, _q6_k, 8, 16, 32),
}


# ---- MatMulNBits packing, per bit width ----


def _pack4(q, bs: int):
    """Codes [N, K] -> [N, K/bs, bs/2]: element 2i in the low nibble, 2i+1 in the high one."""
    return (q[:, 0::2] | (q[:, 1::2] << np.uint8(4))).reshape(q.shape[0], -1, bs // 2)


PACKERS = {4: _pack4, 8: lambda q, bs: q.reshape(q.shape[0], -1, bs)}


def _type_name(qtype) -> str:
    if isinstance(qtype, str):
        return qtype
    if hasattr(qtype, "name"):
        return qtype.name
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(int(qtype)).name


def _shape(raw, spec: _Type, shape, name: str) -> tuple[int, int]:
    """[N, K] from `shape` or from GGUFReader's byte rows [N, K/g*type_size]; refused if the bytes
    don't fit."""
    if shape is None:
        if raw.ndim != 2 or raw.shape[1] % spec.type_size:
            raise ModelFormatError(
                f"{name}: byte shape {list(raw.shape)} is not rows of whole "
                f"{spec.type_size}-byte blocks; pass the logical shape [N, K]"
            )
        shape = (raw.shape[0], raw.shape[1] // spec.type_size * spec.gguf_block)
    n, k = (int(x) for x in shape)
    if k % spec.gguf_block or raw.size != n * (k // spec.gguf_block) * spec.type_size:
        raise ModelFormatError(
            f"{name}: tensor shape {[n, k]} does not fit its {raw.size} bytes of "
            f"{spec.gguf_block}-element blocks (K must be a multiple of {spec.gguf_block})"
        )
    return n, k


def nbits_operands(data, qtype, shape=None, name: str = "tensor") -> NBitsWeight:
    """The exact MatMulNBits operands of one GGUF tensor.

    data: its raw bytes (GGUFReader's `tensor.data`: uint8 [N, bytes per row]); qtype:
    `tensor.tensor_type` (a GGMLQuantizationType, its int or its name); shape: the logical [N, K] of
    W in y = x @ W^T (rows as the reader gives them), needed only when `data` is flat. Raises
    UnsupportedQuantType for unmapped types."""
    type_name = _type_name(qtype)
    spec = TYPES.get(type_name)
    if spec is None:
        raise UnsupportedQuantType(type_name, shape)
    raw = np.asarray(data).view(np.uint8)
    n, k = _shape(raw, spec, shape, name)
    # q [N, K/g, g]
    q, scale, offset = spec.decode(raw.reshape(n, k // spec.gguf_block, spec.type_size))
    shift = (1 << (spec.bits - 1)) - spec.centre  # codes stored + shift: the op's default zp
    q = np.ascontiguousarray(q).reshape(n, k) + np.uint8(shift)  # [N, K]
    scales = np.ascontiguousarray(scale.reshape(n, -1), dtype=np.float32)  # [N, K/bs]
    offset = None if offset is None else np.ascontiguousarray(offset.reshape(n, -1), np.float32)
    correction = (
        None
        if offset is None
        else np.ascontiguousarray((offset + np.float32(spec.centre) * scales).T)  # [K/bs, N]
    )
    return NBitsWeight(
        spec.bits,
        spec.block_size,
        n,
        k,
        PACKERS[spec.bits](q, spec.block_size),
        scales,
        None,
        correction,
        type_name,
        offset=offset,
        offset_zero=shift,
    )
