"""The shipped drafter's acceptance length (tau) at each drafter precision (issue 47): one bundle of
the default target per precision (the CPU's default target: int4 exact blocks as standard
DequantizeLinear, int8 KV cache; only the drafter's own layers differ), greedy DFlash over the
same chat prompts, tau pooled over every verify step. fp16 is exported with parity first; where
parity sees it overflow, the message is recorded and it is measured anyway without parity.

    python benchmarks/drafter_precision_tau.py [--work /tmp/dtau] [--prompts heldout] [--texts 8]
        [--new-tokens 64] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "int8", "int4")


def export(out: Path, precision: str, verify: bool) -> Path:
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    # standard: DequantizeLinear over the GGUF's own blocks (row-exact, like contrib's MatMulNBits),
    # which an fp16 drafter can read the shared tables through
    opts = ExportOptions(
        out=out, draft_precision=precision, force=True, verify=verify, low_bit_ops="standard"
    )
    return export_bundle(opts, progress=False)


def bundle_for(work: Path, precision: str) -> tuple[Path, str]:
    """(the bundle, how parity went) for a `precision` drafter."""
    from dflash_edge.export.graph_builder import Float16Overflow

    out = work / precision
    try:
        return export(out, precision, verify=True), "ok"
    except Float16Overflow as err:
        return export(out, precision, verify=False), f"overflowed: {str(err)[:120]}"


def tau(bundle: Path, prompts: list[str], new_tokens: int, threads: int) -> dict:
    """Pooled acceptance length and drafted tokens per verify over `prompts`."""
    from dflash_edge.runtime import GenerationOptions, Generator

    gen = Generator.load(bundle, threads=threads)
    opts = GenerationOptions(max_new_tokens=new_tokens, draft="drafter")
    lengths = []
    for p in prompts:
        lengths += list(gen.generate(p, opts).stats.acceptance_lengths)
    return {"tau": round(sum(lengths) / len(lengths), 3), "verify_steps": len(lengths)}


def main(argv=None) -> int:
    from dflash_edge.data import read_prompts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/dtau")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    p.add_argument("--prompts", default="heldout")
    p.add_argument("--texts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    prompts = [r["prompt"] for r in read_prompts(args.prompts, limit=args.texts)]
    rows = {}
    for precision in args.precisions:
        bundle, parity = bundle_for(Path(args.work), precision)
        drafter = json.loads((bundle / "manifest.json").read_text())["graphs"]["drafter"]
        rows[precision] = {
            **tau(bundle, prompts, args.new_tokens, args.threads),
            "parity": parity,
            "drafter_weight_mb": round(drafter["weight_bytes"] / 1e6, 1),
        }
        r = rows[precision]
        print(
            f"{precision:5s} tau {r['tau']:.3f} over {r['verify_steps']} verifies; drafter "
            f"{r['drafter_weight_mb']} MB; parity {parity}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
