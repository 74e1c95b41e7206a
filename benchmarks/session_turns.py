"""Sessions: a conversation of several turns and an editor's keystrokes, ours against llama.cpp.

Each request resends what the last one sent and adds a little. Both engines keep the longest common
prefix of the last request (ours: the Generator's kept state; llama.cpp: its context, as
llama-server does) and prefill only the rest. The figure is the time to the first token per
request; the tokens of every warm request are compared with a cold run of the same ids.

    python benchmarks/session_turns.py chat --ours B --gguf F.gguf --llama-python PY --threads 2
    python benchmarks/session_turns.py editor --ours B --gguf F.gguf --llama-python PY --threads 2
    python benchmarks/session_turns.py alternate --ours B --threads 2 --cache-ram-mb 256

One engine runs at a time (both spin their threads); rounds alternate ours / llama.cpp.
`alternate` interleaves two conversations' turns (A1 B1 A2 B2 ...) and runs ours twice: with the RAM
prompt cache (`--cache-ram-mb`, as `serve`) and with none (0: only the live sequence is kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

LLAMA_SESSION = r"""
import json, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
path, threads, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
print(json.dumps({"ready": True, "settings": {"llama_cpp_python": llama_cpp.__version__,
      "n_ctx": ctx, "n_threads": threads, "n_batch": llm.n_batch}}), flush=True)
n_vocab = llm.n_vocab()
def top1():
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
    return int(row.argmax())
for line in sys.stdin:
    req = json.loads(line)
    ids = req["ids"]
    if req.get("reset"):
        llm.reset()
    kept = list(llm._input_ids[: llm.n_tokens])
    same = 0
    for a, b in zip(kept, ids):
        if a != b:
            break
        same += 1
    same = min(same, len(ids) - 1)  # the last prompt token runs: its logits
    t0 = time.perf_counter()
    llm.n_tokens = same             # eval() drops the cache after n_tokens
    llm.eval(ids[same:])
    tokens = [top1()]
    ttft = time.perf_counter() - t0
    while len(tokens) < req["new"]:
        llm.eval([tokens[-1]])
        tokens.append(top1())
    print(json.dumps({"tokens": tokens, "ttft_s": ttft, "cached": same}), flush=True)
"""


class Llama:
    """llama-cpp-python in a worker process of its own venv, keeping its context between calls."""

    def __init__(self, python: str, gguf: str, threads: int, ctx: int):
        self.proc = subprocess.Popen(
            [python, "-c", LLAMA_SESSION, gguf, str(threads), str(ctx)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"llama.cpp worker ({python}) did not start (see its stderr)")
        self.settings = json.loads(line)["settings"]

    def run(self, ids: list[int], new: int, reset: bool = False) -> dict:
        self.proc.stdin.write(json.dumps({"ids": ids, "new": new, "reset": reset}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


class Ours:
    """Our bundle, plain decoding, the Generator keeping its last sequence."""

    def __init__(self, bundle: str, threads: int, cache_ram_mb: float = 0, chunk: int = 0):
        from dflash_edge.runtime import Generator

        self.gen = Generator.load(bundle, threads=threads, verify=False, drafter=False)
        self.cache_ram_mb = cache_ram_mb
        if chunk:  # prefill rows per call other than the bundle's (exact chunks: never past the
            self.gen.prefill_chunk = chunk  # prompt, so any size stays inside the cache)

    def run(self, ids: list[int], new: int, reset: bool = False) -> dict:
        res = self.gen.generate_ids(
            ids, new, draft="none", stop_token_ids=(), cache_prompt=not reset
        )
        if reset:  # an empty RAM cache: nothing of an earlier round is kept but this request
            self.gen.keep_prompts(self.cache_ram_mb)
        s = res.stats
        return {"tokens": res.token_ids, "ttft_s": s.ttft_s, "cached": s.cached_tokens}


def conversation(
    encode, turns: int, context_tokens: int, answer: int, skip: int = 0
) -> list[list[int]]:
    """The ids of each turn: a long first message, then short follow-ups; each turn resends the
    whole conversation through the chat template (the answers are placeholders of `answer` words:
    what matters is that each request extends the last one). `skip`: start further down the
    prompt list (another conversation)."""
    from dflash_edge.data import read_prompts

    rows = (read_prompts("bench") + read_prompts("heldout"))[skip:]
    lines, ids = ["Read these questions; I will ask about them."], []
    for i, row in enumerate(rows, 1):
        trial = encode([{"role": "user", "content": "\n".join([*lines, row["prompt"]])}])
        if len(trial) > context_tokens:
            break
        lines.append(f"{i}. {row['prompt']}")
    messages = [{"role": "user", "content": "\n".join(lines) + "\nWhich one is about space?"}]
    for t in range(turns):
        ids.append(encode(messages))
        reply = " ".join(f"word{t}{k}" for k in range(answer))
        follow = f"Thanks. Now tell me which question number {t + 2} asks, in a few words, please."
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": follow},
        ]
    return ids


def editor(gen, keystrokes: int) -> list[list[int]]:
    """llama.vscode's shape: another file as extra context, a ~3,000-character prefix, a
    ~900-character suffix; each keystroke adds one character at the cursor."""
    import inspect

    from dflash_edge import runtime
    from dflash_edge.runtime.fim import FimPrompt

    source = inspect.getsource(runtime.generator)
    other = inspect.getsource(runtime.sampling)[:2500]
    cut = 3000
    prefix, suffix = source[:cut], source[cut : cut + 900]
    typed = "    result = compute_the_value(alpha, beta)\n"
    out = []
    for k in range(keystrokes + 1):
        fim = FimPrompt(prefix=prefix + typed[:k], suffix=suffix, extra=(("sampling.py", other),))
        out.append(gen.fim.encode(gen.tokenizer, fim)[0])
    return out


def session(engine, requests: list[list[int]], new: int) -> list[dict]:
    return [engine.run(ids, new, reset=(i == 0)) for i, ids in enumerate(requests)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("kind", choices=["chat", "editor", "alternate"])
    p.add_argument("--ours", required=True, help="bundle directory")
    p.add_argument("--gguf", help="the same model's GGUF for llama.cpp (omit: ours alone)")
    p.add_argument("--llama-python", default="python", help="python of llama-cpp-python's venv")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--turns", type=int, default=4, help="chat: requests in the conversation")
    p.add_argument("--keystrokes", type=int, default=6, help="editor: requests after the first")
    p.add_argument("--context-tokens", type=int, default=1000)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cache-ram-mb", type=float, default=256, help="alternate: ours' RAM cache")
    p.add_argument("--prefill-chunk", type=int, default=0, help="ours' prefill rows per call")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)

    ram = args.cache_ram_mb if args.kind == "alternate" else 0
    ours = Ours(args.ours, args.threads, ram, args.prefill_chunk)
    gen = ours.gen
    if args.kind == "editor":
        requests, new = editor(gen, args.keystrokes), 8
    else:
        requests = conversation(gen.tokenizer.encode_chat, args.turns, args.context_tokens, 16)
        new = args.new_tokens
    if args.kind == "alternate":
        other = conversation(gen.tokenizer.encode_chat, args.turns, args.context_tokens, 16, 40)
        requests = [ids for pair in zip(requests, other) for ids in pair]
    engines = {"ours": ours}
    if args.kind == "alternate":
        engines["ours, no RAM cache"] = Ours(args.ours, args.threads, 0)
    elif args.gguf:
        engines["llama.cpp"] = Llama(args.llama_python, args.gguf, args.threads, 4096)
    cold = [ours.run(ids, new, reset=True)["tokens"] for ids in requests]
    runs: dict[str, list[list[dict]]] = {k: [] for k in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            runs[name].append(session(engine, requests, new))
    result = {"kind": args.kind, "threads": args.threads, "prompt_tokens": list(map(len, requests))}
    for name, rounds in runs.items():
        ttft = [statistics.median(r[i]["ttft_s"] for r in rounds) for i in range(len(requests))]
        result[name] = {
            "ttft_s": [round(t, 3) for t in ttft],
            "cached": [rounds[-1][i]["cached"] for i in range(len(requests))],
            "later_over_first": round(statistics.median(ttft[1:]) / ttft[0], 3),
        }
    for name in runs:
        if name.startswith("ours"):
            result[name]["warm_equals_cold"] = all(
                r[i]["tokens"] == cold[i] for r in runs[name] for i in range(len(requests))
            )
    if "ours, no RAM cache" in runs:
        a, b = result["ours"]["ttft_s"], result["ours, no RAM cache"]["ttft_s"]
        result["ram_cache_over_none"] = [round(x / y, 2) for x, y in zip(a, b)]
    if "llama.cpp" in runs:
        a, b = result["ours"]["ttft_s"], result["llama.cpp"]["ttft_s"]
        result["ours_over_llama"] = [round(x / y, 2) for x, y in zip(a, b)]
        engines["llama.cpp"].close()
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
