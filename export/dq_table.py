"""The embedding table (and the tied LM head) in standard ops: `weight_format.Table`'s numbers as
DequantizeLinear (export/dq_format.py), stored once in the shared file for every graph.

int8 codes [H, V] with scales [H/bs, V], stored once and named twice (the head's and the lookup's:
onnxruntime fuses only a DequantizeLinear whose initializers nothing else reads): the head is
DequantizeLinear -> MatMul like any weight; a lookup gathers the rows' codes and scales first and
dequantises only those (DequantizeLinear -> Gather dequantises all V rows on every call in
onnxruntime: 0.4 s a step for a 151,936-row table). A 4-bit table's codes are widened to int8
(standard Gather takes no int4). `--low-bit-ops tensorrt`: int8 codes [V, H] with one scale per row,
one DequantizeLinear read by the lookup's Gather and the head's Gemm.

>>> embed = embedding_table(g, ckpt, "model.embed_tokens.weight")  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from .dq_format import _centred, pack, per_channel
from .weight_format import Table, _corrected


def embedding_table(g, ckpt, name: str) -> Table:
    """The table of graph `g`: in standard ops when `g.fmt.standard`, else weight_format's."""
    return (DqTable if g.fmt.standard else Table)(g, ckpt, name)


class DqTable(Table):
    """weight_format.Table in standard ops: int8 codes [H, V] and scales [H/bs, V] (tensorrt: [V, H]
    and [V])."""

    def _lookup_operands(self) -> None:
        """Nothing ahead: the lookup's and head's initializers are named where they are read."""

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
            # [V, H]
            codes = g.init(
                f"{self.key}_DQ8",
                lambda: pack(_centred(weight()), 8, signed=True),
                "embed_tokens.DQ",
            )
            # [V]
            scales = g.init(
                f"{self.key}_DQscales",
                lambda: np.ascontiguousarray(weight().scales[:, 0]),
                "embed_tokens.DQscales",
            )
            g.memo["trt_table"] = g.op("DequantizeLinear", [codes, scales], axis=0)  # [V, H]
        return g.memo["trt_table"]

    def _operands(self, use: str) -> tuple[str, str]:
        """(codes [H, V], scales [H/bs, V]) initializers for `use` ("head" or "rows"): the same
        bytes on disk under two names (the store keeps one copy), because onnxruntime fuses a
        DequantizeLinear into MatMulNBits only when nothing else reads its initializers."""
        g, suffix = self.g, "" if use == "head" else "_rows"
        weight = lambda: self.get(None)()  # noqa: E731
        # [H, V]
        codes = g.init(
            f"{self.key}_DQ8{suffix}",
            lambda: pack(_centred(weight()).T, 8, signed=True),
            f"embed_tokens.DQ{suffix}",
        )
        # [H/bs, V]
        scales = g.init(
            f"{self.key}_DQscales{suffix}",
            lambda: np.ascontiguousarray(weight().scales.T),
            f"embed_tokens.DQscales{suffix}",
        )
        return codes, scales

    def gather(self, ids: str) -> str:
        """Rows `ids` [*] -> [*, H]: the rows' codes and scales gathered, then dequantised; an
        affine GGUF table adds its rows' own offsets (models/nbits.row_form: bit for bit gguf's
        dequantisation, as weight_format.Table)."""
        g = self.g
        if self.bits == 0:
            return g.op("Gather", [self.fp32, ids], axis=0)
        if g.fmt.tensorrt:
            return g.op("Gather", [self._rows_table(), ids], axis=0)
        zero, added = self._row_terms()
        codes, scales = self._operands("rows")
        flat = g.op("Reshape", [ids, g.const([-1])])  # [n]
        inputs = [g.op("Gather", [t, flat], axis=1) for t in (codes, scales)]  # [H | H/bs, n]
        if zero is not None:  # (q - zero) from the stored q - 2^(bits-1): a zero point per block
            inputs.append(g.op("Gather", [zero, flat], axis=1))
        bs, k = self.layout.block_size, self.layout.k
        rows = g.op("DequantizeLinear", inputs, axis=0, block_size=bs)
        rows = g.op("Transpose", [rows], perm=[1, 0])  # [n, H]
        if added is not None:  # + the rows' offsets, one per block
            blocks = g.op("Reshape", [rows, g.const([0, k // bs, bs])])
            offsets = g.op("Gather", [added, flat], axis=0)  # [n, H/bs, 1]
            rows = g.op("Reshape", [g.op("Add", [blocks, offsets]), g.const([0, k])])
        shape = g.op("Concat", [g.op("Shape", [ids]), g.const([k])], axis=0)
        return g.op("Reshape", [rows, shape])  # [*ids, H]

    def _row_terms(self) -> tuple[str | None, str | None]:
        """(zero points [H/bs, V] int8 relative to the stored codes' 2^(bits-1), offsets
        [V, H/bs, 1] float32) initializers of a looked-up row, each None when not needed."""
        g, key = self.g, f"{self.key}_dq_rows"
        if key not in g.store.layouts:  # first use: the blocks were just built
            shift = self._zero_shift()
            if shift is not None and (shift.min() < -128 or shift.max() > 127):
                raise ValueError(f"{self.name}: zero points out of int8 range after centring")
            need_add = self._row_form()[1] is not None
            g.store.layouts[key] = (shift is not None and bool(shift.any()), need_add)
        need_zero, need_add = g.store.layouts[key]
        # [H/bs, V]
        zero = (
            g.init(
                f"{self.key}_DQzero_rows",
                lambda: np.ascontiguousarray(self._zero_shift().T.astype(np.int8)),
                "embed_tokens.DQzero_rows",
            )
            if need_zero
            else None
        )
        # [V, H/bs, 1]
        added = (
            g.init(f"{self.key}_DQoffsets", self._row_part(1), "embed_tokens.DQoffsets")
            if need_add
            else None
        )
        return zero, added

    def _zero_shift(self):
        """A looked-up row's zero points minus the stored codes' own (int16 [V, H/bs]), or None."""
        zero = self._row_form()[0]
        if zero is None:
            return None
        w = self.get(None)()
        return zero.astype(np.int16) - (0 if w.zero_points is not None else 1 << (w.bits - 1))

    def head(self, flat: str) -> str:
        """Logits [T, V] of rows `flat` [T, H]."""
        g = self.g
        if self.bits == 0:
            return g.op("Gemm", [flat, self.fp32], transB=1)
        if g.fmt.tensorrt:
            return g.op("Gemm", [flat, self._rows_table()], transB=1)
        # [H, V]
        w_t = g.op(
            "DequantizeLinear",
            list(self._operands("head")),
            axis=0,
            block_size=self.layout.block_size,
        )
        y = g.op("MatMul", [flat, w_t])
        return _corrected(g, flat, y, (self.key, (self.layout, self.get), "embed_tokens"))
