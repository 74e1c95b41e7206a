"""The server against slow and idle clients (issue 34, item 5); its warning when exposed, keyless.

A live server with a short --request-timeout-s: request heads and bodies trickled a byte at a time
are cut off (closed, or 408) while /health answers; idle connections beyond --max-connections give
way to new ones. No assertion on elapsed time: the timeouts here only bound a hang.
"""

import json
import select
import socket
import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from live_server import HOST, serve, wait_until  # noqa: E402,F401  (serve: a fixture)

HANG_S = 30.0  # a bound against hangs, never a speed check


def trickle(sock: socket.socket, data: bytes, started: threading.Event, gap_s=0.02) -> bytes:
    """Send `data` a byte at a time until the server closes or answers; its reply (b"": closed)."""
    sock.setblocking(False)
    for i, byte in enumerate(data):
        if i == 1:
            started.set()
        readable, _, _ = select.select([sock], [], [], gap_s)
        if readable:
            return read_until_closed(sock)
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return b""
    raise AssertionError(f"the server read all {len(data)} trickled bytes without cutting them off")


def read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(HANG_S)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def is_closed(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset); False while it is open and silent."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def in_background(target, *args):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", target(*args)), daemon=True)
    thread.start()
    return thread, out


def test_trickled_request_head_is_cut_off_while_health_answers(serve):
    s = serve(request_timeout_s=1.0)
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000  # under h11's 16 KiB cap
    started = [threading.Event() for _ in range(3)]
    socks = [socket.create_connection((HOST, s.port), timeout=HANG_S) for _ in started]
    runs = [in_background(trickle, sock, head, event) for sock, event in zip(socks, started)]
    try:
        assert all(event.wait(HANG_S) for event in started)
        health = httpx.get(f"{s.url}/health", timeout=HANG_S)  # while they trickle
        assert health.json()["status"] == "ok"
        for thread, out in runs:
            thread.join(HANG_S)
            assert out["result"] == b""  # closed without an answer: its head never came whole
    finally:
        for sock in socks:
            sock.close()
    assert httpx.get(f"{s.url}/health", timeout=HANG_S).status_code == 200


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_trickled_body_gets_408_and_the_connection_closes(serve, framing):
    s = serve(request_timeout_s=1.0)
    size = "Content-Length: 100000" if framing == "content-length" else "Transfer-Encoding: chunked"
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{size}\r\n\r\n"
    )
    body = b"x" * 100_000 if framing == "content-length" else b"1\r\nx\r\n" * 20_000
    started = threading.Event()
    with socket.create_connection((HOST, s.port), timeout=HANG_S) as sock:
        sock.sendall(head.encode())
        thread, out = in_background(trickle, sock, body, started)
        assert started.wait(HANG_S)
        health = httpx.get(f"{s.url}/health", timeout=HANG_S)  # while it trickles
        assert health.json()["running"] == 0
        thread.join(HANG_S)
    reply = out["result"]  # read until the server closed the connection
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), reply[:300]
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and "--request-timeout-s" in error["message"]


def test_idle_connections_beyond_the_cap_give_way_to_health(serve):
    s = serve(max_connections=4, request_timeout_s=HANG_S)  # long: only the cap closes anything
    idle = []
    try:
        for _ in range(10):
            idle.append(socket.create_connection((HOST, s.port), timeout=HANG_S))
            idle[-1].send(b"GET /health HTTP/1.1\r\n")  # a head begun, never finished
        assert httpx.get(f"{s.url}/health", timeout=HANG_S).json()["status"] == "ok"
        # 10 + /health's connection, 4 held: the 7 oldest closed
        wait_until(lambda: sum(map(is_closed, idle)) >= 7, HANG_S)
        assert [is_closed(sock) for sock in idle] == [True] * 7 + [False] * 3
    finally:
        for sock in idle:
            sock.close()


def test_when_every_connection_serves_a_request_a_new_one_gets_503(serve):
    s = serve(max_connections=2, request_timeout_s=HANG_S)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )  # bodies unfinished: both requests in progress
    busy = [socket.create_connection((HOST, s.port), timeout=HANG_S) for _ in range(2)]
    try:
        for sock in busy:
            sock.sendall(head)
        r = httpx.get(f"{s.url}/health", timeout=HANG_S)
        assert r.status_code == 503 and "--max-connections" in r.text
        assert not any(is_closed(sock) for sock in busy)  # the requests in progress were kept
    finally:
        for sock in busy:
            sock.close()
    wait_until(lambda: _health_status(s) == 200, HANG_S)
    assert _health_status(s) == 200


def _health_status(s) -> int:
    try:
        return httpx.get(f"{s.url}/health", timeout=HANG_S).status_code
    except httpx.HTTPError:
        return 0


# ---- the warning for a server others can reach without a key -----------------------------------

LOOPBACK = ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST", "::ffff:127.0.0.1"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_no_warning_on_loopback(host):
    from dflash_edge.cli.serve import exposure_warning

    assert exposure_warning(host, "http://x:1", api_key=None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.com", ""])
def test_warning_off_loopback_without_a_key(host):
    from dflash_edge.cli.serve import exposure_warning

    line = exposure_warning(host, "http://x:1", api_key=None)
    assert "\n" not in line and "http://x:1" in line and "anyone who can reach" in line
    assert all(f in line for f in ("--api-key-file", "$DFLASH_EDGE_API_KEY", "--host 127.0.0.1"))
    assert exposure_warning(host, "http://x:1", api_key="k") is None


@pytest.mark.parametrize("key", [None, "k"])
def test_serve_on_all_addresses_warns_once_and_passes_limits(tiny_bundle, capsys, monkeypatch, key):
    """`serve --host 0.0.0.0` as a user runs it, up to uvicorn's run (replaced: nothing listens)."""
    import uvicorn

    from dflash_edge.cli import main

    ran = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: ran.append(self.config))
    monkeypatch.delenv("DFLASH_EDGE_API_KEY", raising=False)
    if key:
        monkeypatch.setenv("DFLASH_EDGE_API_KEY", key)
    args = [
        "serve",
        str(tiny_bundle("qwen3", 8).path),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--threads",
        "1",
        "--request-timeout-s",
        "7.5",
        "--max-connections",
        "9",
    ]
    assert main(args) == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "WARNING" in ln]
    if key:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "http://0.0.0.0:" in warnings[0]
        assert "anyone who can reach" in warnings[0]
    assert ran[0].http.keywords == {"request_timeout_s": 7.5, "max_connections": 9}


def test_limits_are_checked_by_the_one_rule(tmp_path, capsys):
    from dflash_edge.cli import main
    from dflash_edge.runtime.validate import InvalidArgumentError
    from dflash_edge.serve.app import ServerOptions

    for field, bad in (
        ("request_timeout_s", 0),
        ("request_timeout_s", float("nan")),
        ("max_connections", 1),
    ):
        with pytest.raises(InvalidArgumentError, match=f"{field}="):
            ServerOptions(**{field: bad})
    assert main(["serve", str(tmp_path / "no-bundle"), "--request-timeout-s", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--request-timeout-s=-1.0: expected a finite number in (0, 3600]" in err
