"""Code completion on a real coder bundle (issue 37 item 6): the default loop against plain decoding
on the shipped `code` set (edits that rewrite given code, and fill-in-the-middle cases), lossless;
the FIM cases also through the server's `/v1/completions` `suffix` and `/infill` (greedy, against
the row's expected middle); and llama.cpp's own prompt-lookup decoding on the same prompts.

Per prompt the arms alternate (plain, default / default, plain, ...) `--repeats` rounds, so machine
noise hits both alike; a prompt's figure is its median over rounds, the summary the median over
prompts of the per-prompt ratio default / plain (decode tokens/s, the runtime's own clock; and the
whole call, prefill included). llama.cpp (llama-cpp-python in its own venv, `--llama-python`) runs
plain and `LlamaPromptLookupDecoding` the same way, in a subprocess, after ours (not at once: the
machine has 2 cores): its tokens/s is completion tokens over the whole call, and its lossless column
says whether its prompt-lookup text equals its plain text.

    python benchmarks/code_completion.py BUNDLE --gguf MODEL.gguf --llama-python VENV/bin/python \\
        --max-new-tokens 128 --repeats 2 --http --out report.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

LLAMA_WORKER = r"""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
path, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
arms = {
    "plain": Llama(path, n_ctx=n_ctx, n_threads=threads, verbose=False),
    "lookup": Llama(path, n_ctx=n_ctx, n_threads=threads, verbose=False,
                    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)),
}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    llm = arms[job["arm"]]
    llm.reset()
    t = time.perf_counter()
    if "suffix" in job:  # its `suffix=` builds no FIM prompt (token ids 0, "TODO" in 0.3.36)
        tok = lambda t, sp=False: llm.tokenize(t.encode(), add_bos=False, special=sp)
        ids = (tok("<|fim_prefix|>", True) + tok(job["prompt"]) + tok("<|fim_suffix|>", True)
               + tok(job["suffix"]) + tok("<|fim_middle|>", True))
        out = llm.create_completion(ids, temperature=0.0, max_tokens=job["n"])
        text = out["choices"][0]["text"]
    else:
        out = llm.create_chat_completion([{"role": "user", "content": job["prompt"]}],
                                         temperature=0.0, max_tokens=job["n"])
        text = out["choices"][0]["message"]["content"]
    s = time.perf_counter() - t
    print(json.dumps({"s": s, "text": text, "n": out["usage"]["completion_tokens"]}), flush=True)
"""


def ours(gen, rows, n: int, repeats: int) -> list[dict]:
    from dflash_edge.cli.common import prompt_of

    out = []
    for i, row in enumerate(rows):
        prompt, runs = prompt_of(row), {"plain": [], "default": []}
        for r in range(repeats):
            order = ("plain", "default") if (i + r) % 2 == 0 else ("default", "plain")
            for arm in order:
                t = time.perf_counter()
                res = gen.generate(
                    prompt, max_new_tokens=n, draft="none" if arm == "plain" else "auto"
                )
                runs[arm].append((res, time.perf_counter() - t))
        plain, default = runs["plain"][0][0], runs["default"][0][0]
        ids = {tuple(res.token_ids) for arm in runs.values() for res, _ in arm}
        med = {
            arm: {
                "decode_tps": statistics.median(r.stats.decode_tokens_per_s for r, _ in v),
                "call_tps": statistics.median(len(r.token_ids) / s for r, s in v),
            }
            for arm, v in runs.items()
        }
        s = default.stats
        out.append(
            {
                "id": row["id"],
                "kind": row_kind(row),
                "prompt_tokens": plain.stats.prompt_tokens,
                "new_tokens": len(plain.token_ids),
                "lossless": len(ids) == 1,
                "expected_ok": _expected(row, plain.text),
                "plain_decode_tps": round(med["plain"]["decode_tps"], 2),
                "default_decode_tps": round(med["default"]["decode_tps"], 2),
                "speedup": round(med["default"]["decode_tps"] / med["plain"]["decode_tps"], 3),
                "call_speedup": round(med["default"]["call_tps"] / med["plain"]["call_tps"], 3),
                "lookup_steps": len(s.lookup_lengths),
                "lookup_tokens_per_step": round(statistics.mean(s.lookup_lengths), 2)
                if s.lookup_lengths
                else 0.0,
                "drafter_steps": len(s.acceptance_lengths),
                "plain_steps": s.plain_steps,
                "text": plain.text,
            }
        )
        print(json.dumps({k: v for k, v in out[-1].items() if k != "text"}), file=sys.stderr)
    return out


def row_kind(row: dict) -> str:
    """fim, editor (an edit asked as editors ask it: the code first, then "output only the edited
    code"), or edit (asked in chat: the answer may explain itself after the code)."""
    if "suffix" in row:
        return "fim"
    return "editor" if row["category"].startswith("editor-") else "edit"


def _expected(row: dict, text: str) -> bool | None:
    if "expected" not in row:
        return None
    squeeze = lambda t: "".join(t.split())  # noqa: E731  (spacing is style, not content)
    return squeeze(text) == squeeze(row["expected"])


def over_http(gen, rows, n: int) -> list[dict]:
    """The FIM rows through a live server: /v1/completions with `suffix`, and /infill."""
    import threading

    import httpx
    import uvicorn

    from dflash_edge.serve.app import ServerOptions, build_app
    from dflash_edge.serve.limits import server_config

    options = ServerOptions()
    server = uvicorn.Server(server_config(build_app(gen, options), "127.0.0.1", 0, options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    out = []
    try:
        for row in rows:
            if "suffix" not in row:
                continue
            body = {"prompt": row["prompt"], "suffix": row["suffix"], "max_tokens": n}
            oa = httpx.post(f"{url}/v1/completions", json={**body, "temperature": 0}, timeout=600)
            fill = {"input_prefix": row["prompt"], "input_suffix": row["suffix"], "n_predict": n}
            inf = httpx.post(f"{url}/infill", json=fill, timeout=600)
            texts = oa.json()["choices"][0]["text"], inf.json()["content"]
            out.append(
                {
                    "id": row["id"],
                    "expected": row["expected"],
                    "v1_completions": texts[0],
                    "infill": texts[1],
                    "both_expected": all(_expected(row, t) for t in texts),
                }
            )
            print(json.dumps(out[-1]), file=sys.stderr)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return out


def llama(python: str, gguf: str, rows, n: int, repeats: int, n_ctx: int) -> list[dict]:
    proc = subprocess.Popen(
        [python, "-c", LLAMA_WORKER, gguf, str(n_ctx), "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert json.loads(proc.stdout.readline())["ready"]

    def call(job: dict) -> dict:
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    out = []
    try:
        for i, row in enumerate(rows):
            job = {
                "prompt": row["prompt"],
                "n": n,
                **({"suffix": row["suffix"]} if "suffix" in row else {}),
            }
            runs = {"plain": [], "lookup": []}
            for r in range(repeats):
                order = ("plain", "lookup") if (i + r) % 2 == 0 else ("lookup", "plain")
                for arm in order:
                    runs[arm].append(call({**job, "arm": arm}))
            tps = {a: statistics.median(x["n"] / x["s"] for x in v) for a, v in runs.items()}
            texts = {x["text"] for v in runs.values() for x in v}
            out.append(
                {
                    "id": row["id"],
                    "plain_tps": round(tps["plain"], 2),
                    "lookup_tps": round(tps["lookup"], 2),
                    "speedup": round(tps["lookup"] / tps["plain"], 3),
                    "lossless": len(texts) == 1,
                    "expected_ok": _expected(row, runs["plain"][0]["text"]),
                }
            )
            print(json.dumps(out[-1]), file=sys.stderr)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return out


def summary(rows: list[dict], key: str = "speedup") -> dict:
    by_kind: dict[str, list[dict]] = {}
    for r in rows:
        by_kind.setdefault(r.get("kind", "all"), []).append(r)
    return {
        kind: {
            "prompts": len(v),
            f"median_{key}": round(statistics.median(r[key] for r in v), 3),
            "lossless": all(r["lossless"] for r in v),
        }
        for kind, v in by_kind.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--gguf", help="the GGUF the bundle came from (for llama.cpp)")
    ap.add_argument("--llama-python", help="a python with llama-cpp-python (skipped if absent)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--ids", default="", help="only these row ids (comma-separated)")
    ap.add_argument("--http", action="store_true", help="also the FIM rows through the server")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from dflash_edge.data import read_prompts
    from dflash_edge.runtime import Generator

    rows = read_prompts("code", args.limit)
    rows = [r for r in rows if not args.ids or r["id"] in args.ids.split(",")]
    gen = Generator.load(args.bundle, spin=False)
    report: dict = {"bundle": args.bundle, "tuned": gen.tuned is not None, "n": args.max_new_tokens}
    if not args.skip_ours:
        report["ours"] = ours(gen, rows, args.max_new_tokens, args.repeats)
        report["ours_summary"] = summary(report["ours"])
    if args.http:
        report["http"] = over_http(gen, rows, args.max_new_tokens)
    if args.llama_python and args.gguf:
        report["llama"] = llama(
            args.llama_python, args.gguf, rows, args.max_new_tokens, args.repeats, gen.max_context
        )
        report["llama_summary"] = summary(report["llama"])
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps({k: v for k, v in report.items() if "summary" in k or k == "http"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
