"""Do a graph's logits for a token depend on how many tokens share its step?  (losslessness check)

Runs a `target_fused` graph (GroupQueryAttention over per-layer past/present buffers) over the same
tokens once as T = 1 steps and once as one T = k step, from an empty cache, and prints the largest
logits difference per row. Speculative decoding is lossless only if these rows agree (up to float
noise): quantize/bundle_quant.py leaves the fused flavour out of quantised bundles because they did
not.

    python benchmarks/step_consistency.py /work/m/fp32/target_fused.onnx
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph", help="a target_fused.onnx")
    ap.add_argument(
        "--tokens", default="1,504,6376,314", help="token ids run as one step and one at a time"
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = args.threads, 3
    s = ort.InferenceSession(args.graph, opts, providers=["CPUExecutionProvider"])
    past = [i for i in s.get_inputs() if i.name.startswith("past_")]
    _, heads, _, dim = past[0].shape
    toks = [int(t) for t in args.tokens.split(",")]
    out_names = [o.name for o in s.get_outputs()]

    def run(ids, start, cache):
        feeds = {
            "input_ids": np.array([ids], np.int64),
            "logits_from": np.array([0], np.int64),
            "seqlens_k": np.array([start + len(ids) - 1], np.int32),
            "total_sequence_length": np.array(start + len(ids), np.int32),
            **cache,
        }
        out = dict(zip(out_names, s.run(None, feeds)))
        return out["logits"][0], {i.name: out[i.name.replace("past_", "present_")] for i in past}

    empty = {
        i.name: np.zeros((1, heads, len(toks), dim), np.float32) for i in past
    }  # [1, Hkv, S, D]
    rows, cache = [], empty
    for i, t in enumerate(toks):
        logits, cache = run([t], i, cache)
        rows.append(logits[0])
    whole, _ = run(toks, 0, empty)
    print(
        "max |logits(T=1) - logits(T=k)| per row:",
        [round(float(np.abs(whole[i] - rows[i]).max()), 6) for i in range(len(toks))],
    )


if __name__ == "__main__":
    main()
