"""`dflash-edge tune BUNDLE`: measure this machine and the drafter, store the best verify length in the bundle.

Measures, within `--budget-s` seconds (about a third on step times, the rest on acceptance):
  decode     the target step of T = 1 (plain decoding)
  verify(k)  the target step of T = k + 1 for every k = 1..B-1, interleaved round-robin, medians
             (made non-decreasing in T: on a busy machine noise must not make a longer step look cheaper)
  draft      one drafter pass
  S(j)       the share of speculative steps whose first j drafts the target accepts, on calibration
             prompts (greedy, full block)
then picks k (or 0: do not draft) with the most expected tokens/s (tuning.py) and writes `tuned.json`
next to the bundle's hashed files (atomically). `run`, `bench` and `Generator` seed their adaptive
policy with it; `--verify-len` / `verify_len=` override it.

    dflash-edge tune bundle/ [--prompts calib.jsonl] [--budget-s 120]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from dflash_edge.runtime.errors import DflashEdgeError


def add_arguments(p) -> None:
    from .common import add_prompts_arg, add_thread_args

    p.add_argument("bundle", help="bundle directory (tuned.json is written into it)")
    add_prompts_arg(p, "bench", "calibration prompts")
    p.add_argument("--budget-s", type=float, default=120.0, help="seconds to spend measuring (default 120)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens per calibration prompt")
    p.add_argument("--context", type=int, default=256, help="cached positions while timing steps")
    p.add_argument("--provider", default="cpu", help="cpu | cuda | tensorrt")
    add_thread_args(p)


def run(args) -> int:
    from .common import load_prompts
    from dflash_edge.runtime.generator import Generator

    if not args.budget_s > 0:
        raise DflashEdgeError(f"--budget-s {args.budget_s}: give a positive number of seconds")
    prompts = load_prompts(args.prompts)
    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin, use_tuned=False)
    tuned = tune(gen, [r["prompt"] for r in prompts], args.budget_s, args.max_new_tokens, args.context)
    from dflash_edge.runtime.tuning import write_tuned

    path = write_tuned(gen.bundle, tuned)
    print(json.dumps({"tuned": str(path), "verify_len": tuned.verify_len, "decode_ms": tuned.decode_ms,
                      "draft_ms": tuned.draft_ms,
                      "expected_tokens_per_s": tuned.expected_tokens_per_s,
                      "acceptance": tuned.acceptance, "calibration": tuned.calibration}, indent=2))
    return 0


def tune(gen, prompts: list[str], budget_s: float, max_new_tokens: int = 96, context: int = 256):
    """Measure `gen` here and return the `Tuned` choice (not yet written)."""
    from .bench import _machine
    from dflash_edge.runtime.tuning import Tuned, choose_verify_len, manifest_digest, monotone, survival

    if not prompts:
        raise DflashEdgeError("no calibration prompts: pass --prompts FILE.jsonl with at least one 'prompt'")
    t0 = time.perf_counter()
    gen.generate_ids([1, 2, 3], 4, use_draft=True)                  # warm-up: lazy initialisation
    times, ctx = step_times(gen, context, seconds=budget_s / 3)
    accepted, used = acceptance(gen, prompts, max_new_tokens, deadline=t0 + budget_s)
    drafts = gen.block_size - 1
    target_ms = [round(t, 3) for t in monotone([times[k] for k in range(drafts + 1)])]   # T = 1..B
    verify_ms = {k: target_ms[k] for k in range(1, drafts + 1)}
    s = survival(accepted, drafts)
    best, rates = choose_verify_len(target_ms[0], times["draft"], verify_ms, s)
    return Tuned(verify_len=best, decode_ms=target_ms[0], draft_ms=times["draft"], verify_ms=verify_ms, acceptance=s,
                 manifest_sha256=manifest_digest(gen.bundle.manifest),
                 expected_tokens_per_s={k: round(r, 3) for k, r in rates.items()},
                 calibration={"prompts": used, "steps": len(accepted), "max_new_tokens": max_new_tokens,
                              "context": ctx, "seconds": round(time.perf_counter() - t0, 1),
                              "machine": _machine(0), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def step_times(gen, context: int, seconds: float, min_rounds: int = 3, max_rounds: int = 200) -> tuple[dict, int]:
    """Median ms of the target step for k = 0..B-1 (T = k + 1) and of one draft, interleaved round-robin."""
    from dflash_edge.runtime.sampling import SamplingParams

    tgt, drf, block = gen.target, gen.drafter, gen.block_size
    ctx = max(block + 1, min(context, gen.max_context - max(block, gen.prefill_chunk)))
    vocab = gen.bundle.model["vocab_size"]
    ids = [(7 * i + 3) % min(vocab, 1000) for i in range(ctx)]      # any in-vocabulary prefix: costs only
    gen._prefill(ids, SamplingParams())                             # a real prefix in both caches

    def draft():
        drf.kv.pos = ctx - block                                    # B new context rows, as after a long accept
        drf.draft(ids[-1], ctx)

    cases = {k: (lambda k=k: tgt.forward(k + 1, ctx)) for k in range(block)}
    cases["draft"] = draft
    samples: dict = {name: [] for name in cases}
    deadline = time.perf_counter() + seconds
    bar = _bar(max_rounds, "tune: step times")
    for n in range(max_rounds):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
        bar.update(1)
        if n + 1 >= min_rounds and time.perf_counter() > deadline:
            break
    bar.close()
    return {name: round(1e3 * statistics.median(v[1:] if len(v) > 1 else v), 3) for name, v in samples.items()}, ctx


def acceptance(gen, prompts: list[str], max_new_tokens: int, deadline: float) -> tuple[list[int], int]:
    """Drafts accepted per speculative step (full block, greedy) over prompts until `deadline` (at least one)."""
    accepted, used = [], 0
    bar = _bar(len(prompts), "tune: acceptance")
    for prompt in prompts:
        res = gen.generate(prompt, max_new_tokens=max_new_tokens, use_draft=True)
        accepted += [n - 1 for n in res.stats.acceptance_lengths]
        used += 1
        bar.update(1)
        if time.perf_counter() > deadline:
            break
    bar.close()
    return accepted, used


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:                                         # tqdm is not a runtime dependency
        return _NoBar()
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
