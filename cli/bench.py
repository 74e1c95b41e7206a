"""`dflash-edge bench BUNDLE`: plain, always-draft and default decoding on a prompt set, lossless
check.

Each prompt runs greedy in three arms back to back, their order rotating per prompt so all see the
same machine load: `plain` (no drafting), `always` (the drafter every step, its full block or
`--verify-len`) and `default` (the adaptive policy seeded by the bundle's tuned.json: per step
plain, drafter or prompt lookup, and the verify length). `speedup` is the median over prompts of
default / plain decode tokens/s; `by_category` reports each category's medians, the verify lengths
chosen and the acceptance per source. `lossless` is true iff every arm produced the plain arm's
tokens. Exit status 1 when one differs."""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import DflashEdgeError
from ..runtime.memory import peak_rss_bytes
from ..runtime.validate import check_verify_len
from . import bench_report
from .common import add_prompts_arg, add_provider_arg, add_thread_args, load_prompts, prompt_of


def add_arguments(p) -> None:

    p.add_argument("bundle", help="bundle directory")
    add_prompts_arg(p, "bench", "the prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="only the first K prompts (0: all)")
    p.add_argument(
        "--json",
        dest="json_out",
        default=None,
        help="write the full report (with per-prompt rows) here",
    )
    p.add_argument(
        "--verify-len",
        type=int,
        default=None,
        help="drafts verified per step in the always and default arms (default: tuned / adaptive)",
    )
    p.add_argument(
        "--skip-always", action="store_true", help="leave out the always-draft arm (faster)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of the arms per prompt; tokens/s is their median "
        "(steadier on a shared machine)",
    )
    p.add_argument(
        "--auto-draft",
        action="store_true",
        help="no effect: the adaptive policy is the default arm",
    )
    add_provider_arg(p)
    add_thread_args(p)
    bench_report.add_arguments(p)  # --power / --no-power, --report DIR


ARMS = {"plain": "none", "always": "drafter", "default": "auto"}  # arm -> GenerationOptions.draft


@dataclass(frozen=True)
class BenchPlan:
    """What each prompt runs: `arms` (ARMS' names, "plain" among them) for `repeats` rounds, the
    order rotating; `verify_len` (None: the policy's) in the drafting arms."""

    arms: tuple[str, ...]
    max_new_tokens: int
    verify_len: int | None = None
    repeats: int = 1


def bench_prompt(gen, row: dict, index: int, plan: BenchPlan) -> tuple[dict, dict]:
    """Greedy runs of one prompt in each arm of `plan`; (row, stats by arm).

    Tokens/s per arm is the median over the rounds; the other figures come from the first round.
    """
    arms = plan.arms
    runs = []
    for rnd in range(plan.repeats):
        shift = (index + rnd) % len(arms)
        runs += [
            (
                arm,
                gen.generate(
                    prompt_of(row),
                    max_new_tokens=plan.max_new_tokens,
                    draft=ARMS[arm],
                    verify_len=None if arm == "plain" else plan.verify_len,
                ),
            )
            for arm in arms[shift:] + arms[:shift]
        ]
    res = {arm: next(r for a, r in runs if a == arm) for arm in arms}  # each arm's first round
    lossless = all(r.token_ids == res["plain"].token_ids for _, r in runs)
    tps = {
        arm: statistics.median(r.stats.decode_tokens_per_s for a, r in runs if a == arm)
        for arm in arms
    }
    stats = {arm: r.stats for arm, r in res.items()}
    plain, default = stats["plain"], stats["default"]
    out = {
        **row,
        "prompt_tokens": plain.prompt_tokens,
        "new_tokens": plain.new_tokens,
        "lossless": lossless,
        **{f"{arm}_tokens_per_s": round(v, 2) for arm, v in tps.items()},
        **{f"{arm}_speedup": _ratio(v, tps["plain"]) for arm, v in tps.items() if arm != "plain"},
        **_sources(default),
        "ttft_ms": round(default.ttft_s * 1e3, 1),
        "plain_ttft_ms": round(plain.ttft_s * 1e3, 1),
        "default_step_ms": round(default.step_ms, 2),
        "plain_step_ms": round(plain.step_ms, 2),
        "finish_reason": plain.finish_reason,
    }
    out["speedup"] = out["default_speedup"]
    return out, stats


def _sources(s) -> dict:
    """What the default arm ran: steps per source, tokens committed per step, verify lengths
    chosen."""
    steps = len(s.acceptance_lengths) + len(s.lookup_lengths) + s.plain_steps
    return {
        "drafter_steps": len(s.acceptance_lengths),
        "lookup_steps": len(s.lookup_lengths),
        "plain_steps": s.plain_steps,
        "probe_steps": s.probe_steps,
        "steps": steps,
        "drafter_tokens_per_step": _mean(s.acceptance_lengths),
        "lookup_tokens_per_step": _mean(s.lookup_lengths),
        "verify_len_mean": _mean(s.verify_lens),
        "tokens_per_step": _ratio(s.new_tokens - 1, steps),
    }


def _mean(values) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if b else None


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None


def by_category(rows: list[dict], raw: list[dict]) -> dict:
    """Per category: median tokens/s and speedups per arm, steps by source, acceptance per
    source."""
    out = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        sel = [i for i, r in enumerate(rows) if r["category"] == cat]
        d = [raw[i]["default"] for i in sel]
        cat_rows = [rows[i] for i in sel]
        merged = _sources(_Merged(d))
        out[cat or "(none)"] = {
            "prompts": len(sel),
            **{
                k: _median(cat_rows, k)
                for k in (
                    "plain_tokens_per_s",
                    "always_tokens_per_s",
                    "default_tokens_per_s",
                    "speedup",
                    "always_speedup",
                )
            },
            **merged,
            "lossless": all(r["lossless"] for r in cat_rows),
        }
    return out


class _Merged:
    """Several generations' stats summed, for `_sources`."""

    def __init__(self, stats):
        self.acceptance_lengths = [a for s in stats for a in s.acceptance_lengths]
        self.lookup_lengths = [a for s in stats for a in s.lookup_lengths]
        self.verify_lens = [a for s in stats for a in s.verify_lens]
        self.plain_steps = sum(s.plain_steps for s in stats)
        self.probe_steps = sum(s.probe_steps for s in stats)
        self.new_tokens = sum(s.new_tokens - 1 for s in stats) + 1


def summarize(rows: list[dict], raw: list[dict], gen, args) -> dict:
    from ..runtime.calibrate import machine_info

    def overhead(arm):
        stats = [r[arm] for r in raw]
        wall = sum(s.decode_s for s in stats)
        return round(1 - sum(s.decode_run_s for s in stats) / wall, 4) if wall else None

    default = [r["default"] for r in raw]
    # tau of the drafter's full blocks
    drafter_arm = "always" if raw and "always" in raw[0] else "default"
    drafted = [a for r in raw for a in r[drafter_arm].acceptance_lengths]
    manifest = gen.bundle.manifest
    source = manifest.get("source", {})
    return {
        "speedup": _median(rows, "speedup"),
        "always_speedup": _median(rows, "always_speedup"),
        "spec_tokens_per_s": _median(rows, "default_tokens_per_s"),
        "ar_tokens_per_s": _median(rows, "plain_tokens_per_s"),
        "always_tokens_per_s": _median(rows, "always_tokens_per_s"),
        "mean_acceptance_length": _mean(drafted),
        "mean_acceptance_length_arm": drafter_arm,
        "lossless": all(r["lossless"] for r in rows),
        "ttft_ms": _median(rows, "ttft_ms"),
        "ar_ttft_ms": _median(rows, "plain_ttft_ms"),
        "spec_step_ms": _median(rows, "default_step_ms"),
        "ar_step_ms": _median(rows, "plain_step_ms"),
        "python_overhead": {arm: overhead(arm) for arm in raw[0]} if raw else {},
        "draft_share_of_spec_run_time": round(
            sum(s.draft_run_s for s in default) / max(sum(s.decode_run_s for s in default), 1e-12),
            4,
        ),
        "by_category": by_category(rows, raw),
        "tuned_verify_len": gen.tuned.verify_len if gen.tuned else None,
        "verify_len_override": args.verify_len,
        "peak_rss_mb": round(peak_rss_bytes() / 2**20, 1),
        "prompts": len(rows),
        "max_new_tokens": args.max_new_tokens,
        "bundle": {
            "path": str(gen.bundle.root),
            "block_size": gen.block_size,
            "max_context": gen.max_context,
            "family": manifest["model"]["family"],
            "drafter": source.get("drafter"),
            "drafter_random_init": source.get(
                "drafter_random_init", source.get("drafter") == "random"
            ),
        },
        "arms": list(raw[0]) if raw else [],
        "provider": args.provider,
        "machine": {**machine_info(args.threads), "spin": args.spin},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run(args) -> int:
    from ..runtime.generator import Generator

    rows_in = load_prompts(args.prompts, args.limit)
    if args.repeats < 1:
        raise DflashEdgeError(f"--repeats {args.repeats}: run each arm at least once")
    gen = bench_report.prepare(
        args,
        Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin),
    )
    if args.verify_len is not None:
        check_verify_len(args.verify_len, gen.block_size, "--verify-len")
    arms = ("plain", "default") if args.skip_always else ("plain", "always", "default")
    plan = BenchPlan(arms, args.max_new_tokens, args.verify_len, args.repeats)
    for arm in arms:  # warm-up: first runs pay lazy initialisation
        gen.generate("Hello", max_new_tokens=8, draft=ARMS[arm])
    gen.reset()  # energy: the warm-up is not metered
    rows, raw = [], []
    for i, row in enumerate(_progress(rows_in)):
        out, stats = bench_prompt(gen, row, i, plan)
        rows.append(out)
        raw.append(stats)
    report = summarize(rows, raw, gen, args)
    bench_report.finish(args, gen, report, rows, raw)  # energy fields; --report DIR
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({**report, "rows": rows}, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if not report["lossless"]:
        bad = [r["id"] for r in rows if not r["lossless"]]
        print(
            f"dflash-edge bench: speculative output differs from autoregressive on {bad}",
            file=sys.stderr,
        )
        return 1
    return 0


def _progress(rows):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is not a runtime dependency
        return rows
    return tqdm(rows, desc="bench", unit="prompt", file=sys.stderr)
