"""Fill-in-the-middle (FIM): a completion between a prefix and a suffix, in the model's template.

The template is found from the tokenizer's special tokens (`STYLES`, a table: Qwen2.5-Coder first,
then StarCoder and CodeLlama); a model with none of them is refused by name (`require_template`).
Control tokens come only from the template: the prefix, the suffix, the extra files and the typed
start of the middle are encoded as text (`ChatTokenizer.encode`), so a `<|fim_suffix|>` typed in the
code stays characters, as chat message text does.

Layout (`FimTemplate.encode`), as Qwen2.5-Coder documents it and llama-server's /infill builds it:

    [<|repo_name|>REPO\\n  (<|file_sep|>NAME\\nTEXT)*  <|file_sep|>FILE\\n]   extra files, if any
    <|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>MIDDLE-SO-FAR

A style without file separators (CodeLlama) cannot place extra files in the prompt: their tokens
feed only the prompt-lookup drafts (`references`), which is also where the prefix, the suffix and
the files serve as the source of copies.

A middle ends at the model's end-of-text ids and the template's own tokens (`stop_ids`), and, if
asked, at a number of lines or at a line indented less than asked (`text_cut`, llama-server's
`n_indent`), or after a time once a line is complete (llama-server's `t_max_predict_ms`).

>>> STYLES[0].name, STYLES[0].prefix
('qwen', ('<|fim_prefix|>',))
>>> cut = text_cut(FimPrompt("x", max_lines=2))
>>> cut("a\\nb"), cut("a\\nb\\nc")
(None, 3)
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Callable

from .validate import InvalidArgumentError, check_text


@dataclass(frozen=True)
class FimStyle:
    """One family's FIM tokens; each is a tuple of spellings (the first in the vocabulary wins)."""

    name: str
    prefix: tuple[str, ...]
    suffix: tuple[str, ...]
    middle: tuple[str, ...]
    ends: tuple[str, ...]  # tokens that end a middle (besides the model's eos ids), where present
    repo: tuple[str, ...] = ()  # repository-name token (repo context), if the style has one
    file_sep: tuple[str, ...] = ()  # file separator (repo context), if the style has one


STYLES = (
    FimStyle(
        "qwen",
        ("<|fim_prefix|>",),
        ("<|fim_suffix|>",),
        ("<|fim_middle|>",),
        ("<|fim_pad|>", "<|endoftext|>", "<|im_end|>"),
        ("<|repo_name|>",),
        ("<|file_sep|>",),
    ),
    FimStyle(
        "starcoder",
        ("<fim_prefix>",),
        ("<fim_suffix>",),
        ("<fim_middle>",),
        ("<fim_pad>", "<|endoftext|>"),
        ("<reponame>",),
        ("<file_sep>",),
    ),
    FimStyle(
        "codellama",
        ("<PRE>", "▁<PRE>"),
        ("<SUF>", "▁<SUF>"),
        ("<MID>", "▁<MID>"),
        ("<EOT>", "▁<EOT>"),
    ),
)
DEFAULT_REPO, DEFAULT_FILE = "project", "file"  # names in repo context when the caller gives none


@dataclass(frozen=True)
class FimPrompt:
    """What to complete: the text before (`prefix`) and after (`suffix`) the cursor, other files as
    (name, text) pairs (`extra`), and the start of the middle already typed (`middle`).

    Stops beyond the model's own: `max_lines` (0: none) lines at most, the middle ending before its
    N-th newline; `min_indent` (0: none) ends it before a line indented by fewer columns;
    `time_limit_s` (0: none) ends it at the first newline after that many seconds. `label`: the
    field the caller used to ask for a middle (named when the model has no FIM tokens)."""

    prefix: str
    suffix: str = ""
    extra: tuple[tuple[str, str], ...] = ()
    middle: str = ""
    file_name: str = ""
    repo_name: str = ""
    max_lines: int = 0
    min_indent: int = 0
    time_limit_s: float = 0.0
    label: str = "suffix"
    labels: dict = field(default_factory=dict, compare=False)  # field -> the caller's spelling

    def checked(self) -> "FimPrompt":
        """Every field checked (InvalidArgumentError names it as the caller spelled it)."""
        name = lambda k: self.labels.get(k, k)  # noqa: E731
        for k in ("prefix", "suffix", "middle", "file_name", "repo_name"):
            check_text(getattr(self, k), name(k))
        if not isinstance(self.extra, (list, tuple)):
            raise InvalidArgumentError(
                name("extra"), f"{name('extra')}: expected a list of (file name, text) pairs"
            )
        extra = []
        for i, pair in enumerate(self.extra):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise InvalidArgumentError(
                    f"{name('extra')}[{i}]",
                    f"{name('extra')}[{i}]={pair!r:.60}: expected a (file name, text) pair",
                )
            extra.append(
                (check_text(pair[0], f"{name('extra')}[{i}]"), check_text(pair[1], name("extra")))
            )
        for k in ("max_lines", "min_indent"):
            v = getattr(self, k)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 0:
                raise InvalidArgumentError(
                    name(k), f"{name(k)}={v!r:.60}: expected an integer >= 0 (0: no limit)"
                )
        t = self.time_limit_s
        if not isinstance(t, numbers.Real) or isinstance(t, bool) or not 0 <= t < float("inf"):
            raise InvalidArgumentError(
                name("time_limit_s"),
                f"{name('time_limit_s')}={t!r:.60}: expected a finite number >= 0 (0: no limit)",
            )
        return FimPrompt(**{**self.__dict__, "extra": tuple(extra)})

    @property
    def chars(self) -> int:
        """Characters of text in it (for the early too-long check)."""
        return sum(map(len, (self.prefix, self.suffix, self.middle))) + sum(
            len(n) + len(t) for n, t in self.extra
        )


@dataclass(frozen=True)
class FimTemplate:
    """A style resolved against one vocabulary: its token ids."""

    style: str
    prefix: int
    suffix: int
    middle: int
    stop_ids: frozenset[int]  # ends + the template's own tokens
    repo: int | None = None
    file_sep: int | None = None

    def encode(self, tokenizer, fim: FimPrompt) -> tuple[list[int], list[list[int]]]:
        """(prompt ids, reference token runs for prompt lookup only). Text parts are encoded as
        text; control ids come from this template only."""
        enc = tokenizer.encode  # parse_special=False: control strings in the text stay text
        head: list[int] = []
        references = []
        if fim.extra and self.file_sep is not None:
            if self.repo is not None:
                head += [self.repo] + enc(f"{fim.repo_name or DEFAULT_REPO}\n")
            for name, text in fim.extra:
                head += [self.file_sep] + enc(f"{name}\n") + enc(text)
            head += [self.file_sep] + enc(f"{fim.file_name or DEFAULT_FILE}\n")
        elif fim.extra:  # no place for them in this template: drafts only
            references = [enc(text) for _, text in fim.extra]
        ids = [*head, self.prefix, *enc(fim.prefix), self.suffix, *enc(fim.suffix), self.middle]
        return ids + enc(fim.middle), references


def find_template(tokenizer) -> FimTemplate | None:
    """The first style of STYLES whose prefix, suffix and middle tokens are all in the tokenizer's
    vocabulary, resolved to ids; None when none is."""
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)

    def first(spellings) -> int | None:
        return next((vocab[s] for s in spellings if s in vocab), None)

    for style in STYLES:
        ids = [first(getattr(style, k)) for k in ("prefix", "suffix", "middle")]
        if None in ids:
            continue
        repo, sep = first(style.repo), first(style.file_sep)
        ends = {first((s,)) for s in style.ends} | {repo, sep, *ids}
        return FimTemplate(style.name, *ids, frozenset(ends - {None}), repo, sep)
    return None


def require_template(template: FimTemplate | None, model: str, label: str) -> FimTemplate:
    """`template`, or an InvalidArgumentError naming the model and the tokens looked for."""
    if template is None:
        looked = "; ".join(" ".join(s.prefix[:1] + s.suffix[:1] + s.middle[:1]) for s in STYLES)
        raise InvalidArgumentError(
            label,
            f"{label}: the model {model!r} has no fill-in-the-middle tokens in its tokenizer "
            f"(looked for {looked}); serve a code model trained for FIM (e.g. "
            f"Qwen2.5-Coder) or send a plain prompt without a suffix",
        )
    return template


def text_cut(fim: FimPrompt, clock: Callable[[], float] = time.perf_counter):
    """The middle's text stops (max lines, min indent, time) as a function text -> the index to end
    it at, or None to go on; None when the prompt asks for none of them."""
    if not (fim.max_lines or fim.min_indent or fim.time_limit_s):
        return None
    deadline = clock() + fim.time_limit_s if fim.time_limit_s else None

    def cut(text: str) -> int | None:
        if fim.max_lines and text.count("\n") >= fim.max_lines:
            return _nth(text, "\n", fim.max_lines)
        if fim.min_indent:
            start = 0
            while (nl := text.find("\n", start)) >= 0:
                line = text[nl + 1 :].split("\n", 1)
                body = line[0].lstrip(" \t")
                complete = len(line) > 1 or body  # its indentation is known
                if complete and body and len(line[0]) - len(body) < fim.min_indent:
                    return nl
                start = nl + 1
        if deadline is not None and "\n" in text and clock() > deadline:
            return len(text)
        return None

    return cut


def _nth(text: str, sub: str, n: int) -> int:
    i = -1
    for _ in range(n):
        i = text.find(sub, i + 1)
    return i
