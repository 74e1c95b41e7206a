"""Write docs/cli.md from the verbs' own `--help`: `python -m dflash_edge.cli.docs > docs/cli.md`.

Each verb's argparse help goes in a code block under its heading. The text width is fixed (WIDTH),
so the page does not depend on the terminal. tests/test_cli_docs.py keeps the file current.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import COMMANDS, _parser

WIDTH = 100
COMMAND = "python -m dflash_edge.cli.docs > docs/cli.md"


def _fixed_width(cls: type) -> type:
    """`cls` (an argparse formatter) with the width pinned to WIDTH."""

    class Fixed(cls):
        def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
            super().__init__(prog, indent_increment, max_help_position, width=WIDTH)

    return Fixed


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = _fixed_width(parser.formatter_class)
    return parser.format_help().rstrip() + "\n"


def _section(title: str, parser: argparse.ArgumentParser) -> list[str]:
    return [f"## `{title}`", "", "```text", _help(parser).rstrip(), "```", ""]


def render() -> str:
    """The whole of docs/cli.md."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)  # for a formatter that asks the terminal
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    try:
        top = _parser(None)
        lines = [
            "# Command line",
            "",
            "Every verb's `--help`, generated; do not edit by hand. Regenerate with:",
            "",
            f"```bash\n{COMMAND}\n```",
            "",
            f"(argparse of Python {version}; other versions word the help slightly differently.)",
            "",
        ]
        lines += _section("dflash-edge", top)
        for name in COMMANDS:
            verb = _subparsers(_parser(name))[name]
            lines += _section(f"dflash-edge {name}", verb)
            for sub, nested in _subparsers(verb).items():
                lines += _section(f"dflash-edge {name} {sub}", nested)
        return "\n".join(lines)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


if __name__ == "__main__":
    sys.stdout.write(render())
