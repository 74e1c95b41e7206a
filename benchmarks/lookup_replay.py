"""How far prompt lookup can go on the `code` set, replayed without the model (issue 37's bar).

Each edit row's greedy answer is generated once (plain decoding, the bundle's own tokens; cached in
`--ids`), then replayed with each step's cost taken from the bundle's tuned.json (a verify of k
proposals costs verify_ms[k] / decode_ms decodes):

  runtime   the runtime's own Proposer + AdaptivePolicy with the lookup source, fed those step
            times: what `draft="auto"` does on a bundle whose drafter never pays
  oracle_k  our lookup's proposals, each verified at the k that pays best knowing how many of them
            the target will accept: no policy over this source can beat it
  bound     any earlier run of the text (prompt + answer so far) that continues as the answer does,
            at its best k: no lookup at all can beat it

Figures are answer tokens per decode-equivalent (plain decoding = 1.0), medians per kind (edit:
asked in chat; editor: asked as editors ask). Replay cannot see host overheads, so measured
speedups (code_completion.py) come out a little lower.

    python benchmarks/lookup_replay.py BUNDLE --max-new-tokens 192 --ids ids.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from code_completion import row_kind  # the same row kinds as the measured runs


def answers(bundle: str, rows: list[dict], n: int) -> list[dict]:
    from dflash_edge.runtime import Generator

    gen = Generator.load(bundle, use_tuned=False)
    out = []
    for row in rows:
        res = gen.generate(row["prompt"], max_new_tokens=n, draft="none")
        out.append({"id": row["id"], "prompt": gen.encode(row["prompt"]), "out": res.token_ids})
        print(row["id"], len(res.token_ids), file=sys.stderr)
    return out


def _agree(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _best_k(accepted: int, ratio: dict[int, float]) -> int:
    kmax = max(ratio)
    return max(range(min(accepted, kmax) + 1), key=lambda k: (k + 1) / ratio[k])


def oracle(prompt: list[int], out: list[int], ratio: dict, bound: bool) -> float:
    from dflash_edge.runtime.lookup import PromptLookup

    lookup, seen, i, cost = PromptLookup(list(prompt)), list(prompt), 0, 0.0
    while i < len(out):
        rest = out[i:]
        if bound:
            accepted = max((_agree(seen[j:], rest) for j in range(len(seen))), default=0)
        else:
            accepted = _agree(lookup.propose(max(ratio)), rest)
        k = _best_k(accepted, ratio)
        step = min(k + 1, len(rest))
        cost += ratio[k]
        lookup.extend(rest[:step])
        seen += rest[:step]
        i += step
    return len(out) / cost


def runtime(prompt: list[int], out: list[int], tuned, ratio: dict, block: int) -> float:
    from dflash_edge.runtime.policy import make_policy
    from dflash_edge.runtime.proposals import LookupProposals, Proposer

    source = LookupProposals(list(prompt), block - 1)
    proposer = Proposer([source], make_policy("auto", block, [source], tuned), block - 1)
    text, i, cost = list(prompt) + list(out), 0, 0.0
    while i < len(out):
        pos = len(prompt) + i - 1
        _, drafts = proposer.propose(last=text[pos], pos=pos, room=len(out) - i + 1)
        k = len(drafts)
        step = min(_agree(list(drafts), out[i:]) + 1, len(out) - i)
        cost += ratio[k]
        proposer.commit(out[i : i + step], ratio[k] * tuned.decode_ms / 1e3)
        i += step
    return len(out) / cost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--ids", help="cache of the greedy answers (JSON): read if there, else made")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from dflash_edge.data import read_prompts
    from dflash_edge.runtime.bundle import read_bundle
    from dflash_edge.runtime.tuning import read_tuned

    bundle = read_bundle(args.bundle)
    tuned = read_tuned(bundle)
    if tuned is None:
        raise SystemExit(f"{args.bundle} has no tuned.json: run `dflash-edge tune` on it first")
    rows = [r for r in read_prompts("code") if "suffix" not in r]
    kind = {r["id"]: row_kind(r) for r in rows}
    cache = Path(args.ids) if args.ids else None
    if cache and cache.is_file():
        done = json.loads(cache.read_text())
    else:
        done = answers(args.bundle, rows, args.max_new_tokens)
        if cache:
            cache.write_text(json.dumps(done))
    ratio = {0: 1.0, **{k: v / tuned.decode_ms for k, v in tuned.verify_ms.items()}}
    block = bundle.manifest["block_size"]
    report = []
    for r in done:
        p, o = r["prompt"], r["out"][: args.max_new_tokens]
        report.append(
            {
                "id": r["id"],
                "kind": kind.get(r["id"], "edit"),
                "tokens": len(o),
                "runtime": round(runtime(p, o, tuned, ratio, block), 3),
                "oracle_k": round(oracle(p, o, ratio, bound=False), 3),
                "bound": round(oracle(p, o, ratio, bound=True), 3),
            }
        )
        print(json.dumps(report[-1]), file=sys.stderr)
    summary = {
        k: {
            col: round(statistics.median(r[col] for r in report if r["kind"] == k), 3)
            for col in ("runtime", "oracle_k", "bound")
        }
        for k in sorted({r["kind"] for r in report})
    }
    summary["verify_15_in_decodes"] = round(ratio[max(ratio)], 2)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": report, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
