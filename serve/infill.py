"""llama-server's `/infill` wire format: request bodies -> checked `Job`s (a `FimPrompt`), results
-> llama-server's response bodies and stream events; what editor plugins (llama.vscode) send.

Request fields, as protocol.py treats the OpenAI ones (anything not listed is a 400 naming it):
- honoured: `input_prefix`, `input_suffix`, `input_extra` ([{"filename", "text"}]: other files, the
  repo context), `prompt` (the middle's start, already typed), `n_predict` (-1: until the context
  ends; 0: answer without generating, the plugins' cache warm-up: with `cache_prompt` the prompt
  is prefilled and kept), `temperature` (default 0 here: greedy; llama-server's is 0.8),
  `top_k`, `top_p`, `seed`, `stop`, `stream`, `n_indent` (end the middle before a line indented
  less), `t_max_predict_ms` (end it at the first newline after that long), `model`, and our
  `draft` and `max_lines`;
- `cache_prompt` (default true, as llama-server): reuse the prefix the last request shares
  (`tokens_cached`, `timings.cache_n` count it; `timings.prompt_n` is what ran);
- IGNORED: `t_max_prompt_ms` (llama-server does not act on it either), `id_slot`;
- `samplers`: any list when greedy (the argmax is the same whatever the chain); when sampling, only
  `top_k`, `top_p`, `temperature` (the chain this server runs), else a 400 naming it;
- NEUTRAL (accepted at the value that changes nothing): `n_probs: 0`, `min_p: 0`, `repeat_penalty:
  1`, `presence_penalty: 0`, `frequency_penalty: 0`, `typical_p: 1`, `mirostat: 0`, `n_cmpl: 1`, ...

Responses: `content`, `tokens_predicted`, `tokens_evaluated`, `stop`, `stop_type` ("eos", "word",
"limit"), `stopping_word`, `timings`, `generation_settings`, and our `dflash` statistics. A stream
sends `{"content": piece, "stop": false}` events, then the whole object with `"stop": true` (and
`content` ""), with no `[DONE]`, as llama-server does.

>>> job = parse_infill({"input_prefix": "def f(", "input_suffix": ")", "n_predict": 8})
>>> job.prompt.prefix, job.options.max_new_tokens, job.options.temperature
('def f(', 8, 0.0)
"""

from __future__ import annotations

import numbers
import secrets
import uuid

from ..runtime.fim import FimPrompt
from ..runtime.validate import GenerationOptions, InvalidArgumentError, check_flag, check_text
from .protocol import (
    Job,
    _check_fields,
    _check_model,
    _short,
    extension,
    extension_options,
    parse_body,
)

HONOURED = frozenset(
    {
        "input_prefix",
        "input_suffix",
        "input_extra",
        "n_predict",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop",
        "stream",
        "n_indent",
        "t_max_predict_ms",
        "cache_prompt",
        "model",
        "draft",
        "max_lines",
        "samplers",
    }
)
IGNORED = frozenset({"t_max_prompt_ms", "id_slot"})
NEUTRAL = {
    "n_probs": (0,),
    "min_p": (0,),
    "repeat_penalty": (1,),
    "repeat_last_n": (0, 64),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "typical_p": (1,),
    "tfs_z": (1,),
    "mirostat": (0,),
    "n_cmpl": (1,),
    "ignore_eos": (False,),
    "logit_bias": ([], {}),
    "return_tokens": (False,),
    "dry_multiplier": (0,),
    "xtc_probability": (0,),
    "lora": ([],),
}
CHAIN = ("top_k", "top_p", "temperature")  # the samplers this server runs, in its order
LABELS = {
    "prefix": "input_prefix",
    "suffix": "input_suffix",
    "extra": "input_extra",
    "middle": "prompt",
    "min_indent": "n_indent",
    "time_limit_s": "t_max_predict_ms",
}
STOP_TYPE = {"length": "limit", "context": "limit"}


def parse_infill(body: dict, served: str | None = None, max_context: int = 1 << 24) -> Job:
    """An /infill request -> Job (prompt: a FimPrompt); InvalidArgumentError names the field.
    `max_context`: what `n_predict: -1` (until the context ends) asks for at most."""
    model = _check_model(body.get("model"), served)
    _check_fields(body, "prompt", honoured=HONOURED, ignored=IGNORED, neutral=NEUTRAL)
    texts = {k: body.get(k) or "" for k in ("input_prefix", "input_suffix", "prompt")}
    for name, text in texts.items():
        check_text(text, name)
    n_predict = body.get("n_predict")
    n_predict = -1 if n_predict is None else n_predict
    if not isinstance(n_predict, numbers.Integral) or isinstance(n_predict, bool) or n_predict < -1:
        raise InvalidArgumentError(
            "n_predict",
            f"n_predict={_short(n_predict)}: expected an integer >= -1 (-1: until the context "
            f"ends; 0: no tokens)",
        )
    fim = FimPrompt(
        texts["input_prefix"],
        texts["input_suffix"],
        _extra(body.get("input_extra")),
        texts["prompt"],
        max_lines=body.get("max_lines") or 0,
        min_indent=body.get("n_indent") or 0,
        time_limit_s=_ms(body.get("t_max_predict_ms")),
        label="input_suffix",
        labels=LABELS,
    ).checked()
    seed = body.get("seed")
    seed = None if seed is None or seed == -1 else seed  # llama-server's -1: a random seed
    extra = extension_options(body)
    fields = {"top_k": 0, "top_p": 1.0, "temperature": 0.0}
    fields.update({k: body[k] for k in fields if body.get(k) is not None})
    options = GenerationOptions(
        max_new_tokens=max(n_predict, 1) if n_predict != -1 else max_context,
        seed=secrets.randbits(63) if seed is None else seed,
        stop=body.get("stop"),
        chat=False,
        **fields,
        **extra,
    ).checked({"max_new_tokens": "n_predict"})
    _check_samplers(body.get("samplers"), options.temperature)
    stream = check_flag("stream", body.get("stream", False), "stream")
    return Job(fim, options, False, stream, False, model, warmup=n_predict == 0)


def _extra(chunks) -> tuple[tuple[str, str], ...]:
    """input_extra: [{"filename": str, "text": str}] -> (name, text) pairs (filename optional)."""
    if chunks is None:
        return ()
    if not isinstance(chunks, list):
        raise InvalidArgumentError(
            "input_extra",
            f"input_extra={_short(chunks)}: expected a list of {{'filename', 'text'}} objects",
        )
    out = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InvalidArgumentError(
                where, f"{where}={_short(chunk)}: expected an object with a string 'text'"
            )
        unknown = sorted(set(chunk) - {"filename", "text"})
        if unknown:
            raise InvalidArgumentError(
                f"{where}.{unknown[0]}"[:60],
                f"{where}.{_short(unknown[0])}: not a field of an extra chunk (filename, text)",
            )
        name = chunk.get("filename") or ""
        if not isinstance(name, str):
            raise InvalidArgumentError(
                f"{where}.filename", f"{where}.filename={_short(name)}: expected a string"
            )
        out.append((check_text(name, f"{where}.filename"), check_text(chunk["text"], where)))
    return tuple(out)


def _ms(value) -> float:
    """t_max_predict_ms (null, 0 or negative: no limit) -> seconds."""
    if value is None:
        return 0.0
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or value != value:
        raise InvalidArgumentError(
            "t_max_predict_ms",
            f"t_max_predict_ms={_short(value)}: expected milliseconds (a number; 0: no limit)",
        )
    return max(float(value), 0.0) / 1e3


def _check_samplers(samplers, temperature: float) -> None:
    if samplers is None:
        return
    if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
        raise InvalidArgumentError(
            "samplers", f"samplers={_short(samplers)}: expected a list of sampler names"
        )
    other = [s for s in samplers if s not in CHAIN]
    if temperature > 0 and other:
        raise InvalidArgumentError(
            "samplers",
            f"samplers: {_short(other[0])} is not a sampler this server runs when sampling (it "
            f"runs {', '.join(CHAIN)}); leave it out, or send temperature 0 (greedy)",
        )


class InfillReply:
    """llama-server's response bodies for one /infill job."""

    done_marker = False  # llama-server's own endpoints end a stream without `[DONE]`

    def __init__(self, job: Job, model: str, decode=None):
        self.job, self.model, self.decode = job, model, decode
        self.id = f"infill-{uuid.uuid4().hex}"

    def opening(self) -> list[dict]:
        return []

    def chunk(self, piece: str, first: bool = False) -> dict:
        return {"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": 0}

    def whole(self, result, content: str | None = None) -> dict:
        """The whole answer (a warm-up's: nothing, its prompt now cached)."""
        return self.warmup(result) if self.job.warmup else self._whole(result, content)

    def _whole(self, result, content: str | None = None) -> dict:
        s, opts, fim = result.stats, self.job.options, self.job.prompt
        stop_type, word = STOP_TYPE.get(result.finish_reason, "eos"), ""
        if result.finish_reason == "stop" and opts.stop and self.decode is not None:
            full = self.decode(result.token_ids)
            word = next((w for w in opts.stop if w in full[len(result.text) :]), "")
            stop_type = "word" if word else stop_type
        text = result.text if content is None else content
        return {
            "index": 0,
            "content": text,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": len(result.token_ids),
            "tokens_evaluated": s.prompt_tokens,
            "tokens_cached": s.cached_tokens,
            "truncated": False,
            "has_new_line": "\n" in result.text,
            "stop_type": stop_type,
            "stopping_word": word,
            "generation_settings": {
                "n_predict": opts.max_new_tokens,
                "temperature": opts.temperature,
                "top_k": opts.top_k,
                "top_p": opts.top_p,
                "seed": opts.seed,
                "stop": list(opts.stop),
                "n_indent": fim.min_indent,
                "t_max_predict_ms": round(fim.time_limit_s * 1e3),
                "draft": opts.draft,
            },
            "timings": _timings(s, len(result.token_ids)),
            "dflash": extension(result),
        }

    def last_chunks(self, result) -> list[dict]:
        return [self.whole(result, content="")]

    def warmup(self, result=None) -> dict:
        """The answer to `n_predict: 0`: nothing generated (`result`: the run that cached the
        prompt, when `cache_prompt`; its prompt statistics are reported)."""
        from ..runtime.generator import GenerationResult
        from ..runtime.stats import GenerationStats

        s = result.stats if result is not None else GenerationStats()
        stats = GenerationStats(
            prompt_tokens=s.prompt_tokens,
            cached_tokens=s.cached_tokens,
            prefill_s=s.prefill_s,
            finish_reason="length",
        )
        return self._whole(GenerationResult("", [], stats))


def _timings(s, predicted: int) -> dict:
    prompt_ms, predicted_ms = s.prefill_s * 1e3, s.decode_s * 1e3
    # llama-server's prompt_n: the prompt tokens evaluated; cache_n: those its cache served
    evaluated = s.prompt_tokens - s.cached_tokens
    return {
        "cache_n": s.cached_tokens,
        "prompt_n": evaluated,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / max(evaluated, 1), 3),
        "prompt_per_second": round(evaluated / prompt_ms * 1e3, 3) if prompt_ms else 0.0,
        "predicted_n": predicted,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / max(predicted, 1), 3),
        "predicted_per_second": round(predicted / predicted_ms * 1e3, 3) if predicted_ms else 0.0,
    }


def parse(raw: bytes, served: str | None = None, max_context: int = 1 << 24) -> Job:
    """A raw /infill body -> Job (the JSON object first, as protocol.parse)."""
    try:
        return parse_infill(parse_body(raw), served, max_context)
    except RecursionError as err:
        raise InvalidArgumentError(
            "body", "the request body is nested too deeply; send a flat JSON object"
        ) from err
