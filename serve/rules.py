"""The server's numeric arguments (`dflash-edge serve`, `ServerOptions`): their ranges, checked by
the shared `runtime.validate.check` (`check(name, value, rules=RULES)`).

>>> from dflash_edge.runtime.validate import check
>>> check("port", 8000, rules=RULES)
8000
"""

from __future__ import annotations

from ..runtime.validate import Number

RULES: dict[str, Number] = {
    "max_queue": Number(int, 0, 100_000),
    "port": Number(int, 0, 65535, note="0 = any free port"),
    "max_body_bytes": Number(
        int, 1024, 1 << 30, note="the largest request body the server reads, in bytes"
    ),
    "request_timeout_s": Number(
        float,
        0,
        3600,
        lo_open=True,
        note="seconds a client has for a request's head, then its body",
    ),
    "max_connections": Number(int, 2, 100_000, note="open connections the server holds"),
}
