"""Issue 27 prep: can a GGUF Q4_1 matrix (x = d*q + m per 32-block) run exactly in onnxruntime?

Three graphs over the same random Q4_1 weight [N, K], against numpy's A @ dequant(W)^T (medians of
--repeats):
  float_zp   MatMulNBits with float zero points zp = -m/d ((q - zp) * d = d*q + m)
  zp8_fix    MatMulNBits with the packed uint8 zero point 8 (x = d*(q-8) + (m+8d)) plus the
             per-block term:
             ReduceSum of A over each block [M, K/32] @ (m+8d)^T [K/32, N], added
  (each at accuracy_level 0: fp32 activations, and 4: int8 activations)

    python benchmarks/q4_1_matmul.py --k 576 --n 1536 --rows 1,16 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from timing import round_robin_ms


def _graphs(q, d, m, bs: int, level: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    n, k = q.shape
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(
        n, k // bs, bs // 2
    )  # [N, K/bs, bs/2] low nibble first
    zp8 = np.full((n, (k // bs + 1) // 2), 0x88, np.uint8)
    common = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(d, "s")]
    nbits = dict(domain="com.microsoft", K=k, N=n, bits=4, block_size=bs, accuracy_level=level)
    graphs = {
        "float_zp": (
            [helper.make_node("MatMulNBits", ["A", "B", "s", "z"], ["Y"], **nbits)],
            [numpy_helper.from_array((-m / d).astype(np.float32), "z")],
        ),
        "zp8_fix": (
            [
                helper.make_node("MatMulNBits", ["A", "B", "s", "z"], ["Y0"], **nbits),
                helper.make_node("Reshape", ["A", "shape"], ["Ab"]),  # [M, K/bs, bs]
                helper.make_node("ReduceSum", ["Ab", "axis"], ["As"], keepdims=0),  # [M, K/bs]
                helper.make_node("MatMul", ["As", "C"], ["Y1"]),  # [M, N]
                helper.make_node("Add", ["Y0", "Y1"], ["Y"]),
            ],
            [
                numpy_helper.from_array(zp8, "z"),
                numpy_helper.from_array((m + 8 * d).T.copy(), "C"),
                numpy_helper.from_array(np.array([-1, k // bs, bs], np.int64), "shape"),
                numpy_helper.from_array(np.array([2], np.int64), "axis"),
            ],
        ),
    }
    out = {}
    for name, (nodes, extra) in graphs.items():
        g = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])],
            common + extra,
        )
        model = helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
        )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = THREADS
        out[name] = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
    return out


THREADS = 2


def main(argv=None) -> int:
    global THREADS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=576)
    p.add_argument("--n", type=int, default=1536)
    p.add_argument("--rows", default="1,16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=300)
    args = p.parse_args(argv)
    THREADS, bs, rng = args.threads, 32, np.random.default_rng(0)
    q = rng.integers(0, 16, size=(args.n, args.k)).astype(np.uint8)
    d = (rng.random((args.n, args.k // bs)) * 0.02 + 0.001).astype(np.float32)
    m = (-rng.random((args.n, args.k // bs)) * 0.1).astype(np.float32)
    w = (q.reshape(args.n, -1, bs) * d[..., None] + m[..., None]).reshape(
        args.n, args.k
    )  # gguf's dequantisation
    report = {}
    for rows in (int(r) for r in args.rows.split(",")):
        a = rng.standard_normal((rows, args.k)).astype(np.float32)
        ref = a @ w.T
        cases, diffs = {}, {}
        for level in (0, 4):
            for name, sess in _graphs(q, d, m, bs, level).items():
                key = f"{name}@level{level}"
                diffs[key] = float(np.abs(sess.run(None, {"A": a})[0] - ref).max())
                cases[key] = lambda s=sess: s.run(None, {"A": a})
        ms = round_robin_ms(cases, args.repeats, warmup=20)
        report[f"rows={rows}"] = {
            k: {"ms": round(ms[k], 3), "max_abs_diff": diffs[k]} for k in cases
        }
        report[f"rows={rows}"]["ref_max_abs"] = float(np.abs(ref).max())
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
