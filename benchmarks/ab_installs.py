"""Two dflash-edge installs side by side on one bundle: same prompts, arms interleaved per prompt.

For a refactor or a dependency bump: is the new code as fast as the old? Each install runs in its
own worker process (its folder first on PYTHONPATH, e.g. one made by
`pip install --no-deps --target DIR WHEEL`) with the bundle loaded once; per prompt the runs
alternate A, B, B, A ... so machine noise hits both alike. Reports per install and arm the median
tokens/s over prompts (whole `generate` call, prefill included), and the median per-prompt ratio
B / A. Greedy outputs must agree across installs and arms (lossless).

    python benchmarks/ab_installs.py BUNDLE --a /tmp/old_site --b . --prompts quote \\
        --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from output import emit_json

# The worker speaks both APIs: `draft="none"|"auto"` (GenerationOptions) and the older
# `use_draft=False|"auto"`.
WORKER = r"""
import json, sys, time
from dflash_edge.runtime import Generator
gen = Generator.load(sys.argv[1])
try:
    from dflash_edge.runtime import GenerationOptions  # noqa: F401
    arm = {"plain": {"draft": "none"}, "default": {"draft": "auto"}}
except ImportError:
    arm = {"plain": {"use_draft": False}, "default": {"use_draft": "auto"}}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    t = time.perf_counter()
    res = gen.generate(job["prompt"], max_new_tokens=job["max_new_tokens"], **arm[job["arm"]])
    print(json.dumps({"s": time.perf_counter() - t, "ids": res.token_ids}), flush=True)
"""


class Worker:
    def __init__(self, site: str, bundle: str):
        env = {**os.environ, "PYTHONPATH": str(Path(site).resolve())}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, bundle],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        assert json.loads(self.proc.stdout.readline())["ready"]

    def run(self, prompt: str, arm: str, max_new_tokens: int) -> dict:
        self.proc.stdin.write(
            json.dumps({"prompt": prompt, "arm": arm, "max_new_tokens": max_new_tokens}) + "\n"
        )
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--a", required=True, help="folder of install A (first on PYTHONPATH)")
    p.add_argument("--b", required=True, help="folder of install B")
    p.add_argument("--prompts", default="bench", help="a shipped prompt set or a JSONL file")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--json")
    args = p.parse_args(argv)
    from dflash_edge.data import read_prompts

    rows = read_prompts(args.prompts, args.limit)
    workers = {"A": Worker(args.a, args.bundle), "B": Worker(args.b, args.bundle)}
    rate = {(w, arm): [] for w in workers for arm in ("plain", "default")}
    lossless = True
    for i, row in enumerate(rows):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        outs = []
        for arm in ("plain", "default"):
            for w in order if arm == "plain" else order[::-1]:
                out = workers[w].run(row["prompt"], arm, args.max_new_tokens)
                rate[w, arm].append(len(out["ids"]) / out["s"])
                outs.append(out["ids"])
        lossless &= all(o == outs[0] for o in outs)
    med = {f"{w}_{arm}": round(statistics.median(v), 2) for (w, arm), v in rate.items()}
    ratio = {
        arm: round(statistics.median(b / a for a, b in zip(rate["A", arm], rate["B", arm])), 3)
        for arm in ("plain", "default")
    }
    speedup = {
        w: round(statistics.median(d / p for p, d in zip(rate[w, "plain"], rate[w, "default"])), 3)
        for w in workers
    }
    report = {
        "bundle": args.bundle,
        "a": args.a,
        "b": args.b,
        "prompts": args.prompts,
        "n": len(rows),
        "max_new_tokens": args.max_new_tokens,
        "median_tokens_per_s": med,
        "b_over_a": ratio,
        "default_over_plain": speedup,
        "lossless": lossless,
    }
    emit_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
