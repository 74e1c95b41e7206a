"""A weight as onnxruntime MatMulNBits operands: the one block format the exporter and the quantiser
write.

`NBitsWeight` holds the operands of y = x @ W^T for W [N, K]; it comes either exactly from a GGUF
tensor (`gguf_blocks.nbits_operands`) or from a float weight by onnxruntime's own round-to-nearest
block quantiser (`rtn`). Affine formats carry a `correction` [K/bs, N]: y = MatMulNBits(x) +
blocksum(x) @ correction.

>>> w = rtn(np.ones((8, 64), np.float32), bits=4, block_size=32)
>>> w.B.shape, w.scales.shape, w.zero_points is None
((8, 2, 16), (8, 2), True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

FIELDS = ("B", "scales", "zero_points", "correction", "offset")


@dataclass(frozen=True)
class NBitsWeight:
    """MatMulNBits operands of y = x @ W^T for W [N, K] (attributes K=k, N=n, bits, block_size).

    B            uint8 [N, K/bs, bs*bits/8]: codes, 4-bit ones packed two a byte, low nibble first
    scales       float32 [N, K/bs]
    zero_points  uint8 [N, ceil(K/bs/2)] packed (4-bit) or [N, K/bs] (8-bit): MatMulNBits' own
                 layout; None: the op's default 2^(bits-1)
    correction   float32 [K/bs, N] or None: for affine types
                 y = MatMulNBits(x) + blocksum(x) @ correction
    qtype        where the codes came from: a GGUF type name ("Q4_1"), or "rtn" (re-quantised here)
    offset       float32 [N, K/bs] or None: an affine GGUF type's own offset, for rows looked up
                 (`row_form`): x = (q - offset_zero) * scale + offset, as gguf dequantises, bit
                 for bit (the correction o + c*s above is rounded once more)
    offset_zero  the code whose value is `offset` (0, or the shift of codes stored shifted)
    """

    bits: int
    block_size: int
    n: int
    k: int
    B: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    correction: np.ndarray | None
    qtype: str
    offset: np.ndarray | None = None
    offset_zero: int = 0

    @property
    def layout(self) -> tuple[int, int, bool]:
        """What must agree for two weights to share one MatMulNBits: bits, block size, zero points
        present."""
        return self.bits, self.block_size, self.zero_points is not None

    def rows(self, order) -> "NBitsWeight":
        """The same weight with its output rows (N) reordered: row i of the result is row
        order[i]."""
        order = np.asarray(order)
        pick = lambda a: None if a is None else np.ascontiguousarray(a[order])  # noqa: E731
        corr = None if self.correction is None else np.ascontiguousarray(self.correction[:, order])
        return replace(
            self,
            n=len(order),
            B=pick(self.B),
            scales=pick(self.scales),
            zero_points=pick(self.zero_points),
            correction=corr,
            offset=pick(self.offset),
        )

    def meta(self) -> str:
        return json.dumps(
            {
                "bits": self.bits,
                "block_size": self.block_size,
                "n": self.n,
                "k": self.k,
                "qtype": self.qtype,
                "offset_zero": self.offset_zero,
            }
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}

    @classmethod
    def from_arrays(cls, meta: str, arrays: dict) -> "NBitsWeight":
        return cls(**json.loads(meta), **{f: arrays.get(f) for f in FIELDS})


def concat_rows(parts: list[NBitsWeight], qtype: str | None = None) -> NBitsWeight:
    """Weights of one layout stacked along N (q, k, v packed into one MatMulNBits); a missing
    correction is 0."""
    first = parts[0]
    if any(p.layout != first.layout or p.k != first.k for p in parts):
        raise ValueError("concat_rows needs weights of one layout and K")

    def cat(f):
        return None if getattr(first, f) is None else np.concatenate([getattr(p, f) for p in parts])

    corr = None
    if any(p.correction is not None for p in parts):
        blocks = first.scales.shape[1]
        # [K/bs, sum N]
        corr = np.concatenate(
            [
                p.correction if p.correction is not None else np.zeros((blocks, p.n), np.float32)
                for p in parts
            ],
            axis=1,
        )
    return replace(
        first,
        n=sum(p.n for p in parts),
        B=cat("B"),
        scales=cat("scales"),
        zero_points=cat("zero_points"),
        correction=corr,
        offset=cat("offset") if all(p.offset is not None for p in parts) else None,
        qtype=qtype or "+".join(sorted({p.qtype for p in parts})),
    )


def pack_blocks(weight: np.ndarray, bits: int, block_size: int, symmetric: bool):
    """[K, N] float32 -> (packed uint8 [N, ceil(K/bs), bs*bits/8], scales [N, ceil(K/bs)], zero
    points uint8): onnxruntime's own block quantiser (round to nearest); a last partial block along
    K is onnxruntime's to fill."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    k, n = weight.shape
    k_blocks = -(-k // block_size)
    per_byte = 8 // bits
    packed = np.zeros((n, k_blocks, block_size // per_byte), np.uint8)
    scales = np.zeros((n, k_blocks), weight.dtype)
    zero_points = np.zeros((n, -(-k_blocks // per_byte)), np.uint8)
    fn = {4: quantize_matmul_4bits, 8: quantize_matmul_8bits}[bits]
    fn(packed, np.ascontiguousarray(weight), scales, zero_points, block_size, n, k, symmetric)
    return packed, scales, zero_points


def rtn(
    weight, bits: int, block_size: int, symmetric: bool = True, rows: int = 8192, shape=None
) -> NBitsWeight:
    """W [N, K] float -> its round-to-nearest blocks (onnxruntime's quantiser), `rows` output rows
    at a time (each row's blocks depend on that row only, so a 151,936-row table is never transposed
    whole).

    `weight`: an array, or a function `read(row_slice)` giving those rows (with `shape` [N, K]), so
    W itself is never held whole either."""
    read = weight if callable(weight) else (lambda sl: weight[sl])
    n, k = shape or weight.shape
    blocks = -(-k // block_size)
    packed = np.zeros((n, blocks, block_size * bits // 8), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    zps = None if symmetric else np.zeros((n, -(-blocks // (8 // bits))), np.uint8)
    for start in range(0, n, rows):
        # [K, rows]
        chunk = np.ascontiguousarray(read(slice(start, start + rows)).T, dtype=np.float32)
        packed[start : start + rows], scales[start : start + rows], zp = pack_blocks(
            chunk, bits, block_size, symmetric
        )
        if zps is not None:
            zps[start : start + rows] = zp
    return NBitsWeight(bits, block_size, n, k, packed, scales, zps, None, "rtn")


def unpacked_zero_points(w: NBitsWeight) -> np.ndarray | None:
    """Zero points [N, K/bs] uint8, one per block (4-bit ones unpacked), or None (the default)."""
    if w.zero_points is None:
        return None
    if w.bits == 4:
        zp = np.stack([w.zero_points & 0x0F, w.zero_points >> 4], axis=-1).reshape(w.n, -1)
        return zp[:, : w.scales.shape[1]]
    return w.zero_points


def row_form(w: NBitsWeight) -> tuple[np.ndarray | None, np.ndarray | None]:
    """How a looked-up row of W dequantises: (zero points [N, K/bs] uint8 or None for the default,
    added term [N, K/bs] float32 or None); row = (q - zero) * scale (+ added), per block.

    A GGUF's affine blocks give their own offset (bit for bit `gguf.quants.dequantize`: scale*q +
    offset), others the MatMulNBits form ((q - zp) * scale + correction: its operands exactly)."""
    if w.correction is None:
        return unpacked_zero_points(w), None
    if w.offset is not None:
        return np.full(w.scales.shape, w.offset_zero, np.uint8), w.offset
    return unpacked_zero_points(w), np.ascontiguousarray(w.correction.T)


def dequantize_rows(w: NBitsWeight) -> np.ndarray:
    """W [N, K] float32 as `row_form` defines it: what the graph's table lookup computes."""
    zero, added = row_form(w)
    blocks = w.scales.shape[1]
    q = _codes(w).astype(np.float32)
    zp = np.full((w.n, blocks), 1 << (w.bits - 1), np.uint8) if zero is None else zero
    x = (q - zp[..., None].astype(np.float32)) * w.scales[..., None]
    if added is not None:
        x = x + added[..., None]
    return x.reshape(w.n, -1)[:, : w.k]


def _codes(w: NBitsWeight) -> np.ndarray:
    """Codes [N, K/bs, bs] uint8."""
    blocks = w.scales.shape[1]
    if w.bits == 4:
        return np.stack([w.B & 0x0F, w.B >> 4], axis=-1).reshape(w.n, blocks, w.block_size)
    return w.B.reshape(w.n, blocks, w.block_size)


def dequantize(w: NBitsWeight, rows: int = 8192) -> np.ndarray:
    """W [N, K] float32 from the operands, by MatMulNBits' definition ((q - zp) * scale [+
    correction]), `rows` rows at a time (no full-size temporaries)."""
    out = np.empty((w.n, w.k), np.float32)
    for start in range(0, w.n, rows):
        out[start : start + rows] = _dequantize_rows(
            w.rows(np.arange(start, min(start + rows, w.n)))
        )
    return out


def _dequantize_rows(w: NBitsWeight) -> np.ndarray:
    blocks = w.scales.shape[1]
    zero = unpacked_zero_points(w)
    zp = np.full((w.n, blocks), 1 << (w.bits - 1), np.uint8) if zero is None else zero
    # [N, K/bs, bs]
    x = (_codes(w).astype(np.float32) - zp[..., None].astype(np.float32)) * w.scales[..., None]
    if w.correction is not None:
        x = x + w.correction.T[..., None]
    return x.reshape(w.n, -1)[:, : w.k]
