"""`dflash-edge serve BUNDLE`: an OpenAI-compatible server on loopback (one generation at a time, bounded queue).

    dflash-edge serve bundle/ --port 8000 --max-queue 16 --api-key secret
    curl http://127.0.0.1:8000/v1/chat/completions -H "Authorization: Bearer secret" \\
         -d '{"messages": [{"role": "user", "content": "Hi"}], "stream": true}'
"""
from __future__ import annotations

import ipaddress
import sys


def add_arguments(p) -> None:
    from .common import add_thread_args

    p.add_argument("bundle", help="bundle directory (from `dflash-edge export --out DIR`)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback only; another address exposes the model to the network)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait behind the running one; more get 429 + Retry-After")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--model-name", default=None, help="model id to report (default: the bundle directory's name)")
    p.add_argument("--provider", default="cpu", help="cpu | cuda | tensorrt")
    add_thread_args(p)


def run(args) -> int:
    from dflash_edge.runtime.errors import DflashEdgeError

    # --port, --max-queue, --threads: checked by the dispatcher (cli.py) against runtime/validate.py's rules
    if args.api_key is not None and not args.api_key.strip():
        raise DflashEdgeError("--api-key is empty: pass a non-empty key, or leave the option out")
    import uvicorn                                          # the `serve` extra (cli.py names it when missing)

    from dflash_edge.runtime.generator import Generator

    from dflash_edge.serve.app import ServerOptions, build_app

    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin)
    app = build_app(gen, ServerOptions(args.max_queue, args.api_key, args.model_name))
    if not _is_loopback(args.host):
        print(f"dflash-edge serve: warning: binding {args.host}: reachable from other machines"
              + ("" if args.api_key else " and without --api-key"), file=sys.stderr)
    print(f"dflash-edge serve: {gen.bundle.root} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
