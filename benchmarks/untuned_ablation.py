"""Where the untuned default loop's time goes (issue 35): plain, default, default without drafter
probes, default without prompt lookup, interleaved per prompt as in untuned_default.py.

    python benchmarks/untuned_ablation.py BUNDLE --limit 10 --repeats 2  # heldout's chat prompts
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import untuned_default as base  # noqa: E402  (its arms and interleaved timing: one implementation)

from dflash_edge.data import read_prompts  # noqa: E402
from dflash_edge.runtime import Generator, policy, proposals  # noqa: E402

_lookup = proposals.LookupProposals.propose


def _no_probe(self, costly):
    return 10**9  # the next probe never comes (nor the first)


def _no_lookup(self, last, pos, limit):
    found = _lookup(self, last, pos, limit)
    found.tokens = []
    return found


# arm -> (class, method, replacement) patched while it runs
PATCHES = {
    "noprobe": (policy.AdaptivePolicy, "_probe_spacing", _no_probe),
    "nolookup": (proposals.LookupProposals, "propose", _no_lookup),
}


def run_arm(gen, prompt: str, arm: str, max_new_tokens: int):
    if arm not in PATCHES:
        return plain_run(gen, prompt, arm, max_new_tokens)
    owner, name, fn = PATCHES[arm]
    saved = getattr(owner, name)
    setattr(owner, name, fn)
    try:
        return plain_run(gen, prompt, "default", max_new_tokens)
    finally:
        setattr(owner, name, saved)


plain_run, base.run_arm = base.run_arm, run_arm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--limit", type=int, default=10, help="the first K heldout prompts (10: chat)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    gen = Generator.load(args.bundle, verify=False, use_tuned=False)
    gen.generate("Hello", max_new_tokens=8)  # warm the sessions
    arms = ["plain", "default", "noprobe", "nolookup"]
    base.ARMS.update({arm: ("auto", {}) for arm in PATCHES})
    rows = [
        base.bench_prompt(gen, r["prompt"], i, arms, args.max_new_tokens, args.repeats)
        for i, r in enumerate(read_prompts("heldout", args.limit))
    ]
    print(
        {arm: round(statistics.median(r[f"{arm}_ratio"] for r in rows), 3) for arm in arms[1:]},
        "lossless:",
        all(r["lossless"] for r in rows),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
