"""Plain decode of our bundles vs onnxruntime-genai's models: ms/token, interleaved per prompt.

Same prompts (the shipped set `bench`, data/prompts/bench.jsonl), same chat template (our tokenizer
encodes; genai gets the ids), greedy, exactly --new-tokens tokens each (no early stop), the same
intra-op thread count. genai runs in a worker process of its own venv's python (it needs no
dflash-edge), talking JSON lines over stdin/stdout. ms/token = (last token - first token) /
(new tokens - 1): prefill and the first token are excluded on both.

    python benchmarks/vs_genai.py --ours int4=/tmp/quant-b/int4 --ours fp32=/work/bundles/fp32 \\
        --genai int4=/work/genai-int4 --genai fp32=/work/genai-fp32 \\
        --genai-python /work/genai-venv/bin/python \\
        [--prompts 8] [--new-tokens 128] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from output import emit_json

WORKER = r"""
import json, sys, time
import onnxruntime_genai as og
path, threads = sys.argv[1], int(sys.argv[2])
config = og.Config(path)
config.clear_providers()                                    # CPU
cfg = json.load(open(path + "/genai_config.json"))
opts = cfg["model"]["decoder"]["session_options"]
assert opts.get("intra_op_num_threads") == threads, "threads not set"
model = og.Model(config)
print(json.dumps({"ready": True, "settings": {"onnxruntime_genai": og.__version__,
                                              "session_options": opts}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    params = og.GeneratorParams(model)
    n = len(req["ids"]) + req["new"]
    params.set_search_options(do_sample=False, max_length=n, min_length=n)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(req["ids"])
    tokens, stamps = [], []
    while len(tokens) < req["new"]:
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
        stamps.append(time.perf_counter())
    print(json.dumps({"tokens": tokens, "prefill_s": stamps[0] - t0,
                      "decode_s": stamps[-1] - stamps[0]}), flush=True)
"""


class GenaiWorker:
    """One genai model in a worker process of the genai venv."""

    def __init__(self, python: str, path: str, threads: int):
        set_genai_threads(Path(path), threads)
        self.proc = subprocess.Popen(
            [python, "-c", WORKER, path, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self.proc.stdout.readline())["ready"]

    def run(self, ids: list[int], new: int) -> dict:
        self.proc.stdin.write(json.dumps({"ids": ids, "new": new}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return {"tokens": out["tokens"], "ms_per_token": 1e3 * out["decode_s"] / (new - 1)}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def set_genai_threads(path: Path, threads: int) -> None:
    """genai reads its session options from genai_config.json: pin intra-op threads there."""
    cfg_path = path / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    if opts.get("intra_op_num_threads") != threads:
        opts.update(intra_op_num_threads=threads, inter_op_num_threads=1)
        cfg_path.write_text(json.dumps(cfg, indent=4))


class OursRunner:
    def __init__(self, path: str, threads: int):
        from dflash_edge.runtime import Generator

        self.gen = Generator.load(path, threads=threads, verify=False)

    def run(self, ids: list[int], new: int) -> dict:
        res = self.gen.generate_ids(ids, new, draft="none", stop_token_ids=())
        return {"tokens": res.token_ids, "ms_per_token": 1e3 * res.stats.decode_s / (new - 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", action="append", default=[], help="LABEL=BUNDLE (repeatable)")
    ap.add_argument(
        "--genai", action="append", default=[], help="LABEL=GENAI_MODEL_DIR (repeatable)"
    )
    ap.add_argument("--genai-python", default="/work/genai-venv/bin/python")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from dflash_edge.data import read_prompts as load_prompts

    runners = {}
    for spec in args.ours:
        label, path = spec.split("=", 1)
        runners[f"ours-{label}"] = OursRunner(path, args.threads)
    for spec in args.genai:
        label, path = spec.split("=", 1)
        runners[f"genai-{label}"] = GenaiWorker(args.genai_python, path, args.threads)
    tok = next(r for r in runners.values() if isinstance(r, OursRunner)).gen
    prompts = [row["prompt"] for row in load_prompts(None, args.prompts)]
    ms = {k: [] for k in runners}
    tokens = {k: [] for k in runners}
    for name, r in runners.items():  # warm-up: one short run each
        r.run(tok.encode("Hello"), 8)
    for i, prompt in enumerate(prompts):
        ids = tok.encode(prompt)
        order = (
            list(runners) if i % 2 == 0 else list(reversed(runners))
        )  # interleaved, alternating order
        for name in order:
            out = runners[name].run(ids, args.new_tokens)
            ms[name].append(out["ms_per_token"])
            tokens[name].append(out["tokens"])
        print(
            f"prompt {i + 1}/{len(prompts)}: " + ", ".join(f"{k} {ms[k][-1]:.1f}" for k in runners),
            file=sys.stderr,
        )
    for r in runners.values():
        if isinstance(r, GenaiWorker):
            r.close()
    med = {k: statistics.median(v) for k, v in ms.items()}
    result = {
        "prompts": len(prompts),
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "median_ms_per_token": {k: round(v, 2) for k, v in med.items()},
        "all_ms_per_token": {k: [round(x, 2) for x in v] for k, v in ms.items()},
        "ratios": {
            f"{a}/{b}": round(med[a] / med[b], 3)
            for a in med
            for b in med
            if a.startswith("ours") and b.startswith("genai") and a.split("-")[1] == b.split("-")[1]
        },
        "same_tokens_as_genai": {
            f"{a}/{b}": round(
                sum(x == y for s, t in zip(tokens[a], tokens[b]) for x, y in zip(s, t))
                / sum(map(len, tokens[a])),
                3,
            )
            for a in med
            for b in med
            if a.startswith("ours") and b.startswith("genai") and a.split("-")[1] == b.split("-")[1]
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    emit_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
