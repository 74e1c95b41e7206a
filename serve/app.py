"""The ASGI app (Starlette): OpenAI-compatible routes over one loaded Generator.

    POST /v1/chat/completions   POST /v1/completions   (stream: server-sent events)
    POST /infill                (llama-server's fill-in-the-middle shape: infill.py)
    GET  /v1/models             GET  /health

Errors use OpenAI's shape: 400 for bad input (the runtime's validation text, `param` = the field),
401 for a missing or wrong API key (`Authorization: Bearer KEY`, the scheme in any case), 404
`model_not_found` for a model this server does not serve, 413 for a body over `max_body_bytes`
(refused from its Content-Length before any of it is read, or as soon as a chunked upload passes the
limit), 429 + Retry-After when the queue is full, 404/405 for other paths. The event loop only moves
bytes: JSON parsing and the request's checks run in a worker thread (Starlette's pool), tokenisation
in the generation thread, so `/health` answers during uploads (the tokeniser runs without the GIL,
and a text longer than the context could hold in any tokenisation is refused before it is tokenised:
runtime/generator.py `_check_length`). A body not whole within `request_timeout_s` of its request's
head gets 408 `request_timeout` and the connection is closed; heads, idle and surplus connections
are serve/limits.py's (run the app with `server_config`).

>>> options = ServerOptions(max_queue=8)                                      # doctest: +SKIP
>>> app = build_app(Generator.load("bundle/"), options)                        # doctest: +SKIP
>>> uvicorn.Server(server_config(app, "127.0.0.1", 8000, options)).run()      # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..runtime.errors import DflashEdgeError
from ..runtime.validate import check
from . import infill
from .protocol import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    ModelNotFoundError,
    Reply,
    error_body,
    parse,
)
from .rules import RULES
from .scheduler import Scheduler, ServerBusy


@dataclass(frozen=True)
class ServerOptions:
    max_queue: int = 16  # requests waiting behind the running one; beyond: 429
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on every request when set
    model_name: str | None = None  # the id /v1/models lists (default: the bundle directory's name)
    max_body_bytes: int = (
        DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413 before they are read
    )
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S  # a request's head, then its body (408)
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # open; one more: the longest idle one is closed

    def __post_init__(self):  # the CLI checked these already, with its own labels
        check("max_queue", self.max_queue, rules=RULES)
        check("max_body_bytes", self.max_body_bytes, rules=RULES)
        check("request_timeout_s", self.request_timeout_s, rules=RULES)
        check("max_connections", self.max_connections, rules=RULES)


class ApiError(Exception):
    def __init__(self, status: int, body: dict, headers: dict | None = None):
        self.status, self.body, self.headers = status, body, headers


def build_app(generator, options: ServerOptions = ServerOptions()) -> Starlette:
    """The server's app over `generator` (a loaded dflash_edge.runtime.Generator)."""
    sched = Scheduler(generator, options.max_queue)
    routes = _Routes(generator, sched, options)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/infill", routes.fill, methods=["POST"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
        ],
        exception_handlers={
            ApiError: _api_error,
            DflashEdgeError: _bad_input,
            ModelNotFoundError: _model_not_found,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
        },
        lifespan=_lifespan(sched),
    )
    if options.api_key:
        app.add_middleware(_ApiKey, key=options.api_key)
    app.state.scheduler, app.state.options = sched, options
    return app


class _Routes:
    """The endpoints over one Generator, its Scheduler and the server's options."""

    def __init__(self, generator, sched: Scheduler, options: ServerOptions):
        self.generator, self.sched, self.options = generator, sched, options
        self.model = options.model_name or generator.bundle.root.resolve().name
        self.created = int(time.time())

    async def chat(self, request: Request):
        return await self._complete(request, parse, (True, self.model), Reply)

    async def completions(self, request: Request):
        return await self._complete(request, parse, (False, self.model), Reply)

    async def fill(self, request: Request):
        decode = self.generator.tokenizer.decode

        def reply(job, model):
            return infill.InfillReply(job, model, decode)

        args = (self.model, self.generator.max_context)
        return await self._complete(request, infill.parse, args, reply)

    async def models(self, request: Request):
        card = {"id": self.model, "object": "model", "created": self.created}
        return JSONResponse({"object": "list", "data": [{**card, "owned_by": "dflash-edge"}]})

    async def health(self, request: Request):
        return JSONResponse(
            {
                "status": "ok",
                "model": self.model,
                "running": int(self.sched.running),
                "waiting": self.sched.waiting,
                "max_queue": self.options.max_queue,
            }
        )

    async def _complete(self, request: Request, parse_fn, args: tuple, make_reply):
        opts = self.options
        raw = await _read_body(request, opts.max_body_bytes, opts.request_timeout_s)
        job = await run_in_threadpool(parse_fn, raw, *args)  # JSON and checks off the event loop
        if job.warmup and (job.stream or not job.options.cache_prompt):  # else: prefill it
            return JSONResponse(make_reply(job, self.model).warmup())
        ticket = self._submit(job)
        events = aiter(ticket)
        try:
            # waits its turn: started, or an input error
            kind, value = await _next_event(events, request)
            if kind == "started" and job.stream:
                return StreamingResponse(
                    _sse(make_reply(job, self.model), events, ticket),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            while kind == "started" or kind == "piece":
                kind, value = await _next_event(events, request)
        except BaseException:
            ticket.cancel()
            raise
        ticket.cancel()
        if kind == "done":
            return JSONResponse(make_reply(job, self.model).whole(value))
        if kind == "error":
            raise _as_api_error(value)
        return Response(status_code=499)  # the client left: nobody reads this

    def _submit(self, job):
        """The job's ticket in the queue, or 429 + Retry-After when the queue is full."""
        try:
            return self.sched.submit(job.prompt, job.options)
        except ServerBusy as err:
            raise ApiError(
                429,
                error_body(str(err), "server_busy", code="queue_full"),
                {"Retry-After": str(err.retry_after)},
            ) from err


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, or 413 as soon as it is known to be over `limit` bytes: from Content-Length
    before a byte is read, else while counting a chunked upload (at most `limit` + one chunk is ever
    held). The rest of a refused upload is read and discarded by uvicorn, so the client gets the 413
    rather than a reset. A body not whole within `timeout_s` of the request's head (trickled) gets
    408 and the connection is closed."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise _too_large(limit, declared)
    try:
        return await asyncio.wait_for(_collect(request, limit), timeout_s)
    except asyncio.TimeoutError as err:
        message = (
            f"the request body did not arrive within {timeout_s:g} s (the server's "
            f"--request-timeout-s); send it at once"
        )
        raise ApiError(
            408, error_body(message, code="request_timeout"), {"Connection": "close"}
        ) from err


async def _collect(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, f"over {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int, size: str) -> ApiError:
    return ApiError(
        413,
        error_body(
            f"the request body is {size} bytes, more than this server reads "
            f"(--max-body-bytes {limit}); send a smaller request",
            code="request_too_large",
        ),
    )


async def _next_event(events, request: Request, poll_s: float = 0.25) -> tuple[str, object]:
    """The job's next event; ("gone", None) once the client has disconnected (its queue slot is then
    freed)."""
    pending = asyncio.ensure_future(anext(events, ("end", None)))
    while True:
        done, _ = await asyncio.wait({pending}, timeout=poll_s)
        if done:
            return pending.result()
        if await request.is_disconnected():
            pending.cancel()
            return "gone", None


def _lifespan(sched: Scheduler):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        sched.shutdown()

    return lifespan


async def _sse(reply, events, ticket):
    """Server-sent events: the opening chunks (OpenAI: the role), one chunk per text piece, the
    finish chunk(s), then [DONE] where the protocol sends it (`reply.done_marker`)."""
    try:
        for chunk in reply.opening():
            yield _event(chunk)
        async for kind, value in events:
            if kind == "piece":
                yield _event(reply.chunk(value))
            elif kind == "done":
                for chunk in reply.last_chunks(value):
                    yield _event(chunk)
            elif kind == "error":
                yield _event(_as_api_error(value).body)
        if reply.done_marker:
            yield "data: [DONE]\n\n"
    finally:
        ticket.cancel()  # a client that left (or any early end) frees the Generator


def _event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def _as_api_error(err) -> ApiError:
    # bad input the runtime found (e.g. a prompt longer than the context)
    if isinstance(err, DflashEdgeError):
        return ApiError(400, error_body(str(err), param=getattr(err, "argument", None)))
    return ApiError(
        500, error_body(f"generation failed: {type(err).__name__}: {err}", "server_error")
    )


async def _api_error(request, err: ApiError):
    return JSONResponse(err.body, status_code=err.status, headers=err.headers)


async def _bad_input(request, err: DflashEdgeError):
    return JSONResponse(error_body(str(err), param=getattr(err, "argument", None)), status_code=400)


async def _model_not_found(request, err: ModelNotFoundError):
    return JSONResponse(
        error_body(str(err), param="model", code="model_not_found"), status_code=404
    )


async def _client_gone(request, err: ClientDisconnect):
    return Response(status_code=499)  # the client left mid-upload: nobody reads this


async def _http_error(request, err: HTTPException):
    return JSONResponse(
        error_body(f"{request.method} {request.url.path}: {err.detail}", code=str(err.status_code)),
        status_code=err.status_code,
    )


class _ApiKey:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer KEY` (the scheme in any
    case)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self._allowed(
            dict(scope["headers"]).get(b"authorization", b"")
        ):
            body = error_body(
                "missing or wrong API key: send the header 'Authorization: Bearer KEY' with the "
                "key the "
                "server was started with (--api-key-file, $DFLASH_EDGE_API_KEY or --api-key)",
                code="invalid_api_key",
            )
            return await JSONResponse(body, status_code=401)(scope, receive, send)
        await self.app(scope, receive, send)

    def _allowed(self, header: bytes) -> bool:
        scheme, _, token = header.strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
