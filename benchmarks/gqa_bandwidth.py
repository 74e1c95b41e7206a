"""Is onnxruntime's GroupQueryAttention (CPU, fp32) bound by the K/V bytes it must read? (issue 12)

Times a graph of L GroupQueryAttention nodes alone (SmolLM2's shapes by default: 30 layers, 9 query heads,
3 KV heads, head dim 64), one decode step (T = 1) at each context, past and present bound to the SAME
per-layer buffer (the bundle's way) or to separate ones (onnxruntime then copies the prefix), against a
plain numpy read (sum) of the same number of K/V bytes: the memory-bandwidth floor. Interleaved, medians.

    python benchmarks/gqa_bandwidth.py [--contexts 64,1024,1800] [--threads 1] [--repeats 30]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def gqa_graph(layers: int, heads: int, kv_heads: int, head_dim: int, max_pos: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inv = 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim)
    freqs = np.outer(np.arange(max_pos), inv)                                       # [P, D/2]
    tables = [numpy_helper.from_array(np.cos(freqs).astype(np.float32), "cos"),
              numpy_helper.from_array(np.sin(freqs).astype(np.float32), "sin")]
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f32, [1, 1, heads * head_dim]),
              helper.make_tensor_value_info("k", f32, [1, 1, kv_heads * head_dim]),
              helper.make_tensor_value_info("v", f32, [1, 1, kv_heads * head_dim]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    nodes, outputs = [], []
    for i in range(layers):
        cache = [1, kv_heads, "S", head_dim]
        inputs += [helper.make_tensor_value_info(f"past_{kv}.{i}", f32, cache) for kv in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"out.{i}", f32, [1, 1, heads * head_dim])]
        outputs += [helper.make_tensor_value_info(f"present_{kv}.{i}", f32, cache) for kv in ("key", "value")]
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", f"past_key.{i}", f"past_value.{i}", "seqlens_k", "total", "cos", "sin"],
            [f"out.{i}", f"present_key.{i}", f"present_value.{i}"], domain="com.microsoft", num_heads=heads,
            kv_num_heads=kv_heads, do_rotary=1))
    graph = helper.make_graph(nodes, "gqa", inputs, outputs, tables)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def measure(contexts, threads: int, repeats: int, layers=30, heads=9, kv_heads=3, head_dim=64) -> dict:
    import onnxruntime as ort

    capacity = max(contexts) + 64
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(gqa_graph(layers, heads, kv_heads, head_dim, capacity), opts,
                                providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    caches = [rng.random((layers, 1, kv_heads, capacity, head_dim), np.float32) for _ in range(4)]   # K, V, K', V'
    small = {"q": rng.random((1, 1, heads * head_dim), np.float32),
             "k": rng.random((1, 1, kv_heads * head_dim), np.float32),
             "v": rng.random((1, 1, kv_heads * head_dim), np.float32)}

    def binding(ctx: int, shared: bool):
        b = sess.io_binding()
        present = caches[:2] if shared else caches[2:]
        for i in range(layers):
            for kv, past, pres in (("key", caches[0], present[0]), ("value", caches[1], present[1])):
                b.bind_input(f"past_{kv}.{i}", "cpu", 0, np.float32, past[i].shape, past[i].ctypes.data)
                b.bind_output(f"present_{kv}.{i}", "cpu", 0, np.float32, pres[i].shape, pres[i].ctypes.data)
            b.bind_output(f"out.{i}", "cpu")
        lengths = {"seqlens_k": np.array([ctx], np.int32), "total": np.array(ctx + 1, np.int32)}
        for name, arr in {**small, **lengths}.items():
            b.bind_cpu_input(name, arr)
        return lambda: sess.run_with_iobinding(b)

    flat = np.concatenate([caches[0].ravel(), caches[1].ravel()])                  # as many bytes as K + V
    per_pos = 2 * layers * kv_heads * head_dim                                     # floats of K+V per position
    cases = {}
    for ctx in contexts:
        cases[f"gqa_shared@{ctx}"] = binding(ctx, True)
        cases[f"gqa_separate@{ctx}"] = binding(ctx, False)
        cases[f"numpy_read@{ctx}"] = lambda n=ctx * per_pos: flat[:n].sum()
    times = {k: [] for k in cases}
    for _ in range(repeats + 2):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return {"threads": threads, "repeats": repeats, "kv_mb": {c: round(c * per_pos * 4 / 1e6, 1) for c in contexts},
            "median_ms": {k: round(statistics.median(v[2:]), 2) for k, v in times.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="64,1024,1800")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    print(json.dumps(measure([int(c) for c in args.contexts.split(",")], args.threads, args.repeats), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
