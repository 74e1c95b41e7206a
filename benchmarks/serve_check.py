"""The server's "Done when" checks on a real bundle (issue 16), over HTTP on 127.0.0.1 only.

1. N concurrent streaming chat requests (greedy): each must carry exactly the tokens of a sequential
   `Generator.generate` on the same messages (compared after all streams end);
2. a burst beyond a small queue: counts of 200 / 429 / anything else, and the slowest 429;
3. malformed JSON, wrong field types, NaN temperature, negative max_tokens: status and the field
   named;
4. the official `openai` client, unchanged, against the server;
5. hostile bodies (issue 28), against `dflash-edge serve --port 0` in a subprocess (its RSS read
   with psutil): a 15 MB body with Content-Length and chunked (status, seconds to the answer, RSS
   growth at peak and after), and the slowest `/health` while a 5 MB body is sent slowly and at full
   speed, both with the default --max-body-bytes (refused) and with the limit raised to 16 MiB (read
   whole, parsed, tokenised), and while a 1 MB body (under the default limit: read, parsed,
   tokenised) is sent.

    python benchmarks/serve_check.py /tmp/serve-fp32 --json /tmp/serve-check.json
    python benchmarks/serve_check.py /tmp/serve-fp32 --hostile-only --json /tmp/serve-hostile.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import uvicorn
from output import emit_json

from dflash_edge.data import read_prompts as load_prompts
from dflash_edge.runtime import Generator
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
    return {
        "status": r.status_code,
        "text": text,
        "token_ids": ext["token_ids"] if ext else None,
        "tau": ext["mean_acceptance_length"] if ext else None,
        "first_event_s": round(first - t0, 2),
        "total_s": round(time.perf_counter() - t0, 2),
    }


def concurrent_streams(gen, url: str, prompts: list[str], max_tokens: int) -> dict:
    chats = [[{"role": "user", "content": p}] for p in prompts]
    with ThreadPoolExecutor(len(chats)) as pool:
        got = list(pool.map(lambda m: stream_one(url, m, max_tokens), chats))
    want = [
        gen.generate(m, max_new_tokens=max_tokens, temperature=0.0) for m in chats
    ]  # sequential
    same = [g["token_ids"] == w.token_ids and g["text"] == w.text for g, w in zip(got, want)]
    return {
        "requests": len(chats),
        "completed": sum(g["status"] == 200 and g["token_ids"] is not None for g in got),
        "identical_to_sequential_generate": sum(same),
        "max_tokens": max_tokens,
        "tokens": sum(len(w.token_ids) for w in want),
        "median_tau": statistics.median(g["tau"] for g in got if g["tau"] is not None),
        "wall_s_last_stream": max(g["total_s"] for g in got),
        "first_event_s_min_median_max": [
            min(g["first_event_s"] for g in got),
            statistics.median(g["first_event_s"] for g in got),
            max(g["first_event_s"] for g in got),
        ],
    }


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
    return {
        "requests": n,
        "max_queue": max_queue,
        "ok_200": codes.count(200),
        "busy_429": codes.count(429),
        "other": sorted(set(codes) - {200, 429}),
        "slowest_429_s": round(max((t for c, t, _ in res if c == 429), default=0), 3),
        "retry_after_values": sorted({r for c, _, r in res if c == 429}),
    }


BAD_REQUESTS = {  # name -> raw body (NaN is not JSON: sent as Python's json writes it)
    "malformed JSON": b'{"messages": [',
    "wrong type: temperature": json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}
    ),
    "wrong type: messages": json.dumps({"messages": 5}),
    "wrong type: stream": json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}
    ),
    "NaN temperature": json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")}
    ),
    "negative max_tokens": json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}
    ),
}


def bad_requests(url: str) -> dict:
    out = {}
    for name, raw in BAD_REQUESTS.items():
        r = httpx.post(
            f"{url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        err = r.json().get("error", {})
        out[name] = {
            "status": r.status_code,
            "param": err.get("param"),
            "message": err.get("message"),
        }
    return out


def openai_client(gen, url: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=messages, max_tokens=24, temperature=0
    )
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        if c.choices
    )
    want = gen.generate(messages, max_new_tokens=24, temperature=0.0).text
    return {
        "openai_version": openai.__version__,
        "whole_equals_generate": out.choices[0].message.content == want,
        "stream_equals_generate": streamed == want,
        "text": want,
    }


class ServerProcess:
    """`dflash-edge serve BUNDLE --port 0 ...` in a subprocess; the port is read from the line it
    prints."""

    def __init__(self, bundle: str, *args: str):
        cmd = [
            sys.executable,
            "-c",
            "import sys; from dflash_edge.cli import main; sys.exit(main(sys.argv[1:]))",
            "serve",
            bundle,
            "--port",
            "0",
            *args,
        ]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if " on http://" in line:
                self.url = "http://" + line.split(" on http://")[1].split("/v1")[0]
                break
        else:
            raise RuntimeError(f"the server did not start: {cmd}")
        threading.Thread(
            target=self.proc.stderr.read, daemon=True
        ).start()  # keep its stderr drained
        self.ps = psutil.Process(self.proc.pid)

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


class PeakRss:
    """The server's peak RSS while the `with` block runs (sampled every 5 ms)."""

    def __init__(self, server: ServerProcess):
        self.server, self.peak, self._stop = server, server.rss_mib(), threading.Event()

    def _poll(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.server.rss_mib())

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def chat_body(n_bytes: int) -> bytes:
    words = "the quick brown fox jumps over the lazy dog. "
    return json.dumps(
        {
            "messages": [{"role": "user", "content": words * (n_bytes // len(words))}],
            "max_tokens": 8,
        }
    ).encode()


def big_body(server: ServerProcess, body: bytes, chunked: bool) -> dict:
    base = server.rss_mib()
    content = (body[i : i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    with PeakRss(server) as peak:
        t0 = time.perf_counter()
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            content=content,
            timeout=600,
            headers={"content-type": "application/json"},
        )
        seconds = time.perf_counter() - t0
    time.sleep(0.5)
    return {
        "bytes": len(body),
        "chunked": chunked,
        "status": r.status_code,
        "seconds": round(seconds, 3),
        "rss_before_mib": round(base, 1),
        "rss_growth_peak_mib": round(peak.peak - base, 1),
        "rss_growth_after_mib": round(server.rss_mib() - base, 1),
        "code": r.json().get("error", {}).get("code"),
    }


def health_during_upload(server: ServerProcess, body: bytes, slow_s: float) -> dict:
    """The slowest /health while `body` is uploaded (spread over `slow_s` seconds; 0: at full speed)
    and answered."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    done, status = threading.Event(), []

    def upload():
        with socket.create_connection((host, int(port)), timeout=600) as sock:
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                "application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            sock.sendall(head.encode())
            step = 65536
            pause = slow_s / max(1, len(body) // step)
            try:
                for i in range(0, len(body), step):
                    sock.sendall(body[i : i + step])
                    if pause:
                        time.sleep(pause)
            except ConnectionError:  # refused early (413) and closed: the answer is still readable
                pass
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
            status.append(int(reply.split()[1]) if reply else None)
        done.set()

    latencies = []
    with PeakRss(server) as peak, httpx.Client() as client:
        base = server.rss_mib()
        t0 = time.perf_counter()
        threading.Thread(target=upload, daemon=True).start()
        while not done.is_set():
            t = time.perf_counter()
            client.get(f"{server.url}/health", timeout=60)
            latencies.append(time.perf_counter() - t)
            time.sleep(0.01)
        total = time.perf_counter() - t0
    return {
        "bytes": len(body),
        "upload_spread_s": slow_s,
        "status": status[0] if status else None,
        "request_s": round(total, 3),
        "health_polls": len(latencies),
        "health_max_s": round(max(latencies), 4),
        "health_median_s": round(statistics.median(latencies), 4),
        "rss_growth_peak_mib": round(peak.peak - base, 1),
    }


def hostile(bundle: str) -> dict:
    """Issue 28's bars: 15 MB refused with 413 within 2 s, RSS growth < 100 MB; /health < 0.5 s
    during 5 MB."""
    out = {}
    for name, args in (("default_limit", []), ("limit_16MiB", ["--max-body-bytes", str(16 << 20)])):
        server = ServerProcess(bundle, *args)
        try:
            httpx.post(
                f"{server.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                timeout=600,
            )  # warm up
            runs = {"rss_after_warmup_mib": round(server.rss_mib(), 1)}
            if name == "default_limit":
                runs["15MB_content_length"] = big_body(server, chat_body(15_000_000), chunked=False)
                runs["15MB_chunked"] = big_body(server, chat_body(15_000_000), chunked=True)
            for spread in (3.0, 0.0):
                runs[f"5MB_health_upload_{spread:g}s"] = health_during_upload(
                    server, chat_body(5_000_000), spread
                )
            if (
                name == "default_limit"
            ):  # the largest body the default reads whole: parsed and tokenised
                runs["1MB_health_upload_0s"] = health_during_upload(
                    server, chat_body(1_000_000), 0.0
                )
            out[name] = runs
        finally:
            server.stop()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--burst-queue", type=int, default=4)
    ap.add_argument("--hostile-only", action="store_true", help="only part 5 (hostile bodies)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    report = {
        "bundle": args.bundle,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if not args.hostile_only:
        gen = Generator.load(args.bundle)
        prompts = [r["prompt"] for r in load_prompts(None)][: args.concurrent]
        server, url = start(build_app(gen, ServerOptions(max_queue=args.concurrent)))
        try:
            report.update(
                {
                    "concurrent_streams": concurrent_streams(gen, url, prompts, args.max_tokens),
                    "bad_requests": bad_requests(url),
                    "openai_client": openai_client(gen, url),
                }
            )
        finally:
            server.should_exit = True
        report["burst"] = burst(gen, args.burst, args.burst_queue)
    report["hostile"] = hostile(args.bundle)
    emit_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
