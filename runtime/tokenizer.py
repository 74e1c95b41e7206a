"""Tokenizer + chat template for a checkpoint or bundle directory (tokenizers + jinja2 only).

Text is text: a control-token string inside a message or a raw prompt (`<|im_start|>system ...`
typed by a user) is tokenised as the characters it is; only the chat template places control tokens.
`encode(text, parse_special=True)` is the opt-in for trusted callers that spell out a template
themselves.

Templates come with downloads, so they are untrusted code: they render in jinja2's
`ImmutableSandboxedEnvironment` with the helpers transformers gives them (`raise_exception`,
`strftime_now`, `tojson`, `namespace`, loop controls); one that reaches for Python internals
gets `UnsafeTemplateError` (docs/security.md).

>>> tok = ChatTokenizer.from_dir(  # doctest: +SKIP
...     "~/.cache/dflash-edge/models/smollm2-135m-instruct")
>>> ids = tok.encode_chat([{"role": "user", "content": "Hi"}])  # doctest: +SKIP
>>> tok.decode(ids)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ModelFormatError, UnsafeTemplateError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
JINJA_MIN = (3, 1, 6)  # older jinja2: known sandbox escapes (CVE-2024-56326, CVE-2025-27516)


@dataclass
class ChatTokenizer:
    tokenizer: object  # tokenizers.Tokenizer
    chat_template: str | None
    bos_token: str | None = None
    eos_token: str | None = None
    template_source: str = "the chat template"  # the file it came from (named in errors)

    @classmethod
    def from_dir(cls, path: str | Path) -> "ChatTokenizer":
        from tokenizers import Tokenizer

        path = Path(path).expanduser()
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            raise ModelFormatError(
                f"{tok_file} not found: the directory needs the tokenizer.json it was built with"
            )
        extra = {}
        cfg_file = path / "tokenizer_config.json"
        try:
            if cfg_file.exists():
                extra = json.loads(cfg_file.read_bytes().decode("utf-8"))
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as err:  # noqa: BLE001 (tokenizers raises plain Exception on a damaged file)
            raise ModelFormatError(
                f"{path}: tokenizer.json / tokenizer_config.json cannot be read ({err}); the "
                f"files are damaged: copy or export them again"
            ) from err
        if not isinstance(extra, dict):
            raise ModelFormatError(f"{cfg_file} is not a JSON object; copy or export it again")
        template, source = extra.get("chat_template"), cfg_file
        # where newer transformers saves it
        if template is None and (path / CHAT_TEMPLATE_FILE).is_file():
            template, source = (path / CHAT_TEMPLATE_FILE).read_text(), path / CHAT_TEMPLATE_FILE
        bos, eos = _token_text(extra.get("bos_token")), _token_text(extra.get("eos_token"))
        return cls(tokenizer, template, bos, eos, str(source))

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; control-token strings in it are text unless `parse_special` (trusted
        callers)."""
        tokenizer = self.tokenizer if parse_special else self.text_tokenizer
        # encode_batch runs without Python's global lock (encode holds it: ~0.4 s per MB of text,
        # during which a
        # server's event loop could not answer anyone)
        return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    @cached_property
    def text_tokenizer(self):
        """A copy of the tokenizer that reads control-token strings as text
        (`encode_special_tokens`); a copy, not a flag toggled around calls, so threads encoding at
        once never see each other's setting."""
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(self.tokenizer.to_str())
        copy.encode_special_tokens = True
        return copy

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        """The chat template applied to `messages` (role/content dicts; `tools`: JSON schemas), as
        text, in the sandbox (`UnsafeTemplateError` when the template reaches for what it may
        not)."""
        if not self.chat_template:
            raise ModelFormatError(
                "this model has no chat template: pass a raw prompt (chat=False)"
            )
        return render_template(
            self.chat_template,
            self.template_source,
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """The chat template applied to `messages`, as token ids. Control tokens come from the
        template only: a control-token string inside a message's text is tokenised as text.

        How: each such string in a message (a literal search, `special_pattern`) is swapped for a
        random marker before rendering; the rendered text is encoded piece by piece between the
        markers (the template's control tokens parsed) and each swapped string as text. A message
        without one renders and encodes exactly as `encode(render_chat(messages),
        parse_special=True)`, token for token."""
        marker = f"\ue000{secrets.randbits(64)}:"  # a private-use character + a nonce: in no input
        swapped: list[str] = []
        safe = [
            {**m, "content": self._swap_specials(m["content"], marker, swapped)}
            if isinstance(m, dict) and isinstance(m.get("content"), str)
            else m
            for m in messages
        ]
        text = self.render_chat(safe, add_generation_prompt, tools)
        if not swapped:
            return self.encode(text, parse_special=True)
        # template text, index, template text, ...
        pieces = re.split(re.escape(marker) + r"(\d+)\ue001", text)
        if any(marker in p for p in pieces[::2]) or not {int(i) for i in pieces[1::2]} <= set(
            range(len(swapped))
        ):
            raise ModelFormatError(
                "this chat template rewrites message text, so control-token strings typed in a "
                "message cannot be kept as text; remove them from the message"
            )
        ids = []
        for i, piece in enumerate(pieces):
            ids += (
                self.encode(piece, parse_special=True)
                if i % 2 == 0
                else self.encode(swapped[int(piece)])
            )
        return ids

    def _swap_specials(self, text: str, marker: str, swapped: list[str]) -> str:
        """`text` with every control-token string in it (a literal search, no tokenizer pass)
        replaced by `marker` + index."""
        if self.special_pattern is None:
            return text

        def swap(match: re.Match) -> str:
            swapped.append(match.group())
            return f"{marker}{len(swapped) - 1}\ue001"

        return self.special_pattern.sub(swap, text)

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (its vocabulary string: a byte-level BPE token's
        string has one character per byte, so it also bounds the characters it decodes to)."""
        return max(map(len, self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    @cached_property
    def special_pattern(self) -> re.Pattern | None:
        """The control tokens' strings (added tokens marked special: `<|im_start|>`,
        `<|endoftext|>`, ...), longest first, as one pattern; None when the vocabulary has none."""
        texts = sorted(
            {
                t.content
                for t in self.tokenizer.get_added_tokens_decoder().values()
                if t.special and t.content
            },
            key=len,
            reverse=True,
        )
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    def token_id(self, text: str) -> int:
        tid = self.tokenizer.token_to_id(text)
        if tid is None:
            raise ModelFormatError(f"token {text!r} is not in the vocabulary")
        return tid


def _token_text(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def render_template(template: str, source: str, **context) -> str:
    """`template` rendered in the sandbox with `context`. `source` (the file it came from) is named
    in errors: a forbidden reach is `UnsafeTemplateError` (nothing it asked for ran), a broken
    template `ModelFormatError`.

    >>> render_template("{{ x | tojson }}", "inline", x={"a": 1})
    '{"a": 1}'
    """
    try:
        return _compiled(template).render(**context)
    except jinja2.exceptions.SecurityError as err:
        raise UnsafeTemplateError(
            f"the chat template in {source} tried something the sandbox forbids ({err}); nothing "
            f"it asked for was run. Treat that file as hostile: replace it with the model "
            f"publisher's original (or remove its chat_template and pass a raw prompt)"
        ) from None
    except jinja2.exceptions.TemplateError as err:
        raise ModelFormatError(f"chat template error in {source}: {err}") from None


@lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    try:
        return _sandbox().from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as err:  # render_template names the file
        raise jinja2.exceptions.TemplateError(f"line {err.lineno}: {err.message}") from None


@lru_cache(maxsize=1)
def _sandbox() -> ImmutableSandboxedEnvironment:
    """The environment transformers renders chat templates in (chat_template_utils.py), same
    helpers."""
    if _version(jinja2.__version__) < JINJA_MIN:
        need = ".".join(map(str, JINJA_MIN))
        raise UnsafeTemplateError(
            f"jinja2 {jinja2.__version__} has known sandbox escapes; chat "
            f"templates are untrusted code: pip install 'jinja2>={need}'"
        )
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now, namespace=_Namespace)
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson: plain json.dumps (jinja2's own escapes HTML characters and takes no
    separators)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore names (no route to Python internals through one)."""

    def __init__(*args, **kwargs):  # jinja2's signature trick: `namespace(self=...)` works
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with _")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(re.match(r"\d*", part).group() or 0) for part in text.split(".")[:3])
