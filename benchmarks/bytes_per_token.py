"""Weight bytes read per decoded token: a bundle's decode graph against the GGUF it came from
(issue 36, item 3), and plain decode ms/token of bundles side by side.

Ours: every initializer of the decode graph (default `target_fused.onnx`) counted whole, except
those only looked up (Gather / GatherBlockQuantized: one row per token). The GGUF's: every tensor
whole, `token_embd.weight` one row (and whole once more when it is also the head: no
`output.weight`). Sizes come from the graph's and the file's headers; no
weight is read.

    python benchmarks/bytes_per_token.py BUNDLE FILE.gguf [--graph target_fused.onnx]
    python benchmarks/bytes_per_token.py --decode A=BUNDLE_A B=BUNDLE_B [--rounds 3] [--tokens 64]

`--decode`: each bundle loaded in a process of its own, in turn, `--rounds` times (one process per
bundle per round, so one model in memory at a time); plain decoding (`draft="none"`), the same
prompt ids, exactly --tokens new tokens; ms/token excludes prefill and the first token. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

LOOKUPS = {"Gather", "GatherBlockQuantized"}
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def graph_bytes(path: Path) -> dict:
    """{per_token, whole, by_kind}: initializer bytes of an ONNX graph, looked-up tables one row."""
    import numpy as np
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    users: dict[str, set] = {}
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, set()).add(node.op_type)
    per_token, whole, kinds = 0, 0, Counter()
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        whole += n
        looked_up = users.get(t.name, set()) <= LOOKUPS and users.get(t.name)
        read = n // t.dims[0] if looked_up else n
        per_token += read
        kinds[_kind(t.name, looked_up)] += read
    return {"per_token": per_token, "whole": whole, "by_kind": dict(kinds.most_common())}


def _kind(name: str, looked_up) -> str:
    if looked_up:
        return "table rows"
    for part in ("_Q4", "_Q8", "_scales", "_zero_points", "_correction", "block_sum"):
        if part in name:
            return part.strip("_")
    return "other"


def gguf_bytes(path: Path) -> dict:
    """{per_token, whole}: the GGUF's tensor bytes, its token table one row per token."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(path)).tensors
    tied = not any(t.name == "output.weight" for t in tensors)  # the table is also the head
    per_token = whole = 0
    for t in tensors:
        n = int(t.n_bytes)
        whole += n
        per_token += n
        if t.name == "token_embd.weight":
            per_token += n // int(t.shape[-1]) - (0 if tied else n)
    return {"per_token": per_token, "whole": whole, "tied": tied}


WORKER = r"""
import json, sys
from dflash_edge.runtime import Generator
from tokenizers import Tokenizer
path, tokens, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ids = Tokenizer.from_file(path + "/tokenizer.json").encode(prompt).ids
gen = Generator.load(path, threads=2, verify=False)
gen.generate_ids(ids, 8, draft="none", stop_token_ids=())  # warm-up
res = gen.generate_ids(ids, tokens, draft="none", stop_token_ids=())
print(json.dumps({"ms": 1e3 * res.stats.decode_s / (tokens - 1), "tokens": res.token_ids}))
"""


def decode(bundles: dict[str, str], rounds: int, tokens: int) -> dict:
    """Median plain-decode ms/token per bundle, interleaved rounds; and whether all agree."""
    ms: dict[str, list[float]] = {k: [] for k in bundles}
    seqs = {}
    for _ in range(rounds):
        for label, path in bundles.items():
            out = subprocess.run(
                [sys.executable, "-c", WORKER, path, str(tokens), PROMPT],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            ms[label].append(got["ms"])
            seqs[label] = got["tokens"]
    first = next(iter(seqs.values()))
    return {
        "ms_per_token_median": {k: round(statistics.median(v), 2) for k, v in ms.items()},
        "ms_per_token_rounds": {k: [round(x, 2) for x in v] for k, v in ms.items()},
        "same_tokens": all(s == first for s in seqs.values()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", nargs="?")
    ap.add_argument("gguf", nargs="?")
    ap.add_argument("--graph", default="target_fused.onnx", help="the decode graph's file")
    ap.add_argument("--decode", nargs="+", default=None, metavar="LABEL=BUNDLE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if args.decode:
        bundles = dict(item.split("=", 1) for item in args.decode)
        print(json.dumps(decode(bundles, args.rounds, args.tokens), indent=1))
        return 0
    if not (args.bundle and args.gguf):
        ap.error("give BUNDLE and FILE.gguf, or --decode LABEL=BUNDLE ...")
    ours, theirs = graph_bytes(Path(args.bundle) / args.graph), gguf_bytes(Path(args.gguf))
    report = {
        "graph": args.graph,
        "ours": ours,
        "gguf": theirs,
        "ratio_per_token": round(ours["per_token"] / theirs["per_token"], 3),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
