"""Slow and idle clients cannot hold the server: a deadline per request head, a connection cap.

uvicorn (0.55, h11) times out only the idle gap *after* a response (`timeout_keep_alive`, 5 s):
a connection that never sends a byte, or trickles its request line and headers a byte at a time
(slowloris), is held for ever; its `limit_concurrency` would answer 503 to every new request
(/health included) once enough of those are open. `GuardedH11` adds what it lacks:

- a request head (request line + headers) must arrive within `request_timeout_s` of the
  connection opening or of the previous response, else the connection is closed. The body's
  deadline is the app's (serve/app.py answers 408). The same deadline closes a connection that
  goes on sending the rest of a body the app has already answered (413, 401).
- at most `max_connections` are open: one more closes the connection that has waited longest for
  a request head (idle or trickling; never one whose request is being served), so a new client
  (/health) gets in; when every other connection is serving a request, the new one gets a 503.

The h11 protocol is pinned (not httptools, even where installed): these hold whatever is installed.
"""

from __future__ import annotations

import functools

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

_BUSY_TEXT = b"every connection is busy with a request; retry later (--max-connections)\n"
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n%s"
    % (len(_BUSY_TEXT), _BUSY_TEXT)
)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a connection cap (see above)."""

    def __init__(self, *args, request_timeout_s: float, max_connections: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.request_timeout_s, self.max_connections = request_timeout_s, max_connections
        self.head_timer, self.waiting_since = None, 0.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head arrived: the app has the request
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # first: a pipelined request (next) disarms it again
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self.waiting_since = self.loop.time()
        self.head_timer = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _too_slow(self) -> None:
        self.head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> None:
        """Close the connection waiting longest for a request head; none: refuse this one (503)."""
        others = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        if len(others) < self.max_connections:  # one was closed already, not yet gone from the set
            return
        waiting = [c for c in others if getattr(c, "head_timer", None) is not None]
        if waiting:
            oldest = min(waiting, key=lambda c: c.waiting_since)
            oldest._disarm()
            oldest.transport.close()
        else:
            self._disarm()
            self.transport.write(BUSY)
            self.transport.close()


def server_config(app, host: str, port: int, options, **kwargs) -> uvicorn.Config:
    """uvicorn's Config for `app` on h11 with the slow-client guards of `options` (a ServerOptions:
    request_timeout_s, max_connections); `kwargs` go to uvicorn.Config."""
    protocol = functools.partial(
        GuardedH11,
        request_timeout_s=options.request_timeout_s,
        max_connections=options.max_connections,
    )
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning", **kwargs)
