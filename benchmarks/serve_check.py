"""The server's "Done when" checks on a real bundle (issue 16), over HTTP on 127.0.0.1 only.

1. N concurrent streaming chat requests (greedy): each must carry exactly the tokens of a sequential
   `Generator.generate` on the same messages (compared after all streams end);
2. a burst beyond a small queue: counts of 200 / 429 / anything else, and the slowest 429;
3. malformed JSON, wrong field types, NaN temperature, negative max_tokens: status and the field named;
4. the official `openai` client, unchanged, against the server.

    python benchmarks/serve_check.py /tmp/serve-fp32 --json /tmp/serve-check.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import uvicorn

from dflash_edge.runtime import Generator
from dflash_edge.data import read_prompts as load_prompts
from dflash_edge.serve.app import ServerOptions, build_app

HOST = "127.0.0.1"


def start(app) -> tuple[uvicorn.Server, str]:
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://{HOST}:{server.servers[0].sockets[0].getsockname()[1]}"


def stream_one(url: str, messages: list, max_tokens: int) -> dict:
    t0, first, text, ext = time.perf_counter(), None, "", None
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            first = first or time.perf_counter()
            if event.get("choices"):
                text += event["choices"][0].get("delta", {}).get("content") or ""
            ext = event.get("dflash", ext)
    return {"status": r.status_code, "text": text, "token_ids": ext["token_ids"] if ext else None,
            "tau": ext["mean_acceptance_length"] if ext else None,
            "first_event_s": round(first - t0, 2), "total_s": round(time.perf_counter() - t0, 2)}


def concurrent_streams(gen, url: str, prompts: list[str], max_tokens: int) -> dict:
    chats = [[{"role": "user", "content": p}] for p in prompts]
    with ThreadPoolExecutor(len(chats)) as pool:
        got = list(pool.map(lambda m: stream_one(url, m, max_tokens), chats))
    want = [gen.generate(m, max_new_tokens=max_tokens, temperature=0.0) for m in chats]     # sequential
    same = [g["token_ids"] == w.token_ids and g["text"] == w.text for g, w in zip(got, want)]
    return {"requests": len(chats), "completed": sum(g["status"] == 200 and g["token_ids"] is not None for g in got),
            "identical_to_sequential_generate": sum(same), "max_tokens": max_tokens,
            "tokens": sum(len(w.token_ids) for w in want),
            "median_tau": statistics.median(g["tau"] for g in got if g["tau"] is not None),
            "wall_s_last_stream": max(g["total_s"] for g in got),
            "first_event_s_min_median_max": [min(g["first_event_s"] for g in got),
                                            statistics.median(g["first_event_s"] for g in got),
                                            max(g["first_event_s"] for g in got)]}


def burst(gen, n: int, max_queue: int) -> dict:
    server, url = start(build_app(gen, ServerOptions(max_queue=max_queue)))
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}

    def post(_):
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        return r.status_code, time.perf_counter() - t0, r.headers.get("retry-after")

    try:
        with ThreadPoolExecutor(n) as pool:
            res = list(pool.map(post, range(n)))
    finally:
        server.should_exit = True
    codes = [c for c, _, _ in res]
    return {"requests": n, "max_queue": max_queue, "ok_200": codes.count(200), "busy_429": codes.count(429),
            "other": sorted(set(codes) - {200, 429}),
            "slowest_429_s": round(max((t for c, t, _ in res if c == 429), default=0), 3),
            "retry_after_values": sorted({r for c, _, r in res if c == 429})}


BAD_REQUESTS = {                   # name -> raw body (NaN is not JSON: sent as Python's json writes it)
    "malformed JSON": b'{"messages": [',
    "wrong type: temperature": json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
    "wrong type: messages": json.dumps({"messages": 5}),
    "wrong type: stream": json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
    "NaN temperature": json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")}),
    "negative max_tokens": json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}),
}


def bad_requests(url: str) -> dict:
    out = {}
    for name, raw in BAD_REQUESTS.items():
        r = httpx.post(f"{url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        err = r.json().get("error", {})
        out[name] = {"status": r.status_code, "param": err.get("param"), "message": err.get("message")}
    return out


def openai_client(gen, url: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=24,
                                         temperature=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="any", messages=messages, max_tokens=24, temperature=0, stream=True) if c.choices)
    want = gen.generate(messages, max_new_tokens=24, temperature=0.0).text
    return {"openai_version": openai.__version__, "whole_equals_generate": out.choices[0].message.content == want,
            "stream_equals_generate": streamed == want, "text": want}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--burst-queue", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    gen = Generator.load(args.bundle)
    prompts = [r["prompt"] for r in load_prompts(None)][:args.concurrent]
    server, url = start(build_app(gen, ServerOptions(max_queue=args.concurrent)))
    try:
        report = {"bundle": args.bundle, "concurrent_streams": concurrent_streams(gen, url, prompts, args.max_tokens),
                  "bad_requests": bad_requests(url), "openai_client": openai_client(gen, url)}
    finally:
        server.should_exit = True
    report["burst"] = burst(gen, args.burst, args.burst_queue)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
