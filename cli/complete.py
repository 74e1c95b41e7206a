"""`dflash-edge complete BUNDLE FILE --line L [--column C]`: fill in the code at a cursor.

The text before the cursor is the prefix, the rest the suffix; `--extra` files are the repo context
(runtime/fim.py). The middle goes to stdout (stats to stderr); `--output FILE` writes the whole file
with it inserted (written to a temporary file and renamed, so never half-written).

    dflash-edge complete bundle/ app.py --line 12 --column 5 --extra lib.py --max-lines 3
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from ..runtime.errors import DflashEdgeError
from ..runtime.validate import CLI_LABELS, DRAFT_MODES, GenerationOptions
from .common import add_provider_arg, add_thread_args


def add_arguments(p) -> None:
    p.add_argument(
        "bundle", help="bundle directory of a model with FIM tokens (e.g. Qwen2.5-Coder)"
    )
    p.add_argument("file", help="the source file to complete (UTF-8 text)")
    p.add_argument("--line", type=int, required=True, help="the cursor's line, from 1")
    p.add_argument(
        "--column",
        type=int,
        default=None,
        help="the cursor's column in characters, from 1 (default: the end of the line)",
    )
    p.add_argument(
        "--extra", action="append", default=[], help="another file as repo context (repeatable)"
    )
    p.add_argument("--max-lines", type=int, default=0, help="lines the middle may hold (0: any)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--draft",
        choices=list(DRAFT_MODES),
        default="auto",
        help="where proposals come from: " + "; ".join(f"{m}: {w}" for m, w in DRAFT_MODES.items()),
    )
    p.add_argument("--output", default=None, help="write the completed file here")
    add_provider_arg(p)
    add_thread_args(p)


def split_at(text: str, line: int, column: int | None, name: str) -> tuple[str, str]:
    """(prefix, suffix) of `text` at a 1-based line and column (None: the end of the line).

    >>> split_at("ab\\ncd\\n", 2, 2, "f")
    ('ab\\nc', 'd\\n')
    """
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise DflashEdgeError(
            f"--line {line}: {name} has lines 1..{len(lines)}; pass a line in that range"
        )
    here = lines[line - 1]
    column = len(here) + 1 if column is None else column
    if not 1 <= column <= len(here) + 1:
        raise DflashEdgeError(
            f"--column {column}: line {line} of {name} has {len(here)} characters; pass a column "
            f"in 1..{len(here) + 1}"
        )
    offset = sum(len(s) + 1 for s in lines[: line - 1]) + column - 1
    return text[:offset], text[offset:]


def read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DflashEdgeError(
            f"{flag} {path}: cannot be read as UTF-8 text ({err}); pass a text file"
        ) from None


def run(args) -> int:
    from ..runtime.fim import FimPrompt
    from ..runtime.generator import Generator
    from .run import summary

    text = read_text(args.file, "FILE")
    prefix, suffix = split_at(text, args.line, args.column, args.file)
    extra = tuple((Path(f).name, read_text(f, "--extra")) for f in args.extra)
    # before loading
    fim = FimPrompt(
        prefix,
        suffix,
        extra,
        file_name=Path(args.file).name,
        max_lines=args.max_lines,
        label="BUNDLE",
        labels={"extra": "--extra", "max_lines": "--max-lines"},
    ).checked()
    options = GenerationOptions(
        args.max_new_tokens, args.temperature, seed=args.seed, draft=args.draft
    ).checked(CLI_LABELS)
    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin)
    stream = gen.stream(fim, options)
    pieces = []
    for piece in stream:
        pieces.append(piece)
        if args.output is None:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if args.output is None:
        sys.stdout.write("\n")
    else:
        _write(args.output, prefix + "".join(pieces) + suffix)
    print(summary(stream.result.stats, gen, args.provider, args.threads), file=sys.stderr)
    return 0


def _write(path: str, text: str) -> None:
    """`text` to `path` through a temporary file in the same folder, renamed over it."""
    folder = Path(path).resolve().parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".complete-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
