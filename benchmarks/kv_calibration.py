"""The int8 KV cache's calibration text: greedy replies (before) or teacher-forced text (after).

On a bundle exported with `--kv-cache fp32`, each method calibrates the fused target's scales
(timed), a hard-linked copy of the bundle gets the int8 cache with them, and the copy is compared
with the fp32-cache target on text none of them calibrated on:
  top1, kl    teacher-forced top-1 agreement and mean KL(fp32 || int8) in nats on the first
              `--eval` held-out prompts + the fp32 target's greedy replies (`--eval-tokens` each)
  greedy      prompts whose greedy reply equals the fp32 cache's token for token; mean common prefix
  long_*      the same over one `--long`-token text (the bench prompts chained
              in one chat reply): positions far beyond every calibration text
  scales      each method's scales over the greedy method's, per channel (median, 5th / 95th
              percentile), K and V

Methods: `greedy` (the exporter before: the last 16 held-out prompts + 96 greedy tokens each) and
`greedy-cached:FILE` (texts an earlier run saved with --save-greedy: the scales' reference
without the decoding time) and `tfCOUNTxLENGTH[mMARGIN]` (export/kv_cache.calibration_texts:
COUNT texts of LENGTH tokens, teacher-forced; scales with MARGIN, default kv_cache.MARGIN).
Scale ratios leave the margins out.

    python benchmarks/kv_calibration.py BUNDLE --work /tmp/kvc [--methods greedy,tf16x136,tf4x128]
        [--eval 12] [--eval-tokens 128] [--greedy 6] [--greedy-tokens 64] [--long 1024] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
from output import emit_json


def greedy_texts(gen, prompts: list[str], count: int = 16, new_tokens: int = 96) -> list[list[int]]:
    """The exporter's calibration text before this change: prompts + their greedy replies."""
    texts = []
    for prompt in prompts[-count:]:
        ids = gen.encode(prompt)
        texts.append(ids + gen.generate_ids(ids, new_tokens, draft="none").token_ids)
    return texts


def texts_of(method: str, gen, prompts: list[str]) -> tuple[list[list[int]], float]:
    """(texts, margin) of `greedy`, `tfCOUNTxLENGTH` or `tfCOUNTxLENGTHmMARGIN`."""
    from dflash_edge.export.kv_cache import MARGIN, calibration_texts

    if method == "greedy":
        return greedy_texts(gen, prompts), MARGIN
    if method.startswith("greedy-cached:"):  # the greedy texts of an earlier run (--save-greedy)
        return json.loads(Path(method.split(":", 1)[1]).read_text()), MARGIN
    shape, _, margin = method.removeprefix("tf").partition("m")
    count, length = shape.split("x")
    return calibration_texts(gen, prompts, int(count), int(length)), float(margin or MARGIN)


def int8_copy(src: Path, dst: Path, k, v, margin: float, method: str) -> Path:
    from dflash_edge.export.kv_cache import apply_int8_cache
    from dflash_edge.runtime import bundle as bundle_mod

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=os.link)  # the rewrite replaces its file: src intact
    manifest = json.loads((dst / bundle_mod.MANIFEST).read_text())
    manifest["graphs"]["target_fused"] = apply_int8_cache(
        dst, manifest, k, v, margin, {"method": method}
    )
    bundle_mod.write_manifest(dst, manifest)
    return dst


def log_probs(gen, texts: list[tuple[list[int], int]]) -> np.ndarray:
    """Teacher-forced log-softmax [rows, V] (float16) over rows `start - 1 ..` of each (ids,
    start), concatenated."""
    from dflash_edge.export.kv_cache import teacher_forced_logits

    out = []
    for ids, s in texts:
        x = teacher_forced_logits(gen, ids, slice(s - 1, len(ids) - 1))
        x = x - x.max(-1, keepdims=True)
        out.append((x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float16))
    return np.concatenate(out)


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    """Top-1 agreement and mean KL(ref || got) in nats between two log_probs arrays."""
    p, q = ref.astype(np.float32), got.astype(np.float32)
    kl = (np.exp(p) * (p - q)).sum(-1)
    return {
        "top1": round(float((p.argmax(-1) == q.argmax(-1)).mean()), 4),
        "kl": round(float(kl.mean()), 5),
    }


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def ratio_stats(x: np.ndarray, y: np.ndarray) -> dict:
    r = (x / y).ravel()
    return {
        q: round(float(np.percentile(r, p)), 3) for q, p in (("p5", 5), ("median", 50), ("p95", 95))
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", help="a bundle exported with --kv-cache fp32")
    ap.add_argument("--work", required=True, help="folder for the int8 copies (hard links)")
    ap.add_argument("--methods", default="greedy,tf16x136,tf4x512")
    ap.add_argument("--eval", type=int, default=12, help="held-out prompts, teacher-forced")
    ap.add_argument("--eval-tokens", type=int, default=128, help="fp32 reply tokens per prompt")
    ap.add_argument("--greedy", type=int, default=6, help="prompts of the greedy comparison")
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--long", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--save-greedy", default=None, help="write the greedy texts (JSON) here")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from dflash_edge.data import read_prompts
    from dflash_edge.export.kv_cache import calibrate, load_prompts
    from dflash_edge.runtime import Generator

    src, work = Path(args.bundle), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ref = Generator.load(src, target_graph="target_fused", threads=args.threads, drafter=False)
    prompts = load_prompts(None)
    t = time.perf_counter()
    evals = []
    for prompt in prompts[: args.eval]:
        ids = ref.encode(prompt)
        evals.append((ids, ref.generate_ids(ids, args.eval_tokens, draft="none").token_ids))
    print(f"fp32 replies: {time.perf_counter() - t:.1f} s", flush=True)
    bench = [r["prompt"] for r in read_prompts("bench", default="bench")]
    long_ids = ref.encode(bench[0])
    for p in bench[1:]:
        if len(long_ids) >= args.long:
            break
        long_ids += ref.tokenizer.encode("\n\n" + p)
    long_ids = long_ids[: args.long]
    tf = [(ids + reply, len(ids)) for ids, reply in evals]
    ref_tf, ref_long = log_probs(ref, tf), log_probs(ref, [(long_ids, 1)])
    results, scales = {}, {}
    for method in args.methods.split(","):
        t = time.perf_counter()
        texts, margin = texts_of(method, ref, prompts)
        t_text = time.perf_counter() - t
        k, v = calibrate(ref, texts, margin)
        seconds = time.perf_counter() - t
        if method == "greedy" and args.save_greedy:
            Path(args.save_greedy).write_text(json.dumps(texts))
        method = "greedy" if method.startswith("greedy-cached:") else method
        scales[method] = (k / margin, v / margin)  # compared without the margin
        gen = Generator.load(
            int8_copy(src, work / method, k, v, margin, method), threads=args.threads, drafter=False
        )
        want = [(ids, reply[: args.greedy_tokens]) for ids, reply in evals[: args.greedy]]
        greedy = [
            gen.generate_ids(ids, args.greedy_tokens, draft="none").token_ids for ids, _ in want
        ]
        results[method] = {
            "texts": len(texts),
            "positions": sum(map(len, texts)),
            "seconds": round(seconds, 1),
            "text_seconds": round(t_text, 1),
            "margin": margin,
            **compare(ref_tf, log_probs(gen, tf)),
            "greedy_equal": sum(g == r for g, (_, r) in zip(greedy, want)),
            "greedy_prefix": round(
                float(np.mean([common_prefix(g, r) for g, (_, r) in zip(greedy, want)])), 1
            ),
            **{
                f"long_{k}": v
                for k, v in compare(ref_long, log_probs(gen, [(long_ids, 1)])).items()
            },
        }
        if "greedy" in scales:
            gk, gv = scales["greedy"]
            results[method]["k_over_greedy"] = ratio_stats(scales[method][0], gk)
            results[method]["v_over_greedy"] = ratio_stats(scales[method][1], gv)
        del gen
        print(method, json.dumps(results[method]), flush=True)
    out = {
        "bundle": str(src),
        "eval_positions": len(ref_tf),
        "greedy_prompts_tokens": [args.greedy, args.greedy_tokens],
        "long_positions": len(long_ids),
        "load_avg": os.getloadavg(),
        "results": results,
    }
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
