"""`dflash-edge serve BUNDLE`: an OpenAI-compatible server on loopback (one generation at a time,
bounded queue).

    DFLASH_EDGE_API_KEY=secret dflash-edge serve bundle/ --port 8000 --max-queue 16
    curl http://127.0.0.1:8000/v1/chat/completions -H "Authorization: Bearer secret" \\
         -d '{"messages": [{"role": "user", "content": "Hi"}], "stream": true}'

The API key comes from `--api-key-file PATH`, `--api-key KEY` (visible to other users in `ps`) or,
when neither is given, the environment variable DFLASH_EDGE_API_KEY. The socket is bound before the
bundle loads, so a busy port fails at once and `--port 0` prints the port it got. On an address
other than loopback (127.0.0.0/8, ::1, localhost) without a key, one WARNING line on stderr says
that anyone who can reach it can generate, and how to fix that.

Slow clients (serve/limits.py): a request's head must arrive within --request-timeout-s (default
30) of the connection opening or of the previous response, else the connection is closed; its body
within as long again, else 408. At most --max-connections (default 64) are open: one more closes
the one waiting longest for a request head, or gets a 503 when all serve requests. An idle
keep-alive connection closes after 5 s (uvicorn's timeout_keep_alive).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

from ..runtime.errors import DflashEdgeError
from ..serve.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
)
from ..serve.rules import RULES
from .common import add_provider_arg, add_thread_args

API_KEY_ENV = "DFLASH_EDGE_API_KEY"
DEFAULT_CACHE_RAM_MB = 256
# the ranges of this verb's own numeric options (--port, --max-queue, ...), checked before `run`
# (cli/__init__.py)
NUMBERS = RULES


def add_arguments(p) -> None:

    p.add_argument("bundle", help="bundle directory (from `dflash-edge export --out DIR`)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default loopback only; another address exposes the model to the "
        "network)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=8000,
        help="TCP port (0: any free port; the one chosen is printed)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait behind the running one; more get 429 + Retry-After",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body read, in bytes (default 1 MiB); larger ones get 413 before "
        "being read",
    )
    key = p.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="require 'Authorization: Bearer KEY', KEY being this file's content (whitespace "
        "stripped)",
    )
    key.add_argument(
        "--api-key",
        default=None,
        help=f"the same with KEY on the command line (visible in `ps`; prefer --api-key-file or "
        f"${API_KEY_ENV}, read when neither option is given)",
    )
    p.add_argument(
        "--request-timeout-s",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds a client has to send a request's head (else the connection "
        "closes), then as long for its body (else 408); default %(default)g",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open connections held (default %(default)d); one more closes the one "
        "idle longest, or gets 503 when all are serving requests",
    )
    p.add_argument(
        "--cache-ram-mb",
        type=float,
        default=DEFAULT_CACHE_RAM_MB,
        help="MB of RAM for other conversations' and files' caches besides the live one "
        "(least recently used out first; like llama-server's --cache-ram); 0: the live one "
        "only; default %(default)g",
    )
    p.add_argument(
        "--model-name",
        default=None,
        help="model id to report (default: the bundle directory's name)",
    )
    add_provider_arg(p)
    add_thread_args(p)


def run(args) -> int:
    # --port, --max-queue, --max-body-bytes, --request-timeout-s, --max-connections, --threads:
    # checked by the dispatcher (cli/__init__.py) against runtime/validate.py's rules
    api_key, key_source = api_key_of(args, os.environ)
    import uvicorn  # the `serve` extra (cli.py names it when missing)

    from ..runtime.generator import Generator
    from ..serve.app import ServerOptions, build_app
    from ..serve.limits import server_config

    with _bind(args.host, args.port) as sock:  # before loading: a busy port fails in a second
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        warning = exposure_warning(args.host, url, api_key)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        gen = Generator.load(
            args.bundle, provider=args.provider, threads=args.threads, spin=args.spin
        )
        gen.keep_prompts(args.cache_ram_mb)
        options = ServerOptions(
            max_queue=args.max_queue,
            api_key=api_key,
            model_name=args.model_name,
            max_body_bytes=args.max_body_bytes,
            request_timeout_s=args.request_timeout_s,
            max_connections=args.max_connections,
        )
        app = build_app(gen, options)
        print(
            f"dflash-edge serve: {gen.bundle.root} on {url}/v1"
            + (f" (API key from {key_source})" if api_key else "")
            + f"; prompt cache: the live sequence + up to {args.cache_ram_mb:g} MB in RAM "
            f"(--cache-ram-mb)",
            file=sys.stderr,
            flush=True,
        )
        uvicorn.Server(server_config(app, args.host, port, options)).run(sockets=[sock])
    return 0


def api_key_of(args, environ) -> tuple[str | None, str | None]:
    """(key, where it came from): --api-key-file, --api-key, else $DFLASH_EDGE_API_KEY; (None, None)
    for none."""

    if args.api_key_file is not None:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key, source = f.read().strip(), f"--api-key-file {args.api_key_file}"
        except (OSError, UnicodeDecodeError) as err:
            raise DflashEdgeError(
                f"--api-key-file {args.api_key_file}: cannot read it ({err})"
            ) from err
    elif args.api_key is not None:
        key, source = args.api_key, "--api-key"
    elif API_KEY_ENV in environ:
        key, source = environ[API_KEY_ENV], f"${API_KEY_ENV}"
    else:
        return None, None
    if not key.strip():
        what = "--api-key is empty" if source == "--api-key" else f"{source} is empty"
        raise DflashEdgeError(
            f"{what}: give a non-empty key, or no key at all (then any client is served)"
        )
    return key, source


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening: uvicorn does that); DflashEdgeError
    naming the address."""

    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        if sock is not None:
            sock.close()
        raise DflashEdgeError(
            f"cannot listen on {host}:{port}: {err.strerror or err}; pick another --port "
            f"(0: any free one) or --host"
        ) from err
    return sock


def exposure_warning(host: str, url: str, api_key: str | None) -> str | None:
    """One stderr line when `host` is not loopback and no API key is set (None otherwise)."""
    if api_key or _is_loopback(host):
        return None
    return (
        f"dflash-edge serve: WARNING: listening on {url} (--host {host or '(all)'}) with no "
        f"API key: anyone who can reach this address can generate with this model; set a key "
        f"(--api-key-file PATH or ${API_KEY_ENV}) or serve loopback only (--host 127.0.0.1)"
    )


def _is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z) or localhost; any other address or name: not."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower().rstrip(".") == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
