"""A 5-bit GGUF weight (Q5_0/Q5_1/Q5_K) as one 8-bit MatMulNBits (what the exporter writes) against
the exact split into a 4-bit part (the low nibbles) plus a 2-bit part (the 5th bits, x16): fewer
bytes (1.02 vs 1.125 a weight) but two ops. onnxruntime CPU, M=1 (a decode step), the exporter's
accuracy level 4, 2 threads, median of interleaved rounds (benchmarks/timing.py). Random codes: the
kernels' speed does not depend on them.

    python benchmarks/nbits_split.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

SHAPES = [(896, 4864), (4864, 896), (1536, 8960), (8960, 1536)]  # (K, N): Qwen2.5 0.5B / 1.5B MLP


def _session(nodes, inits, k: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _nbits(name: str, out: str, k: int, n: int, bits: int, zp: bool = False):
    from onnx import helper

    inputs = ["A", f"{name}_B", f"{name}_s"] + ([f"{name}_z"] if zp else [])
    attrs = dict(K=k, N=n, bits=bits, block_size=32, accuracy_level=4)
    return helper.make_node("MatMulNBits", inputs, [out], domain="com.microsoft", **attrs)


def cases(k: int, n: int, rng):
    from onnx import helper

    blocks = k // 32
    scales = rng.random((n, blocks), dtype=np.float32)
    byte = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)  # noqa: E731
    one = _session(
        [_nbits("w", "Y", k, n, 8)], {"w_B": byte(n, blocks, 32), "w_s": scales}, k
    )  # 8-bit codes, the default zero point
    split = _session(
        [
            _nbits("lo", "Y0", k, n, 4, zp=True),
            _nbits("hi", "Y1", k, n, 2),
            helper.make_node("Add", ["Y0", "Y1"], ["Y"]),
        ],
        {
            "lo_B": byte(n, blocks, 16),
            "lo_s": scales,
            "lo_z": np.zeros((n, (blocks + 1) // 2), np.uint8),
            "hi_B": byte(n, blocks, 8),
            "hi_s": 16 * scales,
        },
        k,
    )
    a = {"A": rng.standard_normal((1, k), dtype=np.float32)}
    return {"8-bit": lambda: one.run(None, a), "4+2-bit": lambda: split.run(None, a)}


def main(argv=None) -> int:
    from timing import round_robin_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    report = {}
    for k, n in SHAPES:
        ms = round_robin_ms(cases(k, n, rng), args.repeats, warmup=10)
        report[f"K={k} N={n}"] = {name: round(v, 4) for name, v in ms.items()}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
