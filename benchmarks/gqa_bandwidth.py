"""Is onnxruntime's GroupQueryAttention (CPU, fp32) bound by the K/V bytes it must read? (issue 12)

Times a graph of L GroupQueryAttention nodes alone (SmolLM2's shapes by default: 30 layers, 9 query
heads, 3 KV heads, head dim 64), one decode step (T = 1) at each context, past and present bound to
the SAME per-layer buffer (the bundle's way) or to separate ones (onnxruntime then copies the
prefix), against a plain numpy read (sum) of the same number of K/V bytes: the memory-bandwidth
floor. Interleaved, medians.

`--caches fp32,fp16,int8` also times the shared-buffer op with an fp16 cache and with an int8 cache
(per-channel scales, `quantize --kv-cache int8`), and `--gemm` attention's two products alone as
plain MatMuls over a sequence-major `[S, Hkv*D]` prefix per layer (scores `K @ Q^T` of 9 heads, then
`P @ V`): what onnxruntime's own GEMM needs for the same bytes, i.e. whether a hand-wired attention
could beat the op.

    python benchmarks/gqa_bandwidth.py [--contexts 64,1024,1800] [--threads 1] [--repeats 30]
                                       [--caches fp32,fp16,int8] [--rows 1] [--gemm]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from timing import round_robin_ms

CACHE_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}


def gqa_graph(
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    max_pos: int,
    cache: str = "fp32",
    rows: int = 1,
) -> bytes:
    """`layers` GroupQueryAttention nodes on one q/k/v of `rows` tokens; fp16: every tensor fp16
    (the op's fp16 kernel), int8: fp32 activations over an int8 cache with per-channel scales."""
    from onnx import TensorProto, helper, numpy_helper

    act = np.float16 if cache == "fp16" else np.float32
    t_act = TensorProto.FLOAT16 if cache == "fp16" else TensorProto.FLOAT
    t_cache = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "int8": TensorProto.INT8}[
        cache
    ]
    inv = 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim)
    freqs = np.outer(np.arange(max_pos), inv)  # [P, D/2]
    tables = [
        numpy_helper.from_array(np.cos(freqs).astype(act), "cos"),
        numpy_helper.from_array(np.sin(freqs).astype(act), "sin"),
    ]
    quant, scales = {}, []
    if cache == "int8":
        quant = dict(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        scales = ["", "", "", "k_scale", "v_scale"]  # after 3 unused inputs
        tables += [
            numpy_helper.from_array(np.full(kv_heads * head_dim, 0.02, np.float32), n)
            for n in scales[3:]
        ]
    inputs = [
        helper.make_tensor_value_info("q", t_act, [1, rows, heads * head_dim]),
        helper.make_tensor_value_info("k", t_act, [1, rows, kv_heads * head_dim]),
        helper.make_tensor_value_info("v", t_act, [1, rows, kv_heads * head_dim]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    nodes, outputs = [], []
    for i in range(layers):
        shape = [1, kv_heads, "S", head_dim]
        inputs += [
            helper.make_tensor_value_info(f"past_{kv}.{i}", t_cache, shape)
            for kv in ("key", "value")
        ]
        outputs += [helper.make_tensor_value_info(f"out.{i}", t_act, [1, rows, heads * head_dim])]
        outputs += [
            helper.make_tensor_value_info(f"present_{kv}.{i}", t_cache, shape)
            for kv in ("key", "value")
        ]
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [
                    "q",
                    "k",
                    "v",
                    f"past_key.{i}",
                    f"past_value.{i}",
                    "seqlens_k",
                    "total",
                    "cos",
                    "sin",
                    *scales,
                ],
                [f"out.{i}", f"present_key.{i}", f"present_value.{i}"],
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
                do_rotary=1,
                **quant,
            )
        )
    graph = helper.make_graph(nodes, "gqa", inputs, outputs, tables)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    ).SerializeToString()


def gemm_graph(layers: int, heads: int, width: int) -> bytes:
    """Per layer: scores^T = K[S, Hkv*D] @ Q^T[Hkv*D, heads] and P[heads, S] @ V[S, Hkv*D] (plain
    MatMuls)."""
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("qt", f32, [width, heads]),
        helper.make_tensor_value_info("p", f32, [heads, "S"]),
    ]
    nodes, outputs = [], []
    for i in range(layers):
        inputs += [
            helper.make_tensor_value_info(f"{kv}.{i}", f32, ["S", width]) for kv in ("k", "v")
        ]
        nodes += [
            helper.make_node("MatMul", [f"k.{i}", "qt"], [f"s.{i}"]),
            helper.make_node("MatMul", ["p", f"v.{i}"], [f"o.{i}"]),
        ]
        outputs += [helper.make_tensor_value_info(f"{o}.{i}", f32, None) for o in ("s", "o")]
    graph = helper.make_graph(nodes, "gemm", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _session(model: bytes, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry(
        "session.intra_op.allow_spinning", "0"
    )  # idle sessions leave the cores alone
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _gqa_cases(
    cache: str, contexts, threads: int, rows: int, dims: tuple[int, int, int, int], rng
) -> dict:
    """name -> step function for one cache dtype (shared buffer; fp32 also with a separate
    present)."""
    layers, heads, kv_heads, head_dim = dims
    capacity = max(contexts) + 64
    sess = _session(gqa_graph(layers, heads, kv_heads, head_dim, capacity, cache, rows), threads)
    dtype, act = CACHE_DTYPES[cache], np.float16 if cache == "fp16" else np.float32
    shape = (layers, 1, kv_heads, capacity, head_dim)
    caches = [
        rng.integers(-100, 100, shape).astype(dtype)
        if cache == "int8"
        else rng.random(shape, np.float32).astype(dtype)
        for _ in range(4 if cache == "fp32" else 2)
    ]  # K, V (, K', V')
    small = {
        n: rng.random((1, rows, w * head_dim), np.float32).astype(act)
        for n, w in (("q", heads), ("k", kv_heads), ("v", kv_heads))
    }

    def binding(ctx: int, shared: bool):
        b = sess.io_binding()
        present = caches[:2] if shared else caches[2:]
        for i in range(layers):
            for kv, past, pres in (
                ("key", caches[0], present[0]),
                ("value", caches[1], present[1]),
            ):
                b.bind_input(f"past_{kv}.{i}", "cpu", 0, dtype, past[i].shape, past[i].ctypes.data)
                b.bind_output(
                    f"present_{kv}.{i}", "cpu", 0, dtype, pres[i].shape, pres[i].ctypes.data
                )
            b.bind_output(f"out.{i}", "cpu")
        lengths = {
            "seqlens_k": np.array([ctx + rows - 1], np.int32),
            "total": np.array(ctx + rows, np.int32),
        }
        for name, arr in {**small, **lengths}.items():
            b.bind_cpu_input(name, arr)
        return lambda keep=(caches, small, lengths): sess.run_with_iobinding(
            b
        )  # bound by pointer: keep alive

    tag = "" if cache == "fp32" else f"_{cache}"
    cases = {f"gqa_shared{tag}@{ctx}": binding(ctx, True) for ctx in contexts}
    if cache == "fp32":
        cases.update({f"gqa_separate@{ctx}": binding(ctx, False) for ctx in contexts})
    return cases


def _gemm_cases(contexts, threads: int, dims: tuple[int, int, int, int], rng) -> dict:
    layers, heads, kv_heads, head_dim = dims
    width = kv_heads * head_dim
    sess = _session(gemm_graph(layers, heads, width), threads)
    kv = [
        rng.standard_normal((layers, max(contexts), width)).astype(np.float32) for _ in range(2)
    ]  # [L, S, Hkv*D]
    qt = rng.standard_normal((width, heads)).astype(np.float32)

    def binding(ctx: int):
        b, probs = sess.io_binding(), rng.random((heads, ctx), np.float32)
        b.bind_cpu_input("qt", qt)
        b.bind_cpu_input("p", probs)
        for i in range(layers):
            for name, buf in (("k", kv[0]), ("v", kv[1])):
                b.bind_input(
                    f"{name}.{i}", "cpu", 0, np.float32, (ctx, width), buf[i].ctypes.data
                )  # a prefix view
            for out in ("s", "o"):
                b.bind_output(f"{out}.{i}", "cpu")
        return lambda keep=(kv, qt, probs): sess.run_with_iobinding(b)  # bound by pointer

    return {f"gemm_pair@{ctx}": binding(ctx) for ctx in contexts}


def measure(
    contexts,
    threads: int,
    repeats: int,
    layers=30,
    heads=9,
    kv_heads=3,
    head_dim=64,
    caches=("fp32",),
    rows: int = 1,
    gemm: bool = False,
) -> dict:
    rng = np.random.default_rng(0)
    dims = (layers, heads, kv_heads, head_dim)
    cases = {}
    for cache in caches:
        cases.update(_gqa_cases(cache, contexts, threads, rows, dims, rng))
    if gemm:
        cases.update(_gemm_cases(contexts, threads, dims, rng))
    per_pos = 2 * layers * kv_heads * head_dim  # floats of K+V per position
    flat = rng.random(max(contexts) * per_pos, np.float32)  # as many bytes as fp32 K + V
    for ctx in contexts:
        cases[f"numpy_read@{ctx}"] = lambda n=ctx * per_pos: flat[:n].sum()
    times = round_robin_ms(cases, repeats)
    return {
        "threads": threads,
        "repeats": repeats,
        "rows": rows,
        "caches": list(caches),
        "kv_mb_fp32": {c: round(c * per_pos * 4 / 1e6, 1) for c in contexts},
        "median_ms": {k: round(ms, 2) for k, ms in times.items()},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="64,1024,1800")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument(
        "--caches", default="fp32", help="cache dtypes of the shared-buffer op: fp32, fp16, int8"
    )
    p.add_argument(
        "--rows",
        type=int,
        default=1,
        help="query rows per step (2: the fp32 bundle's decode + pad row)",
    )
    p.add_argument(
        "--gemm", action="store_true", help="also time attention's two products as plain MatMuls"
    )
    args = p.parse_args(argv)
    caches = tuple(c for c in args.caches.split(",") if c)
    unknown = [c for c in caches if c not in CACHE_DTYPES]
    if unknown:
        p.error(f"--caches {','.join(unknown)}: choose from {', '.join(CACHE_DTYPES)}")
    print(
        json.dumps(
            measure(
                [int(c) for c in args.contexts.split(",")],
                args.threads,
                args.repeats,
                caches=caches,
                rows=args.rows,
                gemm=args.gemm,
            ),
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
