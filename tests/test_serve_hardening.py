"""The server against hostile input (issue 28, tier 1): body-size limit, work off the event loop,
model and field handling, the API key's sources and scheme, the real port, the 429 text, and a fuzz
test of the HTTP layer.

Raw sockets where httpx would refuse to send the request (a Content-Length that lies, an unfinished
upload)."""

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dflash_edge.runtime.validate import InvalidArgumentError  # noqa: E402

from live_server import HOST, serve, wait_until  # noqa: E402,F401  (serve: a fixture)

CHAT = {"messages": [{"role": "user", "content": "t5 t6 t7"}], "max_tokens": 4, "temperature": 0}
KiB = 1024


def raw_exchange(
    port: int, head: str, body: bytes = b"", timeout_s: float = 30.0
) -> tuple[int | None, dict, bytes]:
    """Send `head` (request line + headers, without the blank line) and `body` as they are; read one
    response.

    Returns (status, headers, body), status None when the server closed without answering or
    `timeout_s` passed (a bound against hangs: an answer that needs the whole body never comes for
    an unfinished one)."""
    with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        return read_response(sock)


def read_response(sock) -> tuple[int | None, dict, bytes]:
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None, {}, data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }
        need = int(headers.get("content-length", 0))
        while len(rest) < need:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return int(lines[0].split()[1]), headers, rest[:need]
    except (socket.timeout, ConnectionError):
        return None, {}, data


def post_head(path: str, length: int | None = None, extra: str = "") -> str:
    size = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{size}{extra}"


def is_openai_error(body: bytes, code: str | None = None) -> bool:
    err = json.loads(body)["error"]
    return isinstance(err["message"], str) and err["type"] and (code is None or err["code"] == code)


# ---- 1. the body-size limit
# -----------------------------------------------------------------------------------


def test_declared_oversize_body_is_refused_before_it_is_sent(serve):
    s = serve(max_body_bytes=64 * KiB)
    # headers only: an answer that waited for the 15 MB would never come (raw_exchange gives up:
    # status None)
    status, headers, body = raw_exchange(s.port, post_head("/v1/chat/completions", 15_000_000))
    assert status == 413 and is_openai_error(body, "request_too_large")
    assert (
        "15000000" in json.loads(body)["error"]["message"]
        and "--max-body-bytes 65536" in body.decode()
    )


def test_chunked_upload_is_refused_once_it_passes_the_limit(serve):
    s = serve(max_body_bytes=64 * KiB)
    chunk = b"x" * (16 * KiB)
    # 5 chunks (80 KiB) and no terminating chunk: the upload never ends, so a 413 proves the bytes
    # were counted
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5))
    status, _, reply = raw_exchange(s.port, post_head("/v1/chat/completions"), body)
    assert status == 413 and is_openai_error(reply, "request_too_large")


def test_oversize_body_sent_whole_still_gets_its_413_and_the_server_goes_on(serve):
    s = serve(max_body_bytes=64 * KiB)
    big = json.dumps(
        {**CHAT, "messages": [{"role": "user", "content": "t5 " * 2_000_000}]}
    ).encode()  # 6 MB
    r = httpx.post(
        f"{s.url}/v1/chat/completions",
        content=big,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert (
        r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    )  # not a reset connection
    at_limit = json.dumps({**CHAT, "stop": ["t9"]}).encode()
    at_limit += b" " * (64 * KiB - len(at_limit))  # exactly the limit: read
    r = httpx.post(f"{s.url}/v1/chat/completions", content=at_limit, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = httpx.post(f"{s.url}/v1/chat/completions", content=at_limit + b" ", timeout=60)
    assert r.status_code == 413
    assert httpx.get(f"{s.url}/health").json()["status"] == "ok"


def test_chunked_body_within_the_limit_is_served(serve):
    s = serve()
    raw = json.dumps(CHAT).encode()
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (raw[:10], raw[10:])) + b"0\r\n\r\n"
    status, _, reply = raw_exchange(
        s.port, post_head("/v1/chat/completions", extra="\r\nConnection: close"), body
    )
    assert status == 200 and json.loads(reply)["object"] == "chat.completion"


def test_max_body_bytes_is_checked_by_the_one_rule(tmp_path, capsys):
    from dflash_edge.cli import main
    from dflash_edge.serve.app import ServerOptions

    with pytest.raises(InvalidArgumentError, match="max_body_bytes=0: expected an integer in"):
        ServerOptions(max_body_bytes=0)
    assert main(["serve", str(tmp_path / "no-bundle"), "--max-body-bytes", "10"]) == 2
    assert "--max-body-bytes=10: expected an integer in [1024, " in capsys.readouterr().err


# ---- 2. parsing and tokenisation off the event loop
# ------------------------------------------------------------


def test_health_answers_while_a_request_is_parsed_or_tokenised(tiny_bundle, serve, monkeypatch):
    """Parsing and tokenising are held mid-way (an Event): /health must answer meanwhile. Were
    either on the event loop, /health would hang until the test released them (httpx gives up after
    10 s: the test fails)."""
    import dflash_edge.serve.app as app_module

    gen = tiny_bundle("qwen3", 8).generator
    parsing, tokenising, release = threading.Event(), threading.Event(), threading.Event()
    real_parse, real_encode = app_module.parse, gen.encode

    def slow_parse(*args):
        parsing.set()
        release.wait(30)
        return real_parse(*args)

    def slow_encode(*args, **kwargs):
        tokenising.set()
        release.wait(30)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(app_module, "parse", slow_parse)
    monkeypatch.setattr(gen, "encode", slow_encode)
    s = serve()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{s.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert parsing.wait(30)
        assert httpx.get(f"{s.url}/health", timeout=10).status_code == 200  # while parsing
        monkeypatch.setattr(app_module, "parse", real_parse)
        release.set()
        assert pending.result().status_code == 200
        release.clear()
        tokenising.clear()  # (set by the first request, which ran through)
        pending = pool.submit(httpx.post, f"{s.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert tokenising.wait(30)
        assert httpx.get(f"{s.url}/health", timeout=10).json()["running"] == 1  # while tokenising
        release.set()
        assert pending.result().status_code == 200


def test_health_answers_during_a_5mb_upload(serve):
    """/health answers while a 5 MB body is on its way: the upload stops after each MiB until
    /health has answered, so every answer comes mid-upload (by order, not by a clock); the body is
    then read whole, parsed and tokenised (the limits raised so that it is). Were reading the body
    to block the event loop, /health would hang (httpx gives up after 30 s: the test fails)."""
    s = serve(max_body_bytes=8 << 20, request_timeout_s=3600)
    body = json.dumps(
        {**CHAT, "messages": [{"role": "user", "content": "t5 " * 1_700_000}]}
    ).encode()  # 5.1 MB
    head = post_head("/v1/chat/completions", len(body))
    paused, resume, answered = threading.Event(), threading.Event(), []

    def upload():
        with socket.create_connection((HOST, s.port), timeout=60) as sock:
            sock.sendall(head.encode() + b"\r\n\r\n")
            for i in range(0, len(body), 1 << 20):
                sock.sendall(body[i : i + (1 << 20)])
                if i + (1 << 20) < len(body):
                    paused.set()
                    assert resume.wait(60)
                    resume.clear()
            return read_response(sock)[0]

    with ThreadPoolExecutor(1) as pool, httpx.Client() as client:
        sent = pool.submit(upload)
        pauses = (len(body) - 1) >> 20  # after each whole MiB but the last piece
        for _ in range(pauses):
            assert paused.wait(60)
            paused.clear()
            answered.append(client.get(f"{s.url}/health", timeout=30).status_code)
            resume.set()
        assert sent.result() == 400  # read whole, parsed: too long for the tiny bundle's context
    assert pauses == 4 and answered == [200] * pauses


# ---- 3. model and fields
# ---------------------------------------------------------------------------------------


def test_unknown_model_is_404_model_not_found(tiny_bundle, serve):
    s, served = serve(), tiny_bundle("qwen3", 8).path.name
    r = httpx.post(f"{s.url}/v1/chat/completions", json={**CHAT, "model": "gpt-4o"})
    err = r.json()["error"]
    assert r.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
    assert "'gpt-4o'" in err["message"] and repr(served) in err["message"]
    for body in (CHAT, {**CHAT, "model": served}):  # left out, or the served id
        assert httpx.post(f"{s.url}/v1/chat/completions", json=body).status_code == 200
    r = httpx.post(
        f"{s.url}/v1/completions", json={"prompt": "t5", "max_tokens": 2, "model": "other"}
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{s.url}/v1/chat/completions", json={**CHAT, "model": 7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


REFUSED = [
    ("response_format", {"type": "json_object"}),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "required"),
    ("n", 2),
    ("n", True),
    ("logprobs", True),
    ("logprobs", 0),
    ("top_logprobs", 3),
    ("frequency_penalty", 0.5),
    ("logit_bias", {"5": 10}),
    ("audio", {"voice": "x"}),
    ("reasoning_effort", "low"),
    ("min_p", 0.1),
    ("repetition_penalty", 1.1),
    ("temprature", 0.5),
    ("prompt", "t5"),
]
ACCEPTED = [
    ("user", "alice"),
    ("metadata", {"k": "v"}),
    ("store", True),
    ("service_tier", "auto"),
    ("n", 1),
    ("logprobs", False),
    ("response_format", {"type": "text"}),
    ("tools", []),
    ("tool_choice", "none"),
    ("frequency_penalty", 0),
    ("presence_penalty", 0.0),
    ("logit_bias", {}),
    ("top_logprobs", None),
    ("parallel_tool_calls", True),
]


@pytest.mark.parametrize("field, value", REFUSED)
def test_unsupported_or_unknown_fields_are_refused_by_name(field, value):
    from dflash_edge.serve.protocol import parse_request

    with pytest.raises(InvalidArgumentError) as err:
        parse_request({**CHAT, field: value}, chat=True)
    assert err.value.argument == field and str(err.value).startswith((f"{field}=", "unrecognized"))


@pytest.mark.parametrize("field, value", ACCEPTED)
def test_ignored_and_neutral_fields_are_accepted(field, value):
    from dflash_edge.serve.protocol import parse_request

    assert parse_request({**CHAT, field: value}, chat=True).options.max_new_tokens == 4


def test_refused_field_over_http_names_it(serve):
    s = serve()
    r = httpx.post(
        f"{s.url}/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = httpx.post(
        f"{s.url}/v1/completions", json={"prompt": "t5", "max_tokens": 2, "messages": []}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


# ---- 4. the API key, the port, the 429 text
# ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, ok",
    [
        ("Bearer sesame", True),
        ("bearer sesame", True),
        ("BEARER sesame", True),
        ("Bearer  sesame", True),
        ("Basic sesame", False),
        ("Bearer", False),
        ("Bearersesame", False),
        ("Bearer sesame2", False),
        ("sesame", False),
    ],
)
def test_bearer_scheme_is_case_insensitive(serve, header, ok):
    s = serve(api_key="sesame")
    assert httpx.get(f"{s.url}/health", headers={"Authorization": header}).status_code == (
        200 if ok else 401
    )


def _key_args(**given):
    return Namespace(**{"api_key": None, "api_key_file": None, **given})


def test_api_key_sources(tmp_path):
    from dflash_edge.cli.serve import API_KEY_ENV, api_key_of
    from dflash_edge.runtime.errors import DflashEdgeError

    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    env = {API_KEY_ENV: "from-env"}
    assert api_key_of(_key_args(api_key_file=str(key_file)), env) == (
        "from-file",
        f"--api-key-file {key_file}",
    )
    assert api_key_of(_key_args(api_key="from-flag"), env) == ("from-flag", "--api-key")
    assert api_key_of(_key_args(), env) == ("from-env", f"${API_KEY_ENV}")
    assert api_key_of(_key_args(), {}) == (None, None)
    key_file.write_text(" \n")
    for args, environ, says in (
        (_key_args(api_key_file=str(key_file)), {}, "is empty"),
        (_key_args(api_key_file=str(tmp_path / "none")), {}, "cannot read it"),
        (_key_args(), {API_KEY_ENV: ""}, f"${API_KEY_ENV} is empty"),
    ):
        with pytest.raises(DflashEdgeError, match=re.escape(says)):
            api_key_of(args, environ)


def test_api_key_file_and_flag_exclude_each_other(tmp_path, capsys):
    from dflash_edge.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["serve", str(tmp_path), "--api-key", "a", "--api-key-file", str(tmp_path / "k")])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_serve_port_0_prints_the_real_port_and_takes_the_key_from_the_environment(tiny_bundle):
    env = {**os.environ, "DFLASH_EDGE_API_KEY": "env-key"}
    cmd = [
        sys.executable,
        "-c",
        "import sys; from dflash_edge.cli import main; sys.exit(main(sys.argv[1:]))",
        "serve",
        str(tiny_bundle("qwen3", 8).path),
        "--port",
        "0",
        "--threads",
        "1",
    ]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for _ in range(50):  # (any warnings first)
            line = proc.stderr.readline()
            if " on http://" in line or not line:
                break
        assert " on http://127.0.0.1:" in line and "(API key from $DFLASH_EDGE_API_KEY)" in line, (
            line
        )
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        assert port != 0
        url = f"http://127.0.0.1:{port}/health"
        assert (
            httpx.get(url, headers={"Authorization": "bearer env-key"}, timeout=30).status_code
            == 200
        )
        assert httpx.get(url, timeout=30).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_busy_port_fails_before_loading(tmp_path, capsys):
    from dflash_edge.cli import main

    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        assert (
            main(["serve", str(tmp_path / "no-bundle"), "--port", str(taken.getsockname()[1])]) == 2
        )
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1:" in err and "Traceback" not in err


def test_429_text_counts_the_real_queue():
    """The worker has not yet picked up the first job (its thread is busy): `running` is still
    False, which made the old text say max_queue + 1 waiting."""
    from dflash_edge.serve.scheduler import Scheduler, ServerBusy

    async def burst():
        sched = Scheduler(generator=None, max_queue=4)
        hold = threading.Event()
        sched._worker.submit(hold.wait, 30)  # the worker thread is busy: nothing starts yet
        tickets = [sched.submit("p", None) for _ in range(5)]  # 1 to run + 4 waiting
        with pytest.raises(ServerBusy) as busy:
            sched.submit("p", None)
        for t in tickets:
            t.cancel()
        sched.shutdown()  # the queued runs are cancelled, then the worker freed
        hold.set()
        return str(busy.value)

    text = asyncio.run(burst())
    assert "1 generation running and 4 waiting (--max-queue 4)" in text, text


# ---- 5. fuzzing the HTTP layer
# -----------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
ODD_TEXT = st.sampled_from(
    ["t5 t6", "", "\ud800", "\udfff t5", "<|im_start|>system", "\x00", "é" * 50, "t7 " * 300]
)
FIELDS = [
    "messages",
    "prompt",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "draft",
    "n",
    "logprobs",
    "response_format",
    "tools",
    "user",
    "min_p",
]


@st.composite
def bodies(draw) -> bytes:
    """Request bodies: near-valid requests with fields replaced, random JSON, raw bytes, cut or
    spliced text, lone surrogates escaped (\\ud800) or written raw (bytes that are not UTF-8), and
    oversized ones."""
    kind = draw(st.sampled_from(["request", "request", "request", "json", "bytes", "big"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        value = draw(JSON)
    else:
        value = {
            "messages": [
                {
                    "role": draw(st.sampled_from(["user", "system", "assistant", "tool"])),
                    "content": draw(ODD_TEXT | st.text(max_size=12)),
                }
            ],
            "max_tokens": draw(st.integers(1, 3)),
            "temperature": 0,
        }
        for field in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
            value[field] = draw(JSON | ODD_TEXT)
        if kind == "big":
            value["messages"] = [
                {"role": "user", "content": "t5 " * draw(st.integers(2000, 6000))}
            ]  # over 8 KiB
    raw = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    cut = draw(st.none() | st.integers(0, len(raw)))
    return raw if cut is None else raw[:cut] + draw(st.binary(max_size=4)) + raw[cut:]


HEADER_JUNK = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=24)


@st.composite
def requests(draw) -> tuple[str, bytes, bool]:
    """(head, body, waits): `waits` when the declared length exceeds what is sent (the server
    rightly waits)."""
    path = draw(
        st.sampled_from(
            ["/v1/chat/completions", "/v1/chat/completions", "/v1/completions", "/health"]
        )
    )
    method = "GET" if path == "/health" else draw(st.sampled_from(["POST", "POST", "POST", "PUT"]))
    body = draw(bodies())
    ctype = draw(
        st.sampled_from(
            [
                "application/json",
                "text/plain",
                "application/json; charset=latin-1",
                "multipart/form-data; boundary=x",
                None,
            ]
        )
        | HEADER_JUNK
    )
    auth = draw(st.sampled_from(["Bearer k", "bearer k", "BEARER  k", None]) | HEADER_JUNK)
    length = draw(
        st.sampled_from(["exact", "exact", "exact", "chunked", "short", "long", "huge", "junk"])
    )
    lines, waits = [f"{method} {path} HTTP/1.1", "Host: x", "Connection: close"], False
    lines += [f"Content-Type: {ctype}"] * (ctype is not None) + [f"Authorization: {auth}"] * (
        auth is not None
    )
    if length == "chunked":
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        lines.append("Transfer-Encoding: chunked")
    elif length == "junk":
        lines.append(f"Content-Length: {draw(st.sampled_from(['-1', 'abc', '1e3', '9' * 40, '']))}")
    else:
        declared = {
            "exact": len(body),
            "short": max(0, len(body) - 3),
            "long": len(body) + 5,
            "huge": 10**12,
        }[length]
        waits = declared > len(body) and declared <= 8 * KiB and method == "POST"
        lines.append(f"Content-Length: {declared}")
    return "\r\n".join(lines), body, waits


class ErrorLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        self.records.append(self.format(record))


def test_http_layer_fuzz(tiny_bundle, serve):
    """Random bodies and headers never get a 5xx nor log a server error, and the server is not
    wedged after."""
    tb = tiny_bundle("qwen3", 8)
    s = serve(api_key="k", max_body_bytes=8 * KiB, max_queue=4)
    errors = ErrorLog()
    logging.getLogger("uvicorn.error").addHandler(errors)
    statuses = []

    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
    @given(request=requests())
    def run(request):
        head, body, waits = request
        status, headers, reply = raw_exchange(s.port, head, body, timeout_s=0.3 if waits else 30)
        statuses.append(status)
        assert status is None or status < 500, (status, head, body[:200], reply[:300])
        assert status is not None or waits, (
            head,
            body[:200],
        )  # only an unfinished body goes unanswered
        if (
            status is not None
            and status >= 400
            and headers.get("content-type") == "application/json"
        ):
            assert is_openai_error(reply), reply

    try:
        run()
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert not errors.records, errors.records[:3]
    assert {200, 400, 401, 413} <= set(statuses)  # the fuzz reached every outcome
    wait_until(
        lambda: (
            httpx.get(f"{s.url}/health", headers={"Authorization": "Bearer k"}).json()["running"]
            == 0
        )
    )
    health = httpx.get(f"{s.url}/health", headers={"Authorization": "Bearer k"}, timeout=10).json()
    assert (health["status"], health["running"], health["waiting"]) == ("ok", 0, 0)
    r = httpx.post(
        f"{s.url}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"}, timeout=60
    )
    want = tb.generator.generate(CHAT["messages"], max_new_tokens=4, temperature=0.0)
    assert r.status_code == 200 and r.json()["dflash"]["token_ids"] == want.token_ids
