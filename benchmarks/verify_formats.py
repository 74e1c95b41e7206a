"""Issue 27 part 5: which weight/compute format keeps verify(k) cheap against decode, losslessly?

A speculative step runs the target on k + 1 rows at once; decode runs its matmuls on 1 row (the
fused graph pads only attention's input with a zero row). Lossless greedy decoding needs every row
of a k-row step to be BIT-EQUAL to the same row computed alone, so this script checks that for
every format, then times it:

  ops    one MatMul-equivalent per (format, weight shape): rows of M in {2,4,8,16} against the row
         alone (M=1) and against the row padded with a zero row (M=2), over --seeds random inputs
         (one with outlier channels); error against a float64 numpy reference of the dequantised
         weight; and, on one shape, the full grid (bits 4/8 x block 16..128 x accuracy level
         0..4 x symmetric/zero points) timed at M=1, 2, 16 (medians, interleaved)
  stacks a whole model's matmuls (each layer: LayerNorm, q/k/v/o, gate/up/down, residuals; distinct
         weights per layer; then the LM head) per format, the same row checks on the logits, and
         medians of M = 1, 2, 4, 8, 16 interleaved round-robin over every (format, M), run through
         the runtime's own session options (runtime/session.py: ORT_ENABLE_ALL, sequential,
         spinning) and IOBinding

Formats (weights are random codes/scales: timing and row equality do not depend on the values):
  fp32, fp16            MatMul (fp16: Cast around each MatMul, fp16 weights)
  nbB-bS-L{l}-sym|zp    MatMulNBits, B bits, blocks of S, accuracy_level l, symmetric or uint8
                        zero points
  q41-bS-L{l}           the exact GGUF Q4_1 import (models/gguf_blocks.py): 4 bits, zero point 8,
                        plus the per-block correction blocksum(A) @ C; head 8 bits (Q8_0)
  dqmm                  com.microsoft DynamicQuantizeMatMul, int8 per-column weights, ONE
                        activation scale per tensor (DynamicQuantizeLinear inside): rows depend
                        on each other
  rowq8                 per-row activation quantisation from standard ops (ReduceMax|Abs| ->
                        Round -> uint8, zero point 128) + MatMulInteger (int8 per-column weights)
                        -> Cast -> Mul by scales

    python benchmarks/verify_formats.py --json /tmp/vf.json
    python benchmarks/verify_formats.py --shapes smollm2-135m --formats fp32,nb4-b32-L4-sym \\
        --repeats 20
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import dataclass, replace

import numpy as np
from timing import round_robin_ms


def warm_round_robin_ms(cases: dict, repeats: int) -> dict:
    """round_robin_ms over cases that each run once untimed, then once timed: every session has its
    own intra-op pool, and the first run after another session's wakes that pool (0.1-5 ms here,
    measured); the runtime runs the same target session step after step, so the warm figure is the
    one it sees."""
    import time

    def timed(fn, out):
        def case():
            fn()
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)

        return case

    got = {k: [] for k in cases}
    round_robin_ms({k: timed(fn, got[k]) for k, fn in cases.items()}, repeats, warmup=1)
    return {k: 1e3 * float(np.median(v[-repeats:])) for k, v in got.items()}


MS = "com.microsoft"


@dataclass(frozen=True)
class Shape:
    """A decoder's matmul dimensions (q: width of the query projection; kv: of each of k and v)."""

    hidden: int
    inter: int
    q: int
    kv: int
    layers: int
    vocab: int


SHAPES = {
    "smollm2-135m": Shape(576, 1536, 576, 192, 30, 49152),
    "qwen3-0.6b": Shape(1024, 3072, 2048, 1024, 28, 151936),
}


@dataclass(frozen=True)
class Format:
    kind: str  # fp32 | fp16 | nbits | dqmm | rowq8
    bits: int = 0
    block: int = 0
    level: int = 0  # MatMulNBits accuracy_level
    zp: bool = False  # uint8 zero points stored (else symmetric: the code range's centre)
    corr: bool = False  # Q4_1: zero point 8 + per-block correction matmul; head at 8 bits (Q8_0)

    @property
    def name(self) -> str:
        if self.kind != "nbits":
            return self.kind
        if self.corr:
            return f"q41-b{self.block}-L{self.level}"
        return f"nb{self.bits}-b{self.block}-L{self.level}-{'zp' if self.zp else 'sym'}"


def parse_format(name: str) -> Format:
    """'fp32', 'nb4-b32-L4-sym', 'q41-b32-L0', ... -> Format (the inverse of Format.name)."""
    if name in ("fp32", "fp16", "dqmm", "rowq8"):
        return Format(name)
    parts = name.split("-")
    try:
        if parts[0] == "q41":
            return Format("nbits", 4, int(parts[1][1:]), int(parts[2][1:]), False, True)
        if parts[0].startswith("nb") and parts[3] in ("sym", "zp"):
            return Format(
                "nbits", int(parts[0][2:]), int(parts[1][1:]), int(parts[2][1:]), parts[3] == "zp"
            )
    except (IndexError, ValueError):
        pass
    raise SystemExit(
        f"verify_formats: unknown format {name!r} (e.g. fp32, fp16, dqmm, rowq8, nb4-b32-L4-sym, "
        f"nb8-b128-L0-zp, q41-b32-L4)"
    )


STACK_FORMATS = (
    "fp32",
    "fp16",
    "nb4-b32-L0-sym",
    "nb4-b32-L4-sym",
    "nb4-b32-L4-zp",
    "q41-b32-L0",
    "q41-b32-L4",
    "nb4-b16-L4-sym",
    "nb4-b64-L4-sym",
    "nb4-b128-L4-sym",
    "nb8-b32-L4-sym",
    "nb8-b128-L4-sym",
    "dqmm",
    "rowq8",
)  # nb8 at levels 0-3 has no packed x86 kernel (~1.5 ms per 576x1536 op): grid only


class GraphWriter:
    """Nodes and initializers of one graph; weights go straight to an external data file
    (page-aligned, so onnxruntime can map them) when `data_path` is set, else inline."""

    def __init__(self, rng, data_path: str | None = None):
        self.rng, self.nodes, self.inits, self.count = rng, [], [], 0
        self.data_path, self.offset = data_path, 0
        self.body_bytes = self.head_bytes = 0
        self.cache: dict = {}  # per-input activation work shared by several matmuls
        if data_path:
            open(data_path, "wb").close()

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, array: np.ndarray, stem: str = "c") -> str:
        from onnx import TensorProto, helper, numpy_helper

        name = self.fresh(stem)
        array = np.ascontiguousarray(array)
        if self.data_path is None or array.nbytes < 4096:
            self.inits.append(numpy_helper.from_array(array, name))
            return name
        t = TensorProto(
            name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype)
        )
        t.data_location = TensorProto.EXTERNAL
        with open(self.data_path, "ab") as f:
            f.write(array.tobytes())
            pad = -array.nbytes % 4096
            f.write(b"\0" * pad)
        for key, value in (
            ("location", os.path.basename(self.data_path)),
            ("offset", str(self.offset)),
            ("length", str(array.nbytes)),
        ):
            t.external_data.add(key=key, value=value)
        self.offset += array.nbytes + pad
        self.inits.append(t)
        return name

    def weight(self, array: np.ndarray, head: bool) -> str:
        if head:
            self.head_bytes += array.nbytes
        else:
            self.body_bytes += array.nbytes
        return self.const(array, "w")

    def node(self, op: str, inputs, stem: str = "t", **attrs) -> str:
        from onnx import helper

        out = self.fresh(stem)
        domain = MS if op in ("MatMulNBits", "DynamicQuantizeMatMul") else ""
        self.nodes.append(helper.make_node(op, list(inputs), [out], domain=domain, **attrs))
        return out


# ---- one matmul y [M, n] = x [M, k] @ W [k, n] per format; returns (output name, float64 W or
# None) ----


def _nbits_weight(fmt: Format, k: int, n: int, rng):
    """Random MatMulNBits operands and the weight they dequantise to ([k, n] float64)."""
    bits, bs = fmt.bits, fmt.block
    nb = -(-k // bs)  # a last partial block is padded (MatMulNBits ignores the rest)
    codes = rng.integers(0, 1 << bits, size=(n, nb, bs), dtype=np.uint8)
    scales = (rng.random((n, nb)) + 0.5).astype(np.float32) * np.float32(
        2.0 / ((1 << bits) * np.sqrt(k))
    )
    centre = 1 << (bits - 1)
    zp = (
        rng.integers(0, 1 << bits, size=(n, nb), dtype=np.uint8)
        if fmt.zp
        else np.full((n, nb), centre, np.uint8)
    )
    # Q4_1's import stores zero point 8 explicitly (`zp` False, `corr` True): the same numbers as
    # symmetric
    packed = (
        codes if bits == 8 else codes[..., 0::2] | (codes[..., 1::2] << 4)
    )  # [n, nb, bs*bits/8]
    zp_even = np.pad(zp, ((0, 0), (0, nb % 2)))  # [n, nb rounded up to even]
    zp_packed = zp if bits == 8 else zp_even[:, 0::2] | (zp_even[:, 1::2] << 4)  # [n, ceil(nb/2)]
    w = (
        ((codes.astype(np.float64) - zp[..., None]) * scales[..., None])
        .reshape(n, nb * bs)[:, :k]
        .T
    )  # [k, n]
    return packed, scales, zp_packed, w


def matmul(g: GraphWriter, x: str, k: int, n: int, fmt: Format, head: bool = False):
    rng = g.rng
    if fmt.kind in ("fp32", "fp16"):
        w = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
        if fmt.kind == "fp32":
            return g.node("MatMul", [x, g.weight(w, head)]), w.astype(np.float64)
        w16 = w.astype(np.float16)
        x16 = g.cache.get((x, "fp16")) or g.cache.setdefault(
            (x, "fp16"), g.node("Cast", [x], to=10)
        )
        y16 = g.node("MatMul", [x16, g.weight(w16, head)])
        return g.node("Cast", [y16], to=1), w16.astype(np.float64)
    if fmt.kind in ("dqmm", "rowq8"):
        wq = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
        ws = (rng.random(n) + 0.5).astype(np.float32) * np.float32(1.0 / (127 * np.sqrt(k)))
        w = wq.astype(np.float64) * ws
        if fmt.kind == "dqmm":
            return g.node("DynamicQuantizeMatMul", [x, g.weight(wq, head), g.weight(ws, head)]), w
        xq, xs = _row_quantised(g, x)
        acc = g.node(
            "MatMulInteger", [xq, g.weight(wq, head), g.const(np.array(128, np.uint8), "azp")]
        )  # [M, n] int32
        yf = g.node("Cast", [acc], to=1)
        return g.node("Mul", [g.node("Mul", [yf, xs]), g.weight(ws, head)]), w
    body_fmt = replace(fmt, bits=8, zp=False, corr=False) if (fmt.corr and head) else fmt
    packed, scales, zp_packed, w = _nbits_weight(body_fmt, k, n, rng)
    inputs = [x, g.weight(packed, head), g.weight(scales, head)]
    if body_fmt.zp or body_fmt.corr:  # corr: codes centred on the stored zero point 8 (0x88 packed)
        inputs.append(g.weight(zp_packed, head))
    attrs = dict(K=k, N=n, bits=body_fmt.bits, block_size=body_fmt.block)
    if body_fmt.level:
        attrs["accuracy_level"] = body_fmt.level
    y = g.node("MatMulNBits", inputs, **attrs)
    if not body_fmt.corr:
        return y, w
    bs = body_fmt.block
    corr = (rng.standard_normal((k // bs, n)) * 0.05 / np.sqrt(k)).astype(np.float32)  # [k/bs, n]
    sums = g.cache.get((x, "blocksum", bs))
    if sums is None:
        xb = g.node(
            "Reshape", [x, g.const(np.array([-1, k // bs, bs], np.int64), "shape")]
        )  # [M, k/bs, bs]
        sums = g.cache[(x, "blocksum", bs)] = g.node(
            "ReduceSum", [xb, g.const(np.array([2], np.int64), "ax")], keepdims=0
        )  # [M, k/bs]
    w = w + np.repeat(
        corr.astype(np.float64), bs, axis=0
    )  # blocksum(x) @ C == x @ C repeated per block
    return g.node("Add", [y, g.node("MatMul", [sums, g.weight(corr, head)])]), w


def _row_quantised(g: GraphWriter, x: str):
    """x [M, k] -> (uint8 codes [M, k] with zero point 128, scales [M, 1]): one scale per row, so a
    row's codes never depend on the other rows of the step."""
    if (x, "rowq") in g.cache:
        return g.cache[(x, "rowq")]
    amax = g.node(
        "ReduceMax", [g.node("Abs", [x]), g.const(np.array([-1], np.int64), "ax")], keepdims=1
    )  # [M, 1]
    s = g.node(
        "Max",
        [
            g.node("Div", [amax, g.const(np.array(127, np.float32))]),
            g.const(np.array(1e-30, np.float32)),
        ],
    )
    q = g.node(
        "Add", [g.node("Round", [g.node("Div", [x, s])]), g.const(np.array(128, np.float32))]
    )
    q = g.node(
        "Cast",
        [g.node("Clip", [q, g.const(np.array(0, np.float32)), g.const(np.array(255, np.float32))])],
        to=2,
    )  # uint8 [M, k]
    g.cache[(x, "rowq")] = (q, s)
    return q, s


# ---- graphs ----


def _model(g: GraphWriter, x_dim: int, y: str, y_dim: int):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", x_dim])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["M", y_dim])],
        g.inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)]
    )


def op_model(fmt: Format, k: int, n: int, seed: int):
    """One matmul in `fmt` (inline weights) and its float64 reference weight."""
    g = GraphWriter(np.random.default_rng(seed))
    y, w = matmul(g, "X", k, n, fmt)
    return _model(g, k, y, n), w


def stack_model(fmt: Format, s: Shape, path: str, seed: int = 0) -> dict:
    """Write the whole-model matmul stack in `fmt` to `path` (+ .data); returns its weight bytes."""
    import onnx

    g = GraphWriter(np.random.default_rng(seed), path + ".data")
    ones, zeros = g.const(np.ones(s.hidden, np.float32)), g.const(np.zeros(s.hidden, np.float32))

    def norm(h):
        return g.node("LayerNormalization", [h, ones, zeros], axis=-1)

    h = "X"
    for _ in range(s.layers):
        xn = norm(h)
        qkv = matmul(g, xn, s.hidden, s.q + 2 * s.kv, fmt)[
            0
        ]  # packed q/k/v, as export/fused_target.py
        q = g.node(
            "Slice",
            [
                qkv,
                g.const(np.array([0], np.int64)),
                g.const(np.array([s.q], np.int64)),
                g.const(np.array([1], np.int64)),
            ],
        )  # [M, q]
        kv = g.node(
            "Slice",
            [
                qkv,
                g.const(np.array([s.q], np.int64)),
                g.const(np.array([s.q + 2 * s.kv], np.int64)),
                g.const(np.array([1], np.int64)),
            ],
        )  # [M, 2 kv]
        kv = g.node(
            "ReduceMean", [kv, g.const(np.array([-1], np.int64), "ax")], keepdims=1
        )  # [M, 1]: stands in
        # for attention, which reads k/v and is row-local in the matmul sense
        h = g.node("Add", [g.node("Add", [h, matmul(g, q, s.q, s.hidden, fmt)[0]]), kv])
        xn = norm(h)
        gu = g.node(
            "Mul",
            [matmul(g, xn, s.hidden, s.inter, fmt)[0], matmul(g, xn, s.hidden, s.inter, fmt)[0]],
        )
        h = g.node("Add", [h, matmul(g, gu, s.inter, s.hidden, fmt)[0]])
    logits = matmul(g, norm(h), s.hidden, s.vocab, fmt, head=True)[0]
    onnx.save_model(_model(g, s.hidden, logits, s.vocab), path)
    body_weights = s.layers * (s.hidden * (2 * s.q + 2 * s.kv + 2 * s.inter) + s.inter * s.hidden)
    return {
        "bytes_per_weight": g.body_bytes / body_weights,
        "head_bytes_per_weight": g.head_bytes / (s.hidden * s.vocab),
        "weights_mb": (g.body_bytes + g.head_bytes) / 1e6,
    }


# ---- running ----


def open_session(model_or_path, threads: int, spin: bool):
    """A session with the runtime's own options (runtime/session.py open_graph)."""
    from dflash_edge.runtime.session import SessionConfig, open_graph

    if not isinstance(model_or_path, str):
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".onnx", delete=False) as f:
            f.write(model_or_path.SerializeToString())
        try:
            return open_graph(f.name, SessionConfig(threads=threads, spin=spin)).session
        finally:
            os.unlink(f.name)
    return open_graph(model_or_path, SessionConfig(threads=threads, spin=spin)).session


class Runner:
    """session.run through IOBinding into preallocated outputs, as the runtime runs its graphs."""

    def __init__(self, session, n_out: int):
        import onnxruntime as ort

        self.session, self.n_out, self.ort = session, n_out, ort
        self.out = session.get_outputs()[0].name
        self.bound: dict[int, tuple] = {}

    def bind(self, x: np.ndarray):
        """A zero-argument callable running the graph on x [M, K] (kept bound: no per-call
        allocation)."""
        ort = self.ort
        xv = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x, np.float32))
        yv = ort.OrtValue.ortvalue_from_shape_and_type((x.shape[0], self.n_out), np.float32)
        b = self.session.io_binding()
        b.bind_ortvalue_input("X", xv)
        b.bind_ortvalue_output(self.out, yv)
        keep = (xv, yv, b)

        def call():
            self.session.run_with_iobinding(keep[2])
            return keep[1]

        return call

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.bind(x)().numpy().copy()


def inputs(k: int, seeds: int, rows: int = 16) -> list[np.ndarray]:
    """`seeds` random [rows, k] activations; the last has a few outlier channels (SmolLM2's reach
    ~25,000)."""
    out = []
    for s in range(seeds):
        x = np.random.default_rng(100 + s).standard_normal((rows, k)).astype(np.float32)
        if s == seeds - 1:
            x[:, [3, k // 2]] *= 500.0
        out.append(x)
    return out


def row_checks(run, xs: list[np.ndarray], rows: list[int]) -> dict:
    """Are the rows of an M-row run bit-equal to the row alone (M=1) and to the row padded with a
    zero row (M=2, the fused graph's decode)? Also the largest relative deviation seen, to size the
    differences."""
    eq1 = eq2 = True
    dev = 0.0
    for x in xs:
        alone = [run(x[i : i + 1])[0] for i in range(max(rows))]
        padded = [run(np.vstack([x[i : i + 1], np.zeros_like(x[:1])]))[0] for i in range(max(rows))]
        for m in (r for r in rows if r > 1):
            y = run(x[:m])
            for i in range(m):
                eq1 &= bool(np.array_equal(y[i].view(np.uint32), alone[i].view(np.uint32)))
                eq2 &= bool(np.array_equal(y[i].view(np.uint32), padded[i].view(np.uint32)))
                scale = float(np.abs(alone[i]).max()) or 1.0
                dev = max(
                    dev,
                    float(np.abs(y[i] - alone[i]).max()) / scale,
                    float(np.abs(y[i] - padded[i]).max()) / scale,
                )
    return {"rows_equal_m1": eq1, "rows_equal_m2pad": eq2, "max_rel_dev": dev}


def op_shapes(s: Shape) -> list[tuple[int, int]]:
    return sorted(
        {(s.hidden, s.q + 2 * s.kv), (s.q, s.hidden), (s.hidden, s.inter), (s.inter, s.hidden)}
    )


def grid_formats() -> list[Format]:
    out = [Format("fp32"), Format("fp16"), Format("dqmm"), Format("rowq8")]
    for bits in (4, 8):
        for bs in (16, 32, 64, 128):
            for level in (0, 1, 2, 3, 4):
                for zp in (False, True):
                    out.append(Format("nbits", bits, bs, level, zp))
            out += (
                [Format("nbits", 4, bs, level, False, True) for level in (0, 4)]
                if bits == 4
                else []
            )
    return out


def run_ops(args, report: dict) -> None:
    """Row checks of the stack formats on every weight shape."""
    formats = [parse_format(f) for f in args.formats.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    for shape_name in args.shapes.split(","):
        for k, n in op_shapes(SHAPES[shape_name]):
            xs = inputs(k, args.seeds)
            for fmt in formats:
                model, w = op_model(fmt, k, n, seed=k * 7 + n)
                run = Runner(open_session(model, args.threads, args.spin), n)
                chk = row_checks(run, xs, rows)
                ref = xs[0].astype(np.float64) @ w
                chk["rel_err"] = float(np.abs(run(xs[0]) - ref).max() / np.abs(ref).max())
                results.append({"shape": shape_name, "k": k, "n": n, "format": fmt.name, **chk})
                print(
                    f"op {shape_name} {k}x{n} {fmt.name:16s} rows=M1 {_yn(chk['rows_equal_m1'])} "
                    f"rows=M2pad {_yn(chk['rows_equal_m2pad'])} dev {chk['max_rel_dev']:.1e} err "
                    f"{chk['rel_err']:.1e}",
                    flush=True,
                )
    report["ops"] = results


def run_grid(args, k: int, n: int) -> list[dict]:
    xs = inputs(k, args.seeds)
    cases, out = {}, []
    rows = [int(r) for r in args.rows.split(",")]
    for fmt in (f for f in grid_formats() if not (f.corr and k % f.block)):
        model, w = op_model(fmt, k, n, seed=1)
        run = Runner(open_session(model, args.threads, args.spin), n)
        chk = row_checks(run, xs, rows)
        ref = xs[0].astype(np.float64) @ w
        chk["rel_err"] = float(np.abs(run(xs[0]) - ref).max() / np.abs(ref).max())
        out.append({"k": k, "n": n, "format": fmt.name, **chk})
        for m in (1, 2, 16):
            cases[(fmt.name, m)] = run.bind(xs[0][:m])
    ms = warm_round_robin_ms(cases, args.op_repeats)
    for r in out:
        r["ms"] = {m: round(ms[(r["format"], m)], 4) for m in (1, 2, 16)}
        print(
            f"grid {k}x{n} {r['format']:16s} ms M1 {r['ms'][1]:.3f} M2 {r['ms'][2]:.3f} M16 "
            f"{r['ms'][16]:.3f} "
            f"x{r['ms'][16] / r['ms'][1]:.2f} rows=M1 {_yn(r['rows_equal_m1'])} rows=M2pad "
            f"{_yn(r['rows_equal_m2pad'])} "
            f"err {r['rel_err']:.1e}",
            flush=True,
        )
    return out


def run_stacks(args, report: dict) -> None:
    formats = [parse_format(f) for f in args.formats.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    report["stacks"] = {}
    for shape_name in args.shapes.split(","):
        s = SHAPES[shape_name]
        os.makedirs(os.path.join(args.workdir, shape_name), exist_ok=True)
        xs = inputs(s.hidden, args.seeds)
        entries, cases = [], {}
        for fmt in formats:
            path = os.path.join(args.workdir, shape_name, fmt.name + ".onnx")
            sizes = stack_model(fmt, s, path)
            run = Runner(open_session(path, args.threads, args.spin), s.vocab)
            chk = row_checks(run, xs[: args.stack_seeds], rows)
            entries.append({"format": fmt.name, **sizes, **chk})
            for m in rows:
                cases[(fmt.name, m)] = run.bind(xs[0][:m])
            print(
                f"stack {shape_name} {fmt.name}: {sizes['bytes_per_weight']:.3f} B/weight, "
                f"{sizes['weights_mb']:.0f} MB, "
                f"rows=M1 {_yn(chk['rows_equal_m1'])} rows=M2pad {_yn(chk['rows_equal_m2pad'])}",
                flush=True,
            )
        ms = warm_round_robin_ms(cases, args.repeats)
        for e in entries:
            e["ms"] = {m: round(ms[(e["format"], m)], 3) for m in rows}
            e["ratio_16_1"] = e["ms"][max(rows)] / e["ms"][min(rows)]
            e["ratio_16_2"] = e["ms"][max(rows)] / e["ms"][2] if 2 in rows else None
        report["stacks"][shape_name] = entries
        print_table(shape_name, entries, rows)


def _yn(b: bool) -> str:
    return "yes" if b else "NO"


def print_table(shape_name: str, entries: list[dict], rows: list[int]) -> None:
    print(f"\n{shape_name}: whole matmul stack, median ms (interleaved)")
    print(
        "| format | B/weight | MB | "
        + " | ".join(f"M={m}" for m in rows)
        + f" | M{max(rows)}/M1 | M{max(rows)}/M2 | rows = M1 | rows = M2 padded |"
    )
    print("|---" * (len(rows) + 7) + "|")
    for e in entries:
        print(
            f"| {e['format']} | {e['bytes_per_weight']:.3f} | {e['weights_mb']:.0f} | "
            + " | ".join(f"{e['ms'][m]:.2f}" for m in rows)
            + f" | {e['ratio_16_1']:.2f} | {e['ratio_16_2'] or 0:.2f} | {_yn(e['rows_equal_m1'])} "
            f"| {_yn(e['rows_equal_m2pad'])} |"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"model shapes: {', '.join(SHAPES)}")
    p.add_argument(
        "--formats", default=",".join(STACK_FORMATS), help="formats for the row checks and stacks"
    )
    p.add_argument(
        "--rows", default="1,2,4,8,16", help="step sizes M (verify(k) runs M = k + 1 rows)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-spin", dest="spin", action="store_false", help="as `run --no-spin`")
    p.add_argument(
        "--repeats", type=int, default=15, help="interleaved rounds over every (stack format, M)"
    )
    p.add_argument("--op-repeats", type=int, default=100, help="interleaved rounds of the op grid")
    p.add_argument(
        "--seeds", type=int, default=3, help="random inputs per row check (the last with outliers)"
    )
    p.add_argument("--stack-seeds", type=int, default=2, help="random inputs per stack row check")
    p.add_argument(
        "--grid-shape", default="576x1536", help="KxN of the timed op grid ('' skips it)"
    )
    p.add_argument("--skip-ops", action="store_true")
    p.add_argument("--skip-stacks", action="store_true")
    p.add_argument(
        "--workdir", default="/tmp/verify_formats", help="where the stack graphs are written"
    )
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    import onnxruntime as ort

    report = {
        "command": " ".join(sys.argv),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "onnxruntime": ort.__version__,
            "threads": args.threads,
            "spin": args.spin,
        },
    }
    if not args.skip_ops:
        run_ops(args, report)
    if args.grid_shape:
        report["grid"] = run_grid(args, *map(int, args.grid_shape.split("x")))
    if not args.skip_stacks:
        run_stacks(args, report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
