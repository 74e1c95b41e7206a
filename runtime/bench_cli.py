"""`dflash-edge bench BUNDLE`: speculative vs autoregressive on a prompt set, with a losslessness check.

Each prompt runs with the drafter and without it back to back (the order alternates per prompt), greedy,
so both see the same machine load. `speedup` is the median over prompts of spec ÷ AR decode tokens/s;
`lossless` is true iff every pair produced identical tokens. Exit status 1 when a pair differs.
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts.jsonl"


def add_arguments(p) -> None:
    p.add_argument("bundle", help="bundle directory")
    p.add_argument("--prompts", default=None, help=f"JSONL with a 'prompt' per line (default: {DEFAULT_PROMPTS.name} "
                                                    "shipped in benchmarks/)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="only the first K prompts (0: all)")
    p.add_argument("--json", dest="json_out", default=None, help="write the full report (with per-prompt rows) here")
    p.add_argument("--auto-draft", action="store_true",
                   help="speculative arm drafts only while it is measured to pay (use_draft='auto')")
    p.add_argument("--provider", default="cpu", help="cpu | cuda | tensorrt")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: one per usable CPU)")


def load_prompts(path: str | Path | None, limit: int = 0) -> list[dict]:
    """Rows with `prompt` (and `id`, `category` when given) from a JSONL file."""
    from .errors import DflashEdgeError

    path = Path(path) if path else DEFAULT_PROMPTS
    if not path.is_file():
        raise DflashEdgeError(f"prompts file {path} not found; pass --prompts FILE.jsonl")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DflashEdgeError(f"{path}:{n} is not valid JSON ({err})") from err
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise DflashEdgeError(f"{path}:{n} needs a string field 'prompt'")
        rows.append({"id": row.get("id", f"p{n}"), "category": row.get("category", ""), "prompt": row["prompt"]})
    return rows[:limit] if limit else rows


def bench_prompt(gen, row: dict, index: int, max_new_tokens: int, spec_mode: bool | str = True) -> tuple[dict, dict]:
    """Spec (`spec_mode`: True or "auto") and AR greedy runs of one prompt, order alternating with `index`."""
    order = (spec_mode, False) if index % 2 == 0 else (False, spec_mode)
    res = {use: gen.generate(row["prompt"], max_new_tokens=max_new_tokens, use_draft=use) for use in order}
    spec, ar = res[spec_mode].stats, res[False].stats
    out = {**row, "prompt_tokens": spec.prompt_tokens, "new_tokens": spec.new_tokens,
           "lossless": res[spec_mode].token_ids == res[False].token_ids,
           "spec_tokens_per_s": round(spec.decode_tokens_per_s, 2), "ar_tokens_per_s": round(ar.decode_tokens_per_s, 2),
           "speedup": round(spec.decode_tokens_per_s / ar.decode_tokens_per_s, 3) if ar.decode_tokens_per_s else None,
           "mean_acceptance_length": round(spec.mean_acceptance_length, 3),
           "ttft_ms": round(spec.ttft_s * 1e3, 1), "ar_ttft_ms": round(ar.ttft_s * 1e3, 1),
           "spec_step_ms": round(spec.step_ms, 2), "ar_step_ms": round(ar.step_ms, 2),
           "finish_reason": spec.finish_reason}
    return out, {"spec": spec, "ar": ar}


def summarize(rows: list[dict], raw: list[dict], gen, args) -> dict:
    def median(key):
        vals = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(vals), 3) if vals else None

    def overhead(kind):
        stats = [r[kind] for r in raw]
        wall = sum(s.decode_s for s in stats)
        return round(1 - sum(s.decode_run_s for s in stats) / wall, 4) if wall else None

    spec = [r["spec"] for r in raw]
    steps = sum(len(s.acceptance_lengths) for s in spec)
    manifest = gen.bundle.manifest
    source = manifest.get("source", {})
    return {
        "speedup": median("speedup"), "spec_tokens_per_s": median("spec_tokens_per_s"),
        "ar_tokens_per_s": median("ar_tokens_per_s"),
        "mean_acceptance_length": round(sum(sum(s.acceptance_lengths) for s in spec) / steps, 3) if steps else None,
        "lossless": all(r["lossless"] for r in rows), "ttft_ms": median("ttft_ms"), "ar_ttft_ms": median("ar_ttft_ms"),
        "spec_step_ms": median("spec_step_ms"), "ar_step_ms": median("ar_step_ms"),
        "python_overhead": {"spec": overhead("spec"), "ar": overhead("ar")},
        "draft_share_of_spec_run_time": round(sum(s.draft_run_s for s in spec) / max(sum(s.decode_run_s for s in spec),
                                                                                       1e-12), 4),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "prompts": len(rows), "max_new_tokens": args.max_new_tokens,
        "bundle": {"path": str(gen.bundle.root), "block_size": gen.block_size, "max_context": gen.max_context,
                   "family": manifest["model"]["family"],
                   "drafter": source.get("drafter"), "drafter_random_init": source.get(
                       "drafter_random_init", source.get("drafter") == "random")},
        "spec_mode": "auto" if args.auto_draft else "always",
        "plain_steps_in_spec_runs": sum(s.plain_steps for s in spec),
        "provider": args.provider, "machine": _machine(args.threads),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run(args) -> int:
    from .generator import Generator

    rows_in = load_prompts(args.prompts, args.limit)
    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads)
    for use in (True, False):                                   # warm-up: first runs pay lazy initialisation
        gen.generate("Hello", max_new_tokens=8, use_draft=use)
    rows, raw = [], []
    for i, row in enumerate(_progress(rows_in)):
        out, stats = bench_prompt(gen, row, i, args.max_new_tokens, "auto" if args.auto_draft else True)
        rows.append(out)
        raw.append(stats)
    report = summarize(rows, raw, gen, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({**report, "rows": rows}, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if not report["lossless"]:
        bad = [r["id"] for r in rows if not r["lossless"]]
        print(f"dflash-edge bench: speculative output differs from autoregressive on {bad}", file=sys.stderr)
        return 1
    return 0


def _progress(rows):
    try:
        from tqdm import tqdm
    except ImportError:                                         # tqdm is not a runtime dependency
        return rows
    return tqdm(rows, desc="bench", unit="prompt", file=sys.stderr)


def _peak_rss_mb() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024      # bytes on macOS, KiB on Linux


def _machine(threads: int) -> dict:
    import onnxruntime

    from .session import default_threads

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpus_usable": default_threads(),
            "intra_op_threads": threads or default_threads(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__}
