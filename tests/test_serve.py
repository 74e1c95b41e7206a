"""The OpenAI-compatible server (issue 16) on a tiny bundle, through real HTTP clients on loopback
(tier 1).

Endpoints, streaming, the 400s in OpenAI's error shape, the API key, queueing and 429, a client that
leaves mid-stream, and the official `openai` client unchanged."""

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from dflash_edge.cli import main  # noqa: E402

from live_server import serve, wait_until  # noqa: E402,F401  (serve: a fixture)

MESSAGES = [
    [{"role": "user", "content": t}] for t in ("t5 t6 t7", "t9 t1 t33", "t70 t2", "t12 t13 t14 t15")
]


def expected(tb, messages, n=12, chat=True, **kw):
    return tb.generator.generate(
        messages if chat else messages[0]["content"], max_new_tokens=n, chat=chat, **kw
    )


def sse(response) -> list:
    """The `data:` payloads of a server-sent-event stream (JSON decoded; "[DONE]" kept as is)."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_health_models_and_whole_completions(tiny_bundle, serve):
    tb, s = tiny_bundle("qwen3", 8), serve()
    assert httpx.get(f"{s.url}/health").json()["status"] == "ok"
    models = httpx.get(f"{s.url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == tb.path.name
    want = expected(tb, MESSAGES[0])
    r = httpx.post(
        f"{s.url}/v1/chat/completions",
        json={"model": tb.path.name, "messages": MESSAGES[0], "max_tokens": 12, "temperature": 0},
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": want.text}
    assert (
        body["dflash"]["token_ids"] == want.token_ids
        and body["dflash"]["mean_acceptance_length"] >= 1
    )
    assert body["usage"]["completion_tokens"] == len(want.token_ids)
    assert body["choices"][0]["finish_reason"] == (
        "length" if want.finish_reason == "length" else "stop"
    )
    raw = expected(tb, MESSAGES[1], chat=False, temperature=0.8, seed=7)
    r = httpx.post(
        f"{s.url}/v1/completions",
        json={"prompt": "t9 t1 t33", "max_tokens": 12, "temperature": 0.8, "seed": 7},
    )
    assert (
        r.json()["choices"][0]["text"] == raw.text
        and r.json()["dflash"]["token_ids"] == raw.token_ids
    )
    assert httpx.get(f"{s.url}/v1/nope").status_code == 404
    assert httpx.get(f"{s.url}/v1/chat/completions").json()["error"]["code"] == "405"


def test_streaming_chat_equals_generate(tiny_bundle, serve):
    tb, s = tiny_bundle("qwen3", 8), serve()
    want = expected(tb, MESSAGES[3], n=20, stop="t9")
    body = {
        "messages": MESSAGES[3],
        "max_tokens": 20,
        "temperature": 0,
        "stream": True,
        "stop": "t9",
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e.get("choices")
    )
    finish = next(e for e in events[:-1] if e.get("choices") and e["choices"][0]["finish_reason"])
    assert text == want.text and finish["dflash"]["token_ids"] == want.token_ids
    assert events[-2]["usage"]["completion_tokens"] == len(want.token_ids)


def test_concurrent_streams_get_sequential_tokens(tiny_bundle, serve):
    tb, s = tiny_bundle("qwen3", 8), serve(max_queue=8)
    jobs = [(m, t) for m in MESSAGES for t in (0.0, 0.9)]
    want = [expected(tb, m, n=16, temperature=t, seed=3).token_ids for m, t in jobs]

    def one(job):
        m, t = job
        with httpx.stream(
            "POST",
            f"{s.url}/v1/chat/completions",
            timeout=120,
            json={"messages": m, "max_tokens": 16, "temperature": t, "seed": 3, "stream": True},
        ) as r:
            return next(e for e in sse(r) if isinstance(e, dict) and "dflash" in e)["dflash"][
                "token_ids"
            ]

    with ThreadPoolExecutor(len(jobs)) as pool:
        assert list(pool.map(one, jobs)) == want


# the Python API's own message for the same value, with the field named as the client sent it
BAD = [
    (
        {"temperature": math.nan},
        "temperature",
        "temperature=nan: expected a finite number >= 0 (0 = greedy)",
    ),
    ({"temperature": "hot"}, "temperature", "temperature='hot'"),
    ({"max_tokens": -1}, "max_tokens", "max_tokens=-1: expected an integer >= 1"),
    ({"max_tokens": 2.5}, "max_tokens", "max_tokens=2.5"),
    ({"top_p": 1.5}, "top_p", "top_p=1.5: expected a finite number in (0, 1]"),
    ({"seed": "x"}, "seed", "seed='x'"),
    ({"stop": 5}, "stop", "stop=5: expected a string or a list of strings"),
    ({"stream": "yes"}, "stream", "stream='yes': expected true or false"),
    ({"n": 2}, "n", "n=2: this server supports only n=1"),
    ({"messages": "hi"}, "messages", "messages='hi'"),
    (
        {"messages": [{"role": "robot", "content": "t5"}]},
        "messages[0].role",
        "messages[0].role='robot'",
    ),
    (
        {"messages": [{"role": "user", "content": None}]},
        "messages[0].content",
        "messages[0].content=None",
    ),
    ({"messages": [{"role": "user", "content": " ".join(["t5"] * 200)}]}, None, "the prompt has"),
]


@pytest.mark.parametrize("change, param, message", BAD)
def test_bad_requests_get_400_naming_the_field(serve, change, param, message):
    s = serve()
    body = {"messages": MESSAGES[0], "max_tokens": 4, **change}
    r = httpx.post(
        f"{s.url}/v1/chat/completions",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        err["type"] == "invalid_request_error"
        and err["param"] == param
        and message in err["message"]
    )


def test_malformed_json_and_non_objects(serve):
    s = serve()
    for raw, says in (
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "is a JSON list"),
        (b"\xff\xfe", "not valid JSON"),
    ):
        r = httpx.post(f"{s.url}/v1/chat/completions", content=raw)
        assert (
            r.status_code == 400
            and says in r.json()["error"]["message"]
            and r.json()["error"]["param"] == "body"
        )
    r = httpx.post(f"{s.url}/v1/completions", json={"max_tokens": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_api_key_on_every_request(serve):
    s = serve(api_key="sesame")
    for path in ("/health", "/v1/models"):
        assert httpx.get(f"{s.url}{path}").status_code == 401
        assert (
            httpx.get(f"{s.url}{path}", headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        assert (
            httpx.get(f"{s.url}{path}", headers={"Authorization": "Bearer sesame"}).status_code
            == 200
        )
    r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": MESSAGES[0]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.fixture
def gated(tiny_bundle, monkeypatch):
    """The target graph waits for `gate` before each run: generations stay in flight until the test
    opens it."""
    runner = tiny_bundle("qwen3", 8).generator.target.runner
    gate, real_run, calls = threading.Event(), runner.run, []

    def run(binding):
        gate.wait(timeout=120)
        calls.append(1)
        time.sleep(0.005)  # a step a client can interrupt
        real_run(binding)

    monkeypatch.setattr(runner, "run", run)
    return gate, calls


def test_burst_beyond_the_queue_gets_429_then_the_rest_complete(tiny_bundle, serve, gated):
    gate, _ = gated
    tb, s = tiny_bundle("qwen3", 8), serve(max_queue=2)
    body = {"messages": MESSAGES[2], "max_tokens": 8, "temperature": 0}

    def post(_):
        return httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=60)

    with ThreadPoolExecutor(7) as pool:
        futures = [pool.submit(post, i) for i in range(7)]
        wait_until(
            lambda: sum(f.done() for f in futures) >= 4
        )  # 1 running + 2 waiting admitted, 4 refused
        refused = [f.result() for f in futures if f.done()]
        assert len(refused) == 4 and all(r.status_code == 429 for r in refused)
        assert all(
            int(r.headers["Retry-After"]) >= 1 and r.json()["error"]["code"] == "queue_full"
            for r in refused
        )
        health = httpx.get(f"{s.url}/health").json()
        assert (health["running"], health["waiting"]) == (1, 2)
        gate.set()
        done = [f.result() for f in futures if f.result().status_code != 429]
    want = expected(tb, MESSAGES[2], n=8).token_ids
    assert len(done) == 3 and all(
        r.status_code == 200 and r.json()["dflash"]["token_ids"] == want for r in done
    )


def test_client_leaving_mid_stream_frees_the_slot(tiny_bundle, serve, gated):
    gate, calls = gated
    tb, s = tiny_bundle("qwen3", 8), serve(max_queue=0)
    gate.set()
    full = len(calls)
    expected(tb, MESSAGES[1], n=100)
    full = len(calls) - full  # target runs of the whole generation
    assert full >= 20  # long enough to see it cut short (lookup commits
    # several tokens per run on this prompt)
    gate.clear()
    body = {"messages": MESSAGES[1], "max_tokens": 100, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        gate.set()
        assert next(lines).startswith("data: ")  # the role chunk: the generation is running
        start = len(calls)
    wait_until(
        lambda: httpx.get(f"{s.url}/health").json()["running"] == 0
    )  # the connection is closed
    assert httpx.get(f"{s.url}/health").json()["running"] == 0
    assert len(calls) - start < full / 2  # stopped early, not run to the end
    r = httpx.post(f"{s.url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 6})
    assert (
        r.status_code == 200
        and r.json()["dflash"]["token_ids"] == expected(tb, MESSAGES[1], n=6).token_ids
    )


def test_official_openai_client_unchanged(tiny_bundle, serve):
    openai = pytest.importorskip("openai")
    tb, s = tiny_bundle("qwen3", 8), serve(api_key="k")
    client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="k", max_retries=0)
    assert [m.id for m in client.models.list()] == [tb.path.name]
    want = expected(tb, MESSAGES[0], n=10)
    out = client.chat.completions.create(
        model=tb.path.name, messages=MESSAGES[0], max_tokens=10, temperature=0
    )
    assert out.choices[0].message.content == want.text and out.usage.completion_tokens == len(
        want.token_ids
    )
    chunks = list(
        client.chat.completions.create(
            model=tb.path.name, messages=MESSAGES[0], max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    done = client.completions.create(
        model=tb.path.name, prompt="t5 t6", max_tokens=5, temperature=0
    )
    assert done.choices[0].text == expected(tb, [{"content": "t5 t6"}], n=5, chat=False).text
    with pytest.raises(openai.BadRequestError, match="max_tokens=-3: expected an integer >= 1"):
        client.chat.completions.create(model=tb.path.name, messages=MESSAGES[0], max_tokens=-3)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{s.url}/v1", api_key="bad", max_retries=0).models.list()


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--port", "70000"], "--port=70000"),
        (["--max-queue", "-1"], "--max-queue=-1"),
        (["--threads", "-1"], "--threads=-1"),
        (["--api-key", " "], "--api-key is empty"),
    ],
)
def test_serve_cli_checks_before_loading(tmp_path, capsys, argv, named):
    assert main(["serve", str(tmp_path / "no-bundle"), *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_a_waiting_client_that_leaves_frees_its_queue_slot(tiny_bundle, serve, gated):
    gate, _ = gated
    tb, s = tiny_bundle("qwen3", 8), serve(max_queue=1)
    body = {"messages": MESSAGES[0], "max_tokens": 4, "temperature": 0}
    url = f"{s.url}/v1/chat/completions"
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(httpx.post, url, json=body, timeout=60)
        wait_until(lambda: httpx.get(f"{s.url}/health").json()["running"])
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, timeout=0.5)  # waits behind the running one, then gives up
        wait_until(lambda: httpx.get(f"{s.url}/health").json()["waiting"] == 0)
        assert (
            httpx.get(f"{s.url}/health").json()["waiting"] == 0
        )  # slot back while the first still runs
        waiting = pool.submit(
            httpx.post, url, json=body, timeout=60
        )  # so a new client is admitted, not 429
        wait_until(
            lambda: httpx.get(f"{s.url}/health").json()["waiting"] == 1
        )  # queued behind the first
        assert httpx.get(f"{s.url}/health").json()["waiting"] == 1 and not waiting.done()
        gate.set()
        want = expected(tb, MESSAGES[0], n=4).token_ids
        assert running.result().json()["dflash"]["token_ids"] == want
    assert waiting.result().json()["dflash"]["token_ids"] == want
