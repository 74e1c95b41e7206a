"""Low-bit weights in standard ONNX: blocked DequantizeLinear (opset 21) feeding MatMul / Gather,
the form TensorRT parses for weight-only int4 / int8 (and no onnxruntime contrib op).

The numbers are weight_format's: each weight's `NBitsWeight` (a GGUF's own blocks, or round-to-
nearest ones), rewritten, never re-quantised. For y = x @ W^T, W [N, K]:

    codes        [K, N] int4 / int8: q - zero_point (the op's default zero point, 2^(bits-1),
                 folded into signed codes; a weight whose codes minus zero point do not fit is
                 stored unsigned, uint4 / uint8, with its zero points [K/bs, N])
    scales       float32 [K/bs, N]
    W^T        = DequantizeLinear(codes, scales, axis=0, block_size=bs)  -> MatMul(x, W^T)

and an affine GGUF type's correction stays weight_format's extra term, blocksum(x) @ correction
(standard MatMul / Add). onnxruntime's CPU provider (1.32) fuses DequantizeLinear + MatMul back into
its MatMulNBits kernel at session creation (accuracy level from the session option
`session.qdq_matmulnbits_accuracy_level`, default 4), bit for bit what the contrib form computes, so
every flavour reads these initializers: one copy (docs/BENCHMARKS.md).

The embedding table is dq_table.py's. `--low-bit-ops tensorrt` re-quantises instead
(`tensorrt_operands`: TensorRT's INT4 blocks of 128 / 64, INT8 per channel).

>>> key = "model.layers.0.mlp.down_proj.weight"  # doctest: +SKIP
>>> y = dq_matmul(g, "x", key, layout, get)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from ..models.nbits import NBitsWeight, rtn
from .weight_store import Packed

TRT_INT4_BLOCKS = (128, 64)  # TensorRT's INT4 weight-only blocks


def tensorrt_operands(g, ckpt, name: str, bits: int) -> NBitsWeight:
    """Checkpoint weight `name` [N, K] re-quantised to TensorRT's weight-only rules (`--low-bit-ops
    tensorrt`), from its float values (a GGUF's blocks dequantised first): int4 round to nearest in
    blocks of 128 (64 where K is no multiple of 128), int8 one scale per output channel."""
    n, k = ckpt.shape(name)
    if bits == 4:
        block = next((b for b in TRT_INT4_BLOCKS if k % b == 0), TRT_INT4_BLOCKS[-1])
        g.log.stored[(ckpt.root, name)] = ("rtn", 4, block)
        return rtn(lambda rows: ckpt.array(name, rows=rows), 4, block, shape=(n, k))
    g.log.stored[(ckpt.root, name)] = ("channel",)
    return per_channel(lambda rows: ckpt.array(name, rows=rows), shape=(n, k))


def per_channel(weight, rows: int = 8192, shape=None) -> NBitsWeight:
    """W [N, K] float -> symmetric int8 codes with one scale per output row (a single block of K:
    TensorRT's per-channel INT8 weights), round to nearest; `weight` an array or `read(row_slice)`
    with `shape`, as `rtn`."""
    read = weight if callable(weight) else (lambda sl: weight[sl])
    n, k = shape or weight.shape
    codes = np.zeros((n, 1, k), np.uint8)
    scales = np.zeros((n, 1), np.float32)
    for start in range(0, n, rows):
        chunk = np.asarray(read(slice(start, start + rows)), np.float32)  # [r, K]
        peak = np.abs(chunk).max(axis=1, initial=0.0)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(chunk / scale[:, None]), -127, 127).astype(np.int16) + 128
        codes[start : start + rows, 0], scales[start : start + rows, 0] = q, scale
    return NBitsWeight(8, k, n, k, codes, scales, None, None, "rtn")


def codes(w: NBitsWeight) -> tuple[np.ndarray, np.ndarray]:
    """(q [N, K] uint8 codes, zero points [N, K/bs] int16) of `w` (MatMulNBits' layout
    unpacked)."""
    blocks = w.scales.shape[1]
    if w.bits == 4:
        q = np.stack([w.B & 0x0F, w.B >> 4], axis=-1).reshape(w.n, -1)
    else:
        q = w.B.reshape(w.n, -1)
    if w.zero_points is None:
        zp = np.full((w.n, blocks), 1 << (w.bits - 1), np.int16)
    elif w.bits == 4:
        zp = np.stack([w.zero_points & 0x0F, w.zero_points >> 4], axis=-1).reshape(w.n, -1)
        zp = zp[:, :blocks].astype(np.int16)
    else:
        zp = w.zero_points.astype(np.int16)
    return q[:, : w.k], zp


def _centred(w: NBitsWeight) -> np.ndarray:
    """q - zero point [N, K] (int8 when the zero point is the op's default, else int16)."""
    q, zp = codes(w)
    if w.zero_points is None:  # 2^(bits-1): no int16 temporaries (a table is V*H codes)
        return (q ^ 0x80).view(np.int8) if w.bits == 8 else q.astype(np.int8) - np.int8(8)
    return q.astype(np.int16) - np.repeat(zp, w.block_size, axis=1)[:, : w.k]


def signed_fits(w: NBitsWeight) -> bool:
    """Whether `w`'s codes minus zero points fit the signed type of its width."""
    if w.zero_points is None:
        return True
    d = _centred(w)
    return bool(d.min(initial=0) >= -(1 << (w.bits - 1)) and d.max(initial=0) < 1 << (w.bits - 1))


def pack(values: np.ndarray, bits: int, signed: bool):
    """An integer array as onnx stores it: int8 / uint8 as they are, 4-bit as `Packed` (two a byte,
    low nibble first, in row-major order)."""
    if bits == 8:
        return np.ascontiguousarray(values, np.int8 if signed else np.uint8)
    flat = (values.reshape(-1) & 0x0F).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    data = flat[0::2] | (flat[1::2] << 4)
    return Packed(data, "int4" if signed else "uint4", tuple(values.shape))


def weight_codes(w: NBitsWeight, signed: bool):
    """The DequantizeLinear input [K, N] of `w`: signed centred codes, or the unsigned ones."""
    values = _centred(w) if signed else codes(w)[0]
    return pack(values.T, w.bits, signed)


def weight_zero_points(w: NBitsWeight):
    """Zero points [K/bs, N] of an unsigned weight (uint4 / uint8)."""
    return pack(codes(w)[1].T, w.bits, signed=False)


def dq_matmul(g, x: str, key: str, lazy, out: str | None = None, shared: str | None = None):
    """x @ DequantizeLinear(codes, scales[, zero points])^T for the weight stored under `key`
    (`lazy`: weight_format._lazy's pair); the correction, if any, is the caller's."""
    lay, get = lazy
    if g.fmt.tensorrt and lay.bits == 8:  # one scale per output channel (tensorrt_operands)
        return _per_channel_matmul(g, x, key, get, out, shared)
    signed = _signedness(g, key, get)
    weight = lambda: get(None)()  # noqa: E731
    inputs = [
        g.init(f"{key}_DQ{lay.bits}", lambda: weight_codes(weight(), signed), _share(shared, "DQ")),
        g.init(
            f"{key}_DQscales",
            lambda: np.ascontiguousarray(weight().scales.T),
            _share(shared, "DQscales"),
        ),
    ]
    if not signed:
        inputs.append(
            g.init(
                f"{key}_DQzero_points",
                lambda: weight_zero_points(weight()),
                _share(shared, "DQzero_points"),
            )
        )
    w_t = g.op("DequantizeLinear", inputs, axis=0, block_size=lay.block_size)  # [K, N]
    return g.op("MatMul", [x, w_t], out)


def _per_channel_matmul(g, x: str, key: str, get, out, shared) -> str:
    """x @ DequantizeLinear(codes [K, N] int8, scales [N], axis=1)."""
    weight = lambda: get(None)()  # noqa: E731
    codes = g.init(
        f"{key}_DQ8", lambda: pack(_centred(weight()).T, 8, signed=True), _share(shared, "DQ")
    )
    # [N]
    scales = g.init(
        f"{key}_DQscales",
        lambda: np.ascontiguousarray(weight().scales[:, 0]),
        _share(shared, "DQscales"),
    )
    w_t = g.op("DequantizeLinear", [codes, scales], axis=1)  # [K, N]
    return g.op("MatMul", [x, w_t], out)


def _share(shared: str | None, part: str) -> str | None:
    return None if shared is None else f"{shared}.{part}"


def _signedness(g, key: str, get) -> bool:
    """Signed codes for `key`? Decided once per export (a later graph re-references the weight
    without reading it)."""
    memo = g.store.layouts
    if ("dq_signed", key) not in memo:
        memo[("dq_signed", key)] = signed_fits(get(None)())
    return memo[("dq_signed", key)]
