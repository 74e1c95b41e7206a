"""Does onnxruntime's CPU provider fuse blocked DequantizeLinear + MatMul into MatMulNBits
(issue 39), and what does a table lookup cost in each standard form? Interleaved.

matmul: W [N, K] re-quantised (models/nbits.rtn) as MatMulNBits (contrib) and as DequantizeLinear
(opset 21, export/dq_format.py) + MatMul; prints the optimised graph's ops, whether the outputs are
bit-identical (M = 1 and 16) and median ms per M = 1 call of each.
lookup: an int8 table [V, H] in blocks of 32, 2 rows looked up: DequantizeLinear -> Gather (the
whole table dequantised per call) against Gather of the rows' codes and scales -> DequantizeLinear
(dq_format.DqTable).

    python benchmarks/dq_fusion.py [--k 1536] [--n 8960] [--vocab 151936] [--repeats 30]
        [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from timing import round_robin_ms


def _session(model, threads: int, dump: Path | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    if dump is not None:
        opts.optimized_model_filepath = str(dump)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _matmul_models(w):
    from onnx import TensorProto, helper, numpy_helper

    from dflash_edge.export.dq_format import weight_codes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", w.k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", w.n])
    attrs = dict(K=w.k, N=w.n, bits=w.bits, block_size=w.block_size, accuracy_level=4)
    contrib = helper.make_graph(
        [helper.make_node("MatMulNBits", ["x", "B", "s"], ["y"], domain="com.microsoft", **attrs)],
        "contrib",
        [x],
        [y],
        [numpy_helper.from_array(w.B, "B"), numpy_helper.from_array(w.scales, "s")],
    )
    q = weight_codes(w, signed=True)
    codes = (
        numpy_helper.from_array(q, "q")
        if isinstance(q, np.ndarray)
        else helper.make_tensor("q", TensorProto.INT4, q.shape, q.data.tobytes(), raw=True)
    )
    standard = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["q", "s"], ["wt"], axis=0, block_size=32),
            helper.make_node("MatMul", ["x", "wt"], ["y"]),
        ],
        "standard",
        [x],
        [y],
        [codes, numpy_helper.from_array(np.ascontiguousarray(w.scales.T), "s")],
    )
    ms = helper.make_opsetid("com.microsoft", 1)
    return (
        helper.make_model(contrib, opset_imports=[helper.make_opsetid("", 21), ms]),
        helper.make_model(standard, opset_imports=[helper.make_opsetid("", 21)]),
    )


def matmul(k: int, n: int, repeats: int, threads: int) -> dict:
    import onnx

    from dflash_edge.models.nbits import rtn

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((n, k)).astype(np.float32)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for bits in (4, 8):
            contrib, standard = _matmul_models(rtn(weight, bits, 32))
            a = _session(contrib, threads)
            b = _session(standard, threads, Path(tmp) / "opt.onnx")
            ops = [node.op_type for node in onnx.load(str(Path(tmp) / "opt.onnx")).graph.node]
            same = {}
            for m in (1, 16):
                x = rng.standard_normal((m, k)).astype(np.float32)
                same[m] = bool(np.array_equal(a.run(None, {"x": x})[0], b.run(None, {"x": x})[0]))
            x = rng.standard_normal((1, k)).astype(np.float32)
            med = round_robin_ms(
                {
                    "contrib": lambda: a.run(None, {"x": x}),
                    "standard": lambda: b.run(None, {"x": x}),
                },
                repeats,
            )
            out[f"int{bits}"] = {
                "optimised_ops": ops,
                "bit_identical": same,
                "median_ms": {key: round(v, 3) for key, v in med.items()},
            }
    return out


def lookup(vocab: int, hidden: int, repeats: int, threads: int) -> dict:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (hidden, vocab), dtype=np.int8)  # [H, V]: dq_format.DqTable
    s = (rng.random((hidden // 32, vocab)) * 0.01).astype(np.float32)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [hidden, "n"])
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")]
    whole = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=32),
            helper.make_node("Gather", ["w", "ids"], ["y"], axis=1),
        ],
        "whole",
        [ids],
        [y],
        inits,
    )
    rows = helper.make_graph(
        [
            helper.make_node("Gather", ["q", "ids"], ["qr"], axis=1),
            helper.make_node("Gather", ["s", "ids"], ["sr"], axis=1),
            helper.make_node("DequantizeLinear", ["qr", "sr"], ["y"], axis=0, block_size=32),
        ],
        "rows",
        [ids],
        [y],
        inits,
    )
    sessions = {
        name: _session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), threads)
        for name, g in (("dq_then_gather", whole), ("gather_then_dq", rows))
    }
    feed = {"ids": np.array([5, vocab - 1], np.int64)}
    outs = [sess.run(None, feed)[0] for sess in sessions.values()]
    med = round_robin_ms(
        {name: lambda s=sess: s.run(None, feed) for name, sess in sessions.items()},
        max(3, repeats // 10),
        warmup=1,
    )
    return {
        "same_rows": bool(np.array_equal(*outs)),
        "median_ms": {k: round(v, 3) for k, v in med.items()},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=1536)
    p.add_argument("--n", type=int, default=8960)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import onnxruntime

    out = {
        "onnxruntime": onnxruntime.__version__,
        "matmul": matmul(args.k, args.n, args.repeats, args.threads),
        "lookup": lookup(args.vocab, args.k, args.repeats, args.threads),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
