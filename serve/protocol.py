"""OpenAI wire format: request bodies -> checked `Job`s, results -> response bodies, stream chunks.

Every field goes through the runtime's one validation rule (`runtime/validate.py`), named as the
client wrote it (`max_tokens`, `messages[0].content`), so the 400 carries the same text the Python
API raises. Our statistics travel in the extension field `dflash` (acceptance lengths, token ids,
timings); the extension request field `draft` is `GenerationOptions.draft` ("auto" unless given).
Absent sampling fields take OpenAI's defaults (temperature 1, a random seed), not the Python API's.

Fields, as OpenAI's own API treats them (it refuses arguments it does not recognise):
- honoured: `model`, `messages` (chat) / `prompt` (completions), SAMPLING_FIELDS, `seed`, `stop`,
  `stream`, `stream_options`, and our `draft`; on completions `suffix` too: a non-empty one asks
  for the middle between `prompt` and it, in the model's fill-in-the-middle template
  (runtime/fim.py; a model without FIM tokens is a 400 naming `suffix`);
- IGNORED: accepted whatever their value, because they change nothing this server computes
  (`user`, `store`...);
- NEUTRAL: accepted only at the value that asks for what the server does anyway (`n=1`,
  `logprobs=false`, `response_format={"type": "text"}`, no `tools`...), any other value is a 400
  naming the field;
- anything else (a typo, another server's knob such as `min_p`) is a 400 naming the field, never
  dropped silently.
`model` may be left out (the served model answers); given, it must be the served id
(`GET /v1/models`), else 404 with code `model_not_found`, as OpenAI answers.

>>> body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
>>> job = parse_request(body, chat=True)
>>> job.options.temperature, job.options.draft, job.stream
(0.0, 'auto', False)
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass

from ..runtime.fim import FimPrompt
from ..runtime.validate import (
    GenerationOptions,
    InvalidArgumentError,
    check_flag,
    check_messages,
    check_text,
)

DEFAULT_MAX_TOKENS = 256
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, far beyond any bundle's context
DEFAULT_REQUEST_TIMEOUT_S = 30.0  # a request's head, then its body: 1 MiB in 30 s is ~35 KB/s
DEFAULT_MAX_CONNECTIONS = 64  # 1 generation + --max-queue 16 waiting + uploads, pollers
# client field -> the runtime's argument (and its default when the field is absent or null)
SAMPLING_FIELDS = {
    "max_tokens": ("max_new_tokens", DEFAULT_MAX_TOKENS),
    "max_completion_tokens": ("max_new_tokens", DEFAULT_MAX_TOKENS),
    "temperature": ("temperature", 1.0),
    "top_p": ("top_p", 1.0),
    "top_k": ("top_k", 0),
}
# fields this server takes whatever their value: they change nothing it computes
IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "safety_identifier",
        "prompt_cache_key",
    }
)
# fields accepted only at a value that asks for what the server does anyway (null = absent, always
# accepted)
NEUTRAL = {
    "n": (1,),
    "best_of": (1,),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
}
HONOURED = frozenset(
    {"model", "seed", "stop", "stream", "stream_options", "draft", "cache_prompt", *SAMPLING_FIELDS}
)
FINISH = {"stop": "stop", "length": "length", "context": "length"}


@dataclass(frozen=True)
class Job:
    """One request, checked: what to generate and how to answer."""

    prompt: str | list[dict] | FimPrompt  # the completion's text, a middle, or chat messages
    options: GenerationOptions  # checked
    chat: bool  # /v1/chat/completions (True) or /v1/completions
    stream: bool
    include_usage: bool  # stream_options.include_usage
    model: str | None
    warmup: bool = False  # answer at once without generating (llama-server's n_predict 0)


class ModelNotFoundError(InvalidArgumentError):
    """The request names a model this server does not serve (HTTP 404, code `model_not_found`)."""


def parse(raw: bytes, chat: bool, served: str | None = None) -> Job:
    """A raw request body -> Job (`parse_body`, then `parse_request`): the CPU work of a request
    before it queues.

    Nesting deep enough to exhaust Python's recursion limit is refused as bad input, not a server
    error."""
    try:
        return parse_request(parse_body(raw), chat, served)
    except RecursionError as err:
        raise InvalidArgumentError(
            "body", "the request body is nested too deeply; send a flat JSON object"
        ) from err


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body (400 naming the problem otherwise)."""
    try:
        body = json.loads(raw)
    # JSONDecodeError, UnicodeDecodeError, an integer beyond Python's digit limit
    except ValueError as err:
        raise InvalidArgumentError(
            "body", f"the request body is not valid JSON ({_short(err, 200)}); send a JSON object"
        ) from err
    if not isinstance(body, dict):
        raise InvalidArgumentError(
            "body", f"the request body is a JSON {type(body).__name__}; send a JSON object"
        )
    return body


def parse_request(body: dict, chat: bool, served: str | None = None) -> Job:
    """A chat (`messages`) or completion (`prompt`) request -> Job; InvalidArgumentError names the
    field.

    `served`: the model id this server answers to (None: any); another `model` raises
    ModelNotFoundError."""
    model = _check_model(body.get("model"), served)
    field = "messages" if chat else "prompt"
    _check_fields(body, field, () if chat else ("suffix",))
    if field not in body:
        raise InvalidArgumentError(
            field, f"{field} is missing: a {'chat ' if chat else ''}completion request needs it"
        )
    prompt = check_messages(body[field], field) if chat else body[field]
    if not chat and isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # OpenAI allows a one-element list of prompts
    if not chat and not isinstance(prompt, str):
        raise InvalidArgumentError("prompt", f"prompt={prompt!r:.60}: expected a string")
    if not chat and body.get("suffix"):  # "" or null: a plain completion
        suffix = check_text(body["suffix"], "suffix")
        prompt = FimPrompt(check_text(prompt, "prompt"), suffix, labels={"prefix": "prompt"})
    values, labels = (
        {arg: default for arg, default in SAMPLING_FIELDS.values()},
        {"stop": "stop", "draft": "draft"},
    )
    for name, (arg, default) in SAMPLING_FIELDS.items():
        if body.get(name) is not None:
            values[arg], labels[arg] = body[name], name
    seed = body.get("seed")
    extra = extension_options(body)
    options = GenerationOptions(
        **values,
        seed=secrets.randbits(63) if seed is None else seed,
        stop=body.get("stop"),
        chat=chat,
        **extra,
    ).checked(labels)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise InvalidArgumentError(
            "stream_options", f"stream_options={stream_options!r:.60}: expected an object"
        )
    return Job(
        prompt,
        options,
        chat,
        check_flag("stream", body.get("stream", False), "stream"),
        check_flag("stream_options.include_usage", stream_options.get("include_usage", False)),
        model,
    )


def _check_model(model, served: str | None) -> str | None:
    if model is not None and not isinstance(model, str):
        raise InvalidArgumentError("model", f"model={model!r:.60}: expected a string")
    if model is not None and served is not None and model != served:
        raise ModelNotFoundError(
            "model",
            f"the model {_short(model)} does not exist here: this server serves "
            f"{served!r} (GET /v1/models lists it); send that id or leave `model` out",
        )
    return model


def _check_fields(
    body: dict,
    prompt_field: str,
    also: tuple[str, ...] = (),
    honoured=HONOURED,
    ignored=IGNORED,
    neutral=None,
) -> None:
    """Every field honoured (`honoured`, the prompt field, `also`), ignored, or at its neutral
    value; anything else is refused by name. The tables default to the OpenAI routes' own."""
    neutral = NEUTRAL if neutral is None else neutral
    for name, value in body.items():
        if name == prompt_field or name in also or name in honoured or name in ignored:
            continue
        if name not in neutral:
            raise InvalidArgumentError(
                name[:60],
                f"unrecognized request argument {_short(name)}: this server "
                f"refuses fields it does not know rather than ignore them (the README's "
                f"Server section lists the fields it takes)",
            )
        accepted = neutral[name]
        if value is not None and not any(_same(value, a) for a in accepted):
            allowed = (
                f"only {' or '.join(f'{name}={a!r}' for a in accepted)}"
                if accepted
                else "no value: leave it out"
            )
            raise InvalidArgumentError(
                name, f"{name}={_short(value)}: this server supports {allowed}"
            )


def _same(a, b) -> bool:
    """JSON equality without Python's True == 1 (so `n: true` or `logprobs: 0` is not read as
    neutral)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _short(value, n: int = 60) -> str:
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def extension(result) -> dict:
    """Our statistics for one finished generation (the `dflash` field)."""
    stats = result.stats.to_dict()
    return {
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()},
        "token_ids": result.token_ids,
    }


def usage(result) -> dict:
    """OpenAI's usage object; `cached_tokens`: prompt tokens the server's kept state served."""
    p, c = result.stats.prompt_tokens, len(result.token_ids)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": result.stats.cached_tokens},
    }


def extension_options(body: dict) -> dict:
    """The GenerationOptions fields beyond OpenAI's: `draft`, and llama-server's `cache_prompt`
    (true unless false: reuse the prefix the last request left cached)."""
    return {k: body[k] for k in ("draft", "cache_prompt") if body.get(k) is not None}


class Reply:
    """Response bodies for one job: the whole answer, or its stream chunks (same id and
    timestamp)."""

    done_marker = True  # a stream ends with `data: [DONE]`

    def __init__(self, job: Job, model: str):
        self.job, self.model = job, model
        self.id = f"{'chatcmpl' if job.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        kind = (
            ("chat.completion" + (".chunk" if chunk else ""))
            if self.job.chat
            else "text_completion"
        )
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish: str | None, first: bool = False) -> dict:
        if not self.job.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        if finish is not None and text is None:
            return {"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None}
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

    def whole(self, result) -> dict:
        finish = FINISH.get(result.finish_reason, "stop")
        if self.job.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": finish,
                "logprobs": None,
            }
        else:
            choice = self._choice(result.text, finish)
        return {
            **self._head(False),
            "choices": [choice],
            "usage": usage(result),
            "dflash": extension(result),
        }

    def opening(self) -> list[dict]:
        """The stream's first chunks, before any text (the role chunk)."""
        return [self.chunk("", first=True)]

    def chunk(self, piece: str, first: bool = False) -> dict:
        return {**self._head(True), "choices": [self._choice(piece, None, first)]}

    def last_chunks(self, result) -> list[dict]:
        """The finishing chunk (finish_reason + our statistics), then usage if the client asked for
        it."""
        done = {
            **self._head(True),
            "choices": [self._choice(None, FINISH.get(result.finish_reason, "stop"))],
            "dflash": extension(result),
        }
        return [done] + (
            [{**self._head(True), "choices": [], "usage": usage(result)}]
            if self.job.include_usage
            else []
        )


def error_body(
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
