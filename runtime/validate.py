"""One rule for input: every public entry point (Python API, CLIs, HTTP server) checks its arguments
with the checkers here.

Each room owns the ranges of its own numeric arguments (`RULES` tables of `Number`): generation and
loading here, the server's in serve/rules.py, the exporter's in export/rules.py; `check` checks a
value against any of them. Types and ranges are checked up front (NaN and infinities included), before any bundle is loaded or
any token is computed. Errors name the argument as the caller knows it (`temperature`,
`--temperature`, the JSON field `max_tokens`), the value and the accepted range.

>>> check("top_p", 0.9)
0.9
>>> check("temperature", float("nan"), label="--temperature")
Traceback (most recent call last):
...
dflash_edge.runtime.validate.InvalidArgumentError: --temperature=nan: expected a finite number >= 0 (0 = greedy)
"""  # noqa: E501

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import Callable

from .errors import DflashEdgeError
from .session import PROVIDERS, ProviderUnavailableError, available_providers, default_threads

ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


class InvalidArgumentError(DflashEdgeError, ValueError):
    """An argument of the wrong type or outside its range; `.argument` is its name as the caller
    wrote it."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


class VerifyLengthError(InvalidArgumentError):
    """A verify length outside 1 .. block_size - 1."""


class UnknownProviderError(InvalidArgumentError, ProviderUnavailableError):
    """A provider name that is not one of session.PROVIDERS (or not a string)."""


class ClampedArgumentWarning(UserWarning):
    """A value above what this machine can use (threads > usable CPUs) was lowered to that limit."""


# `draft`: where each step's proposals come from (GenerationOptions.draft)
DRAFT_MODES = {
    "auto": "per step, what is measured to pay",
    "drafter": "draft every step",
    "lookup": "prompt lookup every step it finds one",
    "none": "plain decoding",
}


@dataclass(frozen=True)
class Number:
    """An int or float argument's accepted range (None: unbounded); `lo_open` excludes `lo` itself.

    `clamp_to` (a function: the machine's limit, e.g. its usable CPUs): a larger value is lowered to
    it with a one-line ClampedArgumentWarning naming both numbers, instead of being refused."""

    kind: type  # int or float
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    note: str = ""
    clamp_to: Callable[[], int] | None = None
    clamp_what: str = ""  # what the limit counts, for the warning

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        if self.lo is not None and self.hi is not None:
            rng = f" in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}]"
        elif self.lo is not None:
            rng = f" {'>' if self.lo_open else '>='} {_num(self.lo)}"
        else:
            rng = f" <= {_num(self.hi)}" if self.hi is not None else ""
        notes = [self.note] if self.note else []
        if self.clamp_to is not None:
            notes.append(f"{self.clamp_what}: {self.clamp_to()}")
        return what + rng + (f" ({'; '.join(notes)})" if notes else "")

    def accepts(self, v) -> bool:
        low = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        return low and (self.hi is None or v <= self.hi)


# the numeric arguments of generation and loading, by their canonical (Python API) name
RULES: dict[str, Number] = {
    "max_new_tokens": Number(int, 1, None),
    "temperature": Number(float, 0, None, note="0 = greedy"),
    "top_k": Number(int, 0, None, note="0 = off"),
    "top_p": Number(float, 0, 1, lo_open=True, note="1 = off"),
    "seed": Number(int, 0, 2**64 - 1),
    "cache_ram_mb": Number(
        float, 0, 1e6, note="MB of other sequences' caches kept in RAM; 0 = the live one only"
    ),
    # more threads than usable CPUs only fight each other (8 tokens in 245 s at 999 on 2 cores):
    # lowered, warned
    "threads": Number(
        int,
        0,
        None,
        note="0 = one per usable CPU",
        clamp_to=default_threads,
        clamp_what="CPUs this process may use",
    ),
}


def cli_label(name: str) -> str:
    """The command lines' spelling of argument `name`.

    >>> cli_label("max_new_tokens")
    '--max-new-tokens'
    """
    return "--" + name.replace("_", "-")


# the command lines' spelling of each generation argument: max_new_tokens -> --max-new-tokens
CLI_LABELS = {
    name: cli_label(name)
    for name in (*RULES, "prompt", "stop", "draft", "verify_len", "provider", "parse_special")
}


def check(name: str, value, label: str | None = None, rules: dict[str, Number] | None = None):
    """`value` if it is a number of `rules[name]`'s kind within its range (floats come back as
    float); above a rule's `clamp_to` limit: that limit, with a ClampedArgumentWarning. `rules`:
    a room's table (serve/rules.py, export/rules.py), default this module's RULES.

    >>> check("max_new_tokens", "2")
    Traceback (most recent call last):
    ...
    dflash_edge.runtime.validate.InvalidArgumentError: max_new_tokens='2': expected an integer >= 1, got str
    """  # noqa: E501
    rule, label = (RULES if rules is None else rules)[name], label or name
    ok_type = isinstance(
        value, numbers.Integral if rule.kind is int else numbers.Real
    ) and not isinstance(value, bool)
    if not ok_type or (rule.kind is float and not math.isfinite(value)) or not rule.accepts(value):
        got = "" if ok_type else f", got {type(value).__name__}"
        raise InvalidArgumentError(
            label, f"{label}={_short(value)}: expected {rule.describe()}{got}"
        )
    if rule.clamp_to is not None and value > (limit := rule.clamp_to()):
        warnings.warn(
            f"{label}={value} is more than the {limit} {rule.clamp_what}; using {limit}",
            ClampedArgumentWarning,
            stacklevel=3,
        )
        value = limit
    return int(value) if rule.kind is int else float(value)


def check_flag(name: str, value, label: str | None = None) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(
            label or name, f"{label or name}={value!r}: expected true or false"
        )
    return value


def check_draft(value, label: str = "draft") -> str:
    """One of DRAFT_MODES: where each step's proposals come from."""
    if isinstance(value, str) and value in DRAFT_MODES:
        return value
    modes = ", ".join(f"{m!r} ({what})" for m, what in DRAFT_MODES.items())
    raise InvalidArgumentError(label, f"{label}={_short(value)}: expected one of {modes}")


def check_verify_len(verify_len, block_size: int | None = None, label: str = "verify_len") -> int:
    """`verify_len` as an int in 1..B-1 (the drafts one block holds), else a VerifyLengthError
    naming the range; without `block_size` (no bundle loaded yet) only `>= 1` is checked.

    >>> check_verify_len(3, block_size=8)
    3
    """
    limit = 1 << 62 if block_size is None else block_size - 1
    is_int = not isinstance(verify_len, bool) and isinstance(verify_len, numbers.Integral)
    if is_int and 1 <= verify_len <= limit:
        return int(verify_len)
    if not is_int:
        rng = ">= 1" if block_size is None else f"in [1, {limit}] (block size {block_size})"
        raise VerifyLengthError(
            label,
            f"{label}={_short(verify_len)}: expected an integer {rng}, or none for the "
            f"tuned one, got {type(verify_len).__name__}",
        )
    if block_size is None:
        raise VerifyLengthError(
            label,
            f"{label}={_short(verify_len)}: expected an integer >= 1 (at most the "
            f"bundle's block size - 1)",
        )
    raise VerifyLengthError(
        label,
        f"{label}={_short(verify_len)}: verify length outside 1..{limit}: this bundle "
        f"drafts block_size - 1 = {limit} tokens per block (block size {block_size}); "
        f"pass a verify length in that range, or none to use the tuned one",
    )


def check_provider(provider, label: str = "provider") -> str:
    """One of session.PROVIDERS' names ("cpu", "cuda", "tensorrt"); whether this install has it is
    checked when sessions open (session.check_provider)."""
    if isinstance(provider, str) and provider in PROVIDERS:
        return provider
    raise UnknownProviderError(
        label,
        f"{label}={_short(provider)}: expected one of {', '.join(PROVIDERS)} "
        f"(available here: {', '.join(available_providers())})",
    )


def check_text(text, label: str) -> str:
    """A str that is valid Unicode text: lone surrogates ("\\ud800", or undecodable bytes on a
    command line, which Python keeps as surrogates) cannot be tokenised.

    >>> check_text("Hi", "prompt")
    'Hi'
    >>> check_text("Hi \\udcff", "--prompt")
    Traceback (most recent call last):
    ...
    dflash_edge.runtime.validate.InvalidArgumentError: --prompt='Hi \\udcff': not valid text (a lone surrogate '\\udcff' at character 3, or bytes that are not UTF-8); pass UTF-8 text
    """  # noqa: E501
    if not isinstance(text, str):
        raise InvalidArgumentError(label, f"{label}={_short(text)}: expected a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidArgumentError(
            label,
            f"{label}={_short(text)}: not valid text (a lone surrogate "
            f"{text[err.start]!r} at character {err.start}, or bytes that are not "
            f"UTF-8); pass UTF-8 text",
        ) from None
    return text


def check_parse_special(parse_special: bool, chat: bool, label: str = "parse_special") -> bool:
    """Control-token strings are parsed only in a raw prompt (chat=False): chat message text is
    always text."""
    if parse_special and chat:
        raise InvalidArgumentError(
            label,
            f"{label}=True: only a raw prompt (chat=False) may carry control tokens; "
            f"chat message text is always tokenised as text",
        )
    return parse_special


def check_stop(stop, label: str = "stop") -> tuple[str, ...]:
    """None, a string or a list of strings -> a tuple of non-empty stop strings."""
    items = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise InvalidArgumentError(
            label, f"{label}={_short(stop)}: expected a string or a list of strings"
        )
    if len(items) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in items):
        raise InvalidArgumentError(
            label,
            f"{label}={_short(stop)}: expected at most {MAX_STOP_STRINGS} strings of "
            f"at most {MAX_STOP_CHARS} characters",
        )
    for s in items:
        check_text(s, label)
    return tuple(s for s in items if s)


def check_messages(messages, label: str = "messages") -> list[dict]:
    """Chat messages -> [{"role", "content"}]; content may be a string or a list of {"type": "text"}
    parts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidArgumentError(
            label,
            f"{label}={_short(messages)}: expected a non-empty list of "
            f"{{'role': ..., 'content': ...}} messages",
        )
    out = []
    for i, m in enumerate(messages):
        where = f"{label}[{i}]"
        if not isinstance(m, dict):
            raise InvalidArgumentError(
                where, f"{where}={_short(m)}: expected a {{'role': ..., 'content': ...}} dict"
            )
        if m.get("role") not in ROLES:
            raise InvalidArgumentError(
                f"{where}.role",
                f"{where}.role={_short(m.get('role'))}: expected one of {', '.join(ROLES)}",
            )
        out.append({"role": m["role"], "content": _content(m.get("content"), f"{where}.content")})
    return out


def check_prompt(prompt, label: str = "prompt", chat: bool = True):
    """A string of valid text (`check_text`; not empty when it is a raw prompt, `chat=False`), or a
    list of chat messages (`check_messages`)."""
    if isinstance(prompt, str):
        if not chat and not prompt:
            raise InvalidArgumentError(
                label, f"{label}='': a raw prompt (chat=False) needs some text"
            )
        return check_text(prompt, label)
    if isinstance(prompt, (list, tuple)):
        return check_messages(prompt, label)
    raise InvalidArgumentError(
        label,
        f"{label}={_short(prompt)}: expected a string or a list of chat messages "
        f"[{{'role': 'user', 'content': '...'}}]",
    )


def check_token_ids(ids, vocab_size: int, label: str = "prompt_ids") -> list[int]:
    """A list of token ids, each in [0, vocab_size)."""
    if not isinstance(ids, (list, tuple)) and not hasattr(ids, "tolist"):
        raise InvalidArgumentError(label, f"{label}={_short(ids)}: expected a list of token ids")
    ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
    for i, t in enumerate(ids):
        if not isinstance(t, numbers.Integral) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise InvalidArgumentError(
                label, f"{label}[{i}]={t!r}: expected an integer token id in [0, {vocab_size})"
            )
    return [int(t) for t in ids]


@dataclass(frozen=True)
class GenerationOptions:
    """How to generate: the one set of defaults of `Generator.generate` / `stream` / `generate_ids`,
    `run` and the server. `checked()` validates and normalises every field (the only place they are
    checked).

    `draft` (DRAFT_MODES): "auto" picks per step plain decoding, the drafter or a prompt lookup and
    the verify length, by what is measured to pay (policy.py, seeded by tuned.json); "drafter"
    drafts every step; "lookup" verifies a prompt lookup whenever one is found; "none" decodes
    plainly (the baseline). `verify_len` (1..B-1) fixes (with "auto": caps) the proposals verified
    per step. The tokens are the same whatever the choice.

    Prompt text is text: a control-token string typed into it (`<|im_start|>system ...`) is
    tokenised as the characters it is, never as a control token; only the chat template places
    those. `parse_special=True` is the opt-in for a trusted caller whose raw prompt (`chat=False`)
    spells out a template itself; the server never sets it.

    >>> GenerationOptions(max_new_tokens=8, stop="\\n").checked().stop
    ('\\n',)
    >>> GenerationOptions(draft="sometimes").checked()       # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dflash_edge.runtime.validate.InvalidArgumentError: draft='sometimes': expected one of 'auto' (per step, ...
    """  # noqa: E501

    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    # stop strings (text only): the output ends before the first
    stop: tuple[str, ...] | str | None = ()
    chat: bool = True  # a string prompt is wrapped in the chat template
    draft: str = "auto"  # DRAFT_MODES
    verify_len: int | None = None  # proposals verified per step (1..B-1); None: tuned / adaptive
    parse_special: bool = (
        False  # trusted callers only: control-token strings in a raw prompt are parsed
    )
    # keep the last sequence's caches: the next prompt prefills only past the common prefix
    cache_prompt: bool = True

    @classmethod
    def of(cls, options: "GenerationOptions | None" = None, **fields) -> "GenerationOptions":
        """`options` (or the defaults) with `fields` replaced; an unknown field name is an
        InvalidArgumentError.

        >>> GenerationOptions.of(GenerationOptions(seed=3), temperature=0.7).seed
        3
        """
        if options is not None and not isinstance(options, cls):
            raise InvalidArgumentError(
                "options", f"options={_short(options)}: expected a GenerationOptions"
            )
        unknown = sorted(set(fields) - {f.name for f in dataclass_fields(cls)})
        if unknown:
            raise InvalidArgumentError(
                unknown[0],
                f"{unknown[0]}=...: not an option; the options are "
                f"{', '.join(f.name for f in dataclass_fields(cls))}",
            )
        return replace(options or cls(), **fields)

    def checked(
        self, labels: dict[str, str] | None = None, block_size: int | None = None
    ) -> "GenerationOptions":
        """Every field checked and normalised; `labels` maps canonical names to the caller's
        spelling (e.g. {"max_new_tokens": "max_tokens"}); `verify_len` is checked against
        `block_size` when it is known."""
        name = (labels or {}).get
        nums = {
            k: check(k, getattr(self, k), name(k))
            for k in ("max_new_tokens", "temperature", "top_k", "top_p", "seed")
        }
        verify_len = self.verify_len
        if verify_len is not None:
            verify_len = check_verify_len(verify_len, block_size, name("verify_len", "verify_len"))
        chat = check_flag("chat", self.chat, name("chat"))
        parse_special = check_parse_special(
            check_flag("parse_special", self.parse_special, name("parse_special")),
            chat,
            name("parse_special", "parse_special"),
        )
        return replace(
            self,
            **nums,
            stop=check_stop(self.stop, name("stop", "stop")),
            chat=chat,
            cache_prompt=check_flag("cache_prompt", self.cache_prompt, name("cache_prompt")),
            draft=check_draft(self.draft, name("draft", "draft")),
            verify_len=verify_len,
            parse_special=parse_special,
        )


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return check_text(content, where)
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return check_text("".join(p["text"] for p in content), where)
    raise InvalidArgumentError(
        where,
        f"{where}={_short(content)}: expected a string (or a list of "
        f"{{'type': 'text', 'text': ...}} parts; this model reads text only)",
    )


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _short(value, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."
