"""Each weight written at the bundle's precision as it is read: fp32 MatMul, or MatMulNBits blocks
(int4 / int8).

Low-bit blocks come from the checkpoint itself when it has them (a GGUF's exact operands,
`Checkpoint.nbits`: no re-quantisation, Q4_* at 4 bits, Q5_* to Q8_0 and Q6_K at 8), else from the
float weight by onnxruntime's round-to-nearest block quantiser (models/nbits.rtn), one tensor at a
time: read, quantised, appended, dropped. Affine GGUF blocks add `blocksum(x) @ correction`
(models/nbits.py), the block sums of one input computed once for every weight that reads it.

The embedding / tied LM head is one table for the target and the drafter (`shared.onnx.data`): at 4
or 8 bits GatherBlockQuantized reads it for the embedding and MatMulNBits for the head, the scales
stored in each op's rank.

>>> y = matmul(g, "x", Weight.named(ckpt, "model.layers.0.mlp.up_proj.weight"))  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..models.nbits import concat_rows, dequantize, dequantize_rows, row_form, rtn

# onnxruntime's contrib-op domain (MatMulNBits, GroupQueryAttention, ...): graph_builder.MS
MS = "com.microsoft"
# fp16: float weights stored as float16 (graph_builder)
BITS = {
    "fp32": 0,
    "fp16": 0,
    "int8": 8,
    "int4": 4,
}


@dataclass(frozen=True)
class WeightFormat:
    """How a graph's MatMul weights are stored. precision: fp32 | fp16 | int8 | int4 (the graph's
    own layers); table_bits: the shared embedding / LM head (0: fp32, 4, 8); accuracy_level:
    MatMulNBits' activations, 4 = int8 per row and block: onnxruntime 1.32's only CPU kernels whose
    rows do not depend on how many share the call (decode rows equal verify rows: lossless), and the
    fast ones; 0 = fp32 (exact arithmetic, but a separate M=1 kernel, and 8-bit weights ~50x slower:
    docs/BENCHMARKS.md); exact: take a checkpoint's own low-bit blocks."""

    precision: str = "fp32"
    table_bits: int = 0
    block_size: int = 32
    accuracy_level: int = 4
    exact: bool = True
    standard: bool = False  # low-bit weights as blocked DequantizeLinear (export/dq_format.py)
    tensorrt: bool = False  # ... re-quantised to TensorRT's weight-only rules (dq_format.py)

    def __post_init__(self):
        if self.precision not in BITS:
            raise ValueError(
                f"weight precision {self.precision!r}: choose one of {', '.join(BITS)}"
            )

    @property
    def bits(self) -> int:
        return BITS[self.precision]

    def to_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "accuracy_level": self.accuracy_level,
            "table_bits": self.table_bits,
            "exact_low_bit_source": self.exact,
            "low_bit_ops": "tensorrt"
            if self.tensorrt
            else ("standard" if self.standard else "contrib"),
        }


@dataclass
class FormatLog:
    """What the writer did per weight, for the manifest: {graph: {source type: count}} and
    re-quantised low-bit."""

    sources: dict = field(default_factory=dict)
    requantised: dict = field(default_factory=dict)
    # (checkpoint root, weight) -> its operands' recipe, for parity
    stored: dict = field(default_factory=dict)

    def count(self, graph: str, qtype: str) -> None:
        self.sources.setdefault(graph, Counter())[qtype] += 1


class Layout(NamedTuple):
    """What a MatMulNBits node needs to know of its weight without reading it (kept per weight for
    the export)."""

    bits: int
    block_size: int
    n: int
    k: int
    zero_points: bool
    correction: bool
    qtype: str

    @classmethod
    def of(cls, w) -> "Layout":
        return cls(
            w.bits,
            w.block_size,
            w.n,
            w.k,
            w.zero_points is not None,
            w.correction is not None,
            w.qtype,
        )

    def packs_with(self) -> tuple:
        """What weights stacked into one MatMulNBits must share."""
        return self.bits, self.block_size, self.zero_points


def _operands(g, ckpt, name: str, bits: int):
    """NBitsWeight of checkpoint weight `name` [N, K]: its exact low-bit blocks when it has them,
    else RTN."""
    fmt = g.fmt
    if fmt.tensorrt:  # TensorRT's blocks, never the source's (export/dq_format.py)
        from .dq_format import tensorrt_operands

        return tensorrt_operands(g, ckpt, name, bits)
    exact = ckpt.nbits(name) if fmt.exact else None
    if exact is not None:
        g.log.stored[(ckpt.root, name)] = ("exact",)
        return exact
    source = ckpt.unmapped_low_bit().get(name)
    if source and name not in g.log.requantised:
        g.log.requantised[name] = source
        print(
            f"export: warning: {name} is GGUF {source}, which has no exact MatMulNBits form; "
            f"re-quantised to {bits}-bit blocks of {fmt.block_size} (round to nearest)",
            file=sys.stderr,
        )
    g.log.stored[(ckpt.root, name)] = ("rtn", bits, fmt.block_size)
    return rtn_from(ckpt, name, bits, fmt.block_size)


def rtn_from(ckpt, name: str, bits: int, block_size: int):
    """Checkpoint weight `name` re-quantised a chunk of rows at a time, read from disk per chunk."""
    return rtn(lambda rows: ckpt.array(name, rows=rows), bits, block_size, shape=ckpt.shape(name))


def _lazy(g, key: str, build):
    """(layout, getter) of weight `key`: `build()` runs at most once per export, and only when a
    tensor of it is not stored yet (the fused target re-references the portable target's weights
    without reading them). `getter(field)` is a function making that field of the weight;
    `getter(None)` makes the whole NBitsWeight."""
    layouts = g.store.layouts
    memo = {}

    def get(field_name):
        def make():
            if "w" not in memo:
                memo["w"] = build()
            return memo["w"] if field_name is None else getattr(memo["w"], field_name)

        return make

    if key not in layouts:
        w = memo["w"] = build()
        layouts[key] = Layout.of(w)
    return layouts[key], get


def nbits_node(g, x: str, key: str, lazy, out: str | None = None, shared: str | None = None) -> str:
    """MatMulNBits(x) (+ blocksum(x) @ correction) for the weight stored under `key` (`lazy`:
    `_lazy`'s pair)."""
    lay, get = lazy
    if g.fmt.standard:  # DequantizeLinear + MatMul (the correction below, as here)
        from .dq_format import dq_matmul

        y = dq_matmul(g, x, key, lazy, out if not lay.correction else None, shared)
        return _corrected(g, x, y, (key, lazy, shared), out)
    inputs = [
        x,
        g.init(f"{key}_Q{lay.bits}", get("B"), _share(shared, "B")),
        g.init(f"{key}_scales", get("scales"), _share(shared, "scales")),
    ]
    if lay.zero_points:
        inputs.append(
            g.init(f"{key}_zero_points", get("zero_points"), _share(shared, "zero_points"))
        )
    attrs = {"K": lay.k, "N": lay.n, "bits": lay.bits, "block_size": lay.block_size}
    if g.fmt.accuracy_level:
        attrs["accuracy_level"] = g.fmt.accuracy_level
    y = g.op("MatMulNBits", inputs, None if lay.correction else out, domain=MS, **attrs)
    return _corrected(g, x, y, (key, lazy, shared), out)


def _corrected(g, x: str, y: str, stored: tuple, out: str | None = None) -> str:
    """y + blocksum(x) @ correction for an affine weight (`stored`: its key, `_lazy` pair and
    shared name); y itself otherwise."""
    key, (lay, get), shared = stored
    if lay.correction:
        # [.., N]
        corr = g.op(
            "MatMul",
            [
                block_sums(g, x, lay.k, lay.block_size),
                g.init(f"{key}_correction", get("correction"), _share(shared, "correction")),
            ],
        )
        y = g.op("Add", [y, corr], out)
    return y


def _share(shared: str | None, part: str) -> str | None:
    return None if shared is None else f"{shared}.{part}"


def block_sums(g, x: str, k: int, bs: int) -> str:
    """Sums of x over each block of `bs` inputs, [.., K] -> [.., K/bs], once per (x, bs): one MatMul
    on a 0/1 matrix [K, K/bs] (5% faster decode than Reshape + ReduceSum: two ops per input;
    docs/BENCHMARKS.md)."""
    key = ("block_sums", x, bs)
    if key not in g.memo:
        # [K, K/bs]
        ones = g.init(
            f"block_sum_{k}_{bs}",
            lambda: np.kron(np.eye(k // bs, dtype=np.float32), np.ones((bs, 1), np.float32)),
        )
        g.memo[key] = g.op("MatMul", [x, ones])  # [.., K/bs]
    return g.memo[key]


class Weight(NamedTuple):
    """One MatMul's weight: checkpoint tensors `names` [N_i, K] (several: packed along N, as q/k/v
    are) stored under `key`; `shared`: its key in the shared file (None: the graph's own)."""

    ckpt: object
    names: list[str]
    key: str
    shared: str | None = None

    @classmethod
    def named(cls, ckpt, name: str) -> "Weight":
        """The one checkpoint tensor `name`, stored under its own name."""
        return cls(ckpt, [name], name)


def matmul(g, x: str, w: Weight, out: str | None = None, bits: int | None = None) -> str:
    """x @ [W_1; W_2; ..]^T for the weight `w`; `out`: the output's name (None: a fresh one);
    `bits`: 0 / 4 / 8 instead of the graph's precision (an untied LM head follows the table's)."""
    ckpt, names, key, shared = w
    bits = g.fmt.bits if bits is None else bits
    if bits == 0:
        # [K, sum N]
        make = (
            (lambda: ckpt.array(names[0]).T)
            if len(names) == 1
            else (lambda: np.concatenate([ckpt.array(n) for n in names]).T)
        )
        return g.op("MatMul", [x, g.init(f"{key}.T", make, shared)], out)
    lazies = {n: _lazy(g, n, lambda n=n: _operands(g, ckpt, n, bits)) for n in names}
    for layout, _ in lazies.values():
        g.log.count(g.graph, layout.qtype)
    if len(names) == 1:  # `key` is the weight's own name
        return nbits_node(g, x, key, lazies[names[0]], out, shared)
    # one MatMulNBits, rows stacked
    if len({layout.packs_with() for layout, _ in lazies.values()}) == 1:
        # read once
        packed = _lazy(g, key, lambda: concat_rows([get(None)() for _, get in lazies.values()]))
        return nbits_node(g, x, key, packed, out, shared)
    parts = [nbits_node(g, x, n, lazies[n]) for n in names]
    return g.op("Concat", parts, out, axis=-1)


class Table:
    """The embedding table [V, H], also the tied LM head: fp32, or `bits`-bit blocks, stored once
    for all graphs.

    Blocks are the source's own when it has them (a GGUF's, any mapped type): a lookup gathers the
    rows' codes with GatherBlockQuantized ((q - zero) * scale) and adds the rows' offsets (affine
    types), so each row is the GGUF's dequantisation bit for bit (models/nbits.row_form); the tied
    head reads the same codes with MatMulNBits. Other sources are re-quantised (RTN)."""

    def __init__(self, g, ckpt, name: str):
        self.g, self.ckpt, self.name = g, ckpt, name
        self.bits = g.fmt.table_bits
        # rows not whole blocks: GatherBlockQuantized cannot take them
        if ckpt.shape(name)[1] % g.fmt.block_size:
            self.bits = 0
        if self.bits == 0:
            self.fp32 = g.init(name, lambda: ckpt.array(name), shared="embed_tokens")
            return
        self.key = f"{name}_table{self.bits}"
        self.layout, get = _lazy(g, self.key, self._build)
        g.log.count(g.graph, self.layout.qtype)
        self.get = get  # the scales are stored by the op that reads them (in its rank)
        self._form = None  # row_form of the blocks, computed on first use
        self._lookup_operands()

    def _lookup_operands(self) -> None:
        """The lookup's codes, and whether it needs zero points / offsets (decided on the export's
        first use of the table, when its blocks were just built)."""
        g = self.g
        self.B = g.init(f"{self.key}_Q{self.layout.bits}", self.get("B"), "embed_tokens.B")
        layouts = g.store.layouts
        if f"{self.key}_rows" not in layouts:
            layouts[f"{self.key}_rows"] = tuple(p is not None for p in self._row_form())
        self.gather_zero, self.gather_add = layouts[f"{self.key}_rows"]

    def _row_form(self) -> tuple:
        """models/nbits.row_form of the table's blocks: (zero points, offsets) [V, H/bs] or None."""
        if self._form is None:
            self._form = row_form(self.get(None)())
        return self._form

    def _row_part(self, i: int):
        """Lazy row_form part `i` as [V, H/bs, 1] (an initializer's value)."""

        def make():
            part = self._row_form()[i]
            return None if part is None else part[..., None]

        return make

    def _build(self):
        """The source's own blocks when it has them (exact), else RTN at `bits`."""
        g, name = self.g, self.name
        exact = self.ckpt.nbits(name) if g.fmt.exact else None
        if exact is not None:
            g.log.stored[(self.ckpt.root, name)] = ("rows",)
            return exact
        source = self.ckpt.unmapped_low_bit().get(name)
        if source and name not in g.log.requantised:
            g.log.requantised[name] = source
            print(
                f"export: warning: the embedding table is GGUF {source}, which has no exact "
                f"MatMulNBits form; re-quantised to {self.bits}-bit blocks (round to nearest)",
                file=sys.stderr,
            )
        g.log.stored[(self.ckpt.root, name)] = ("rtn", self.bits, g.fmt.block_size)
        return rtn_from(self.ckpt, name, self.bits, g.fmt.block_size)

    def gather(self, ids: str) -> str:
        """Rows `ids` [*] -> [*, H]."""
        g = self.g
        if self.bits == 0:
            return g.op("Gather", [self.fp32, ids], axis=0)
        bits, bs, k = self.layout.bits, self.layout.block_size, self.layout.k
        # [V, H/bs, 1]
        scales3 = g.init(
            f"{self.key}_gather_scales",
            lambda: self.get("scales")()[:, :, None],
            "embed_tokens.gather_scales",
        )
        inputs = [self.B, ids, scales3]
        if self.gather_zero:  # [V, H/bs, 1] uint8, one per block (4-bit ones too)
            inputs.append(
                g.init(f"{self.key}_gather_zero", self._row_part(0), "embed_tokens.gather_zero")
            )
        # [*ids, H/bs, bs]
        blocks = g.op(
            "GatherBlockQuantized",
            inputs,
            domain=MS,
            gather_axis=0,
            quantize_axis=2,
            block_size=bs,
            bits=bits,
        )
        if self.gather_add:  # the rows' offsets, [*ids, H/bs, 1]
            add = g.init(f"{self.key}_gather_add", self._row_part(1), "embed_tokens.gather_add")
            blocks = g.op("Add", [blocks, g.op("Gather", [add, ids], axis=0)])
        shape = g.op("Concat", [g.op("Shape", [ids]), g.const([k])], axis=0)
        return g.op("Reshape", [blocks, shape])  # [*ids, H]

    def head(self, flat: str) -> str:
        """Logits [T, V] of rows `flat` [T, H] (the tied LM head)."""
        g = self.g
        if self.bits == 0:
            return g.op("Gemm", [flat, self.fp32], transB=1)
        return nbits_node(g, flat, self.key, (self.layout, self.get), shared="embed_tokens")


class StoredWeights:
    """A checkpoint whose `array(name)` gives each weight as the bundle stores it (its blocks
    dequantised), for parity at the bundle's own precision; every other member is the
    checkpoint's."""

    def __init__(self, ckpt, log: FormatLog):
        self.ckpt, self.recipes = (
            ckpt,
            {n: r for (root, n), r in log.stored.items() if root == ckpt.root},
        )
        self._blocks: tuple = (None, None)  # the last exact weight's blocks (name, NBitsWeight)

    def __getattr__(self, item):
        return getattr(self.ckpt, item)

    def array(self, name: str, shape=None, rows=None, chunk: int = 8192):

        recipe = self.recipes.get(name)
        if recipe is None:
            return self.ckpt.array(name, shape, rows)
        if recipe[0] in ("exact", "rows"):  # the blocks read once (a table: row after row)
            if self._blocks[0] != name:
                self._blocks = (name, self.ckpt.nbits(name))
            w = (
                self._blocks[1]
                if rows is None
                else self._blocks[1].rows(np.arange(*rows.indices(self._blocks[1].n)))
            )
            rows_of = dequantize if recipe[0] == "exact" else dequantize_rows  # the lookup's form
            return rows_of(w).reshape(-1, *self.ckpt.shape(name)[1:])
        # re-quantised `chunk` rows at a time: never the blocks of all of W
        n = self.ckpt.shape(name)[0]
        start, stop, _ = (rows or slice(None)).indices(n)
        out = np.empty((max(stop - start, 0), *self.ckpt.shape(name)[1:]), np.float32)
        for at in range(start, stop, chunk):
            part = slice(at, min(at + chunk, stop))
            rows = self.ckpt.array(name, rows=part)
            if recipe[0] == "channel":  # TensorRT's per-channel int8 (export/dq_format.py)
                from .dq_format import per_channel

                block = per_channel(rows)
            else:
                block = rtn(rows, *recipe[1:])
            out[at - start : part.stop - start] = dequantize(block).reshape(-1, *out.shape[1:])
        return out
