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

The embedding table (the tied LM head) is int8 codes [H, V] with scales [H/bs, V], stored once and
named twice (the head's and the lookup's: onnxruntime fuses only a DequantizeLinear whose
initializers nothing else reads): the head is DequantizeLinear -> MatMul like any weight; a lookup
gathers the rows' codes and scales first and dequantises only those (DequantizeLinear -> Gather
dequantises all V rows on every call in onnxruntime: 0.4 s a step for a 151,936-row table). A
4-bit table's codes are widened to int8 (standard Gather takes no int4).

>>> key = "model.layers.0.mlp.down_proj.weight"  # doctest: +SKIP
>>> y = dq_matmul(g, "x", key, layout, get)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from ..models.nbits import NBitsWeight
from .weight_format import Table, _lazy, _share, rtn_from
from .weight_store import Packed

TRT_INT4_BLOCKS = (128, 64)  # TensorRT's INT4 weight-only blocks (engines/op_support.WEIGHT_ONLY)


def tensorrt_operands(g, ckpt, name: str, bits: int) -> NBitsWeight:
    """Checkpoint weight `name` [N, K] re-quantised to TensorRT's weight-only rules (`--low-bit-ops
    tensorrt`), from its float values (a GGUF's blocks dequantised first): int4 round to nearest in
    blocks of 128 (64 where K is no multiple of 128), int8 one scale per output channel."""
    n, k = ckpt.shape(name)
    if bits == 4:
        block = next((b for b in TRT_INT4_BLOCKS if k % b == 0), TRT_INT4_BLOCKS[-1])
        g.log.stored[(ckpt.root, name)] = ("rtn", 4, block)
        return rtn_from(ckpt, name, 4, block)
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
    w_t = g.op("DequantizeLinear", inputs, axis=0, block_size=lay.block_size)[0]  # [K, N]
    return g.op("MatMul", [x, w_t], [out] if out else 1)[0]


def _per_channel_matmul(g, x: str, key: str, get, out, shared) -> str:
    """x @ DequantizeLinear(codes [K, N] int8, scales [N], axis=1)."""
    weight = lambda: get(None)()  # noqa: E731
    codes = g.init(
        f"{key}_DQ8", lambda: pack(_centred(weight()).T, 8, signed=True), _share(shared, "DQ")
    )
    scales = g.init(
        f"{key}_DQscales",
        lambda: np.ascontiguousarray(weight().scales[:, 0]),
        _share(shared, "DQscales"),
    )  # [N]
    w_t = g.op("DequantizeLinear", [codes, scales], axis=1)[0]  # [K, N]
    return g.op("MatMul", [x, w_t], [out] if out else 1)[0]


def _signedness(g, key: str, get) -> bool:
    """Signed codes for `key`? Decided once per export (a later graph re-references the weight
    without reading it)."""
    memo = g.store.layouts
    if ("dq_signed", key) not in memo:
        memo[("dq_signed", key)] = signed_fits(get(None)())
    return memo[("dq_signed", key)]


class DqTable(Table):
    """weight_format.Table in standard ops (Table(g, ...) is one when `g.fmt.standard`): int8
    codes [H, V] and scales [H/bs, V], stored once in the shared file for every graph."""

    def __init__(self, g, ckpt, name: str):
        self.g, self.ckpt, self.name = g, ckpt, name
        self.bits = g.fmt.table_bits
        if ckpt.shape(name)[1] % g.fmt.block_size:  # rows not whole blocks
            self.bits = 0
        if self.bits == 0:
            self.fp32 = g.init(name, lambda: ckpt.array(name), shared="embed_tokens")
            return
        self.key = f"{name}_table{self.bits}"
        self.layout, self.get = _lazy(g, self.key, self._build)  # no zero points, no correction
        g.log.count(g.graph, self.layout.qtype)

    def _build(self):
        if not self.g.fmt.tensorrt:
            return super()._build()
        self.g.log.stored[(self.ckpt.root, self.name)] = ("channel",)  # one scale per token row
        shape = self.ckpt.shape(self.name)
        return per_channel(lambda rows: self.ckpt.array(self.name, rows=rows), shape=shape)

    def _rows_table(self) -> str:
        """TensorRT's form: the table [V, H] dequantised (int8, one scale per row) as one
        DequantizeLinear on stored weights, read by the lookup's Gather and the head's Gemm; on a
        CPU the whole table is dequantised per call (slow: a TensorRT bundle)."""
        g = self.g
        if "trt_table" not in g.memo:
            weight = lambda: self.get(None)()  # noqa: E731
            codes = g.init(
                f"{self.key}_DQ8",
                lambda: pack(_centred(weight()), 8, signed=True),
                "embed_tokens.DQ",
            )  # [V, H]
            scales = g.init(
                f"{self.key}_DQscales",
                lambda: np.ascontiguousarray(weight().scales[:, 0]),
                "embed_tokens.DQscales",
            )  # [V]
            g.memo["trt_table"] = g.op("DequantizeLinear", [codes, scales], axis=0)[0]  # [V, H]
        return g.memo["trt_table"]

    def _operands(self, use: str) -> tuple[str, str]:
        """(codes [H, V], scales [H/bs, V]) initializers for `use` ("head" or "rows"): the same
        bytes on disk under two names (the store keeps one copy), because onnxruntime fuses a
        DequantizeLinear into MatMulNBits only when nothing else reads its initializers."""
        g, suffix = self.g, "" if use == "head" else "_rows"
        weight = lambda: self.get(None)()  # noqa: E731
        codes = g.init(
            f"{self.key}_DQ8{suffix}",
            lambda: pack(_centred(weight()).T, 8, signed=True),
            f"embed_tokens.DQ{suffix}",
        )  # [H, V]
        scales = g.init(
            f"{self.key}_DQscales{suffix}",
            lambda: np.ascontiguousarray(weight().scales.T),
            f"embed_tokens.DQscales{suffix}",
        )  # [H/bs, V]
        return codes, scales

    def gather(self, ids: str) -> str:
        """Rows `ids` [*] -> [*, H]: the rows' codes and scales gathered, then dequantised."""
        g = self.g
        if self.bits == 0:
            return g.op("Gather", [self.fp32, ids], axis=0)[0]
        if g.fmt.tensorrt:
            return g.op("Gather", [self._rows_table(), ids], axis=0)[0]
        codes, scales = self._operands("rows")
        flat = g.op("Reshape", [ids, g.const([-1])])[0]  # [n]
        q = g.op("Gather", [codes, flat], axis=1)[0]  # [H, n]
        s = g.op("Gather", [scales, flat], axis=1)[0]  # [H/bs, n]
        rows = g.op("DequantizeLinear", [q, s], axis=0, block_size=self.layout.block_size)[0]
        rows = g.op("Transpose", [rows], perm=[1, 0])[0]  # [n, H]
        shape = g.op("Concat", [g.op("Shape", [ids])[0], g.const([self.layout.k])], axis=0)[0]
        return g.op("Reshape", [rows, shape])[0]  # [*ids, H]

    def head(self, flat: str) -> str:
        """Logits [T, V] of rows `flat` [T, H]."""
        g = self.g
        if self.bits == 0:
            return g.op("Gemm", [flat, self.fp32], transB=1)[0]
        if g.fmt.tensorrt:
            return g.op("Gemm", [flat, self._rows_table()], transB=1)[0]
        w_t = g.op(
            "DequantizeLinear",
            list(self._operands("head")),
            axis=0,
            block_size=self.layout.block_size,
        )[0]  # [H, V]
        return g.op("MatMul", [flat, w_t])[0]
