"""A live server for the HTTP tests: uvicorn over the tiny bundle's Generator on 127.0.0.1, in a
thread."""

import threading
import time

import pytest

HOST = "127.0.0.1"  # loopback only


def wait_until(predicate, timeout_s: float = 30.0) -> None:
    """Poll `predicate` until true or `timeout_s` (a bound against hangs, not a speed check)."""
    end = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < end:
        time.sleep(0.01)


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app):
        import uvicorn

        from dflash_edge.serve.limits import server_config

        self.app = app
        self.server = uvicorn.Server(server_config(app, HOST, 0, app.state.options))  # as `serve`
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve(tiny_bundle):
    """serve(**ServerOptions fields) -> LiveServer over the tiny bundle's Generator; stopped after
    the test."""
    from dflash_edge.serve.app import ServerOptions, build_app

    started = []

    def start(**options):
        started.append(
            LiveServer(build_app(tiny_bundle("qwen3", 8).generator, ServerOptions(**options)))
        )
        return started[-1]

    yield start
    for s in started:
        s.stop()
