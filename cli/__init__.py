"""`dflash-edge` command line: one module per verb in this package (argument parsing, printing,
chaining).

A subcommand is declared as data (name -> module of this package + help); the module is imported
only when that subcommand runs, so `dflash-edge --help` is instant. Each module has
`add_arguments(parser)` and `run(args)`; the work itself lives in the rooms below (export/,
quantize/, runtime/, ...)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import sys
import warnings

from ..devices.errors import DeviceError, MeterError
from ..export.rules import RULES as EXPORT_RULES
from ..runtime.errors import DflashEdgeError
from ..runtime.validate import RULES, Number, check, cli_label

# the numeric options several verbs share, by canonical name: the rooms' tables (runtime, export)
# and the command lines' own (bench and eval-drafter's --limit). A verb whose options have rules
# of their own names that table `NUMBERS` in its module (cli/serve.py: serve/rules.py's), so no
# other verb imports that room.
NUMBERS: dict[str, Number] = {
    **RULES,
    **EXPORT_RULES,
    "limit": Number(int, 0, None, note="0 = all"),
}

# errors printed as one line (exit 2) instead of a traceback
USER_ERRORS = (DflashEdgeError, DeviceError, MeterError)

# name -> (module of dflash_edge.cli with `add_arguments(parser)` and `run(args)`, one-line help)
COMMANDS = {
    "fetch": ("fetch", "obtain the default model (or import a GGUF) into the cache"),
    "generate": ("generate", "generate with the torch reference speculative loop"),
    "export": ("export", "export target + drafter to an ONNX bundle"),
    "quantize": ("quantize", "bundle -> its model re-exported at another precision + quality"),
    "build-engines": ("build_engines", "build a bundle's TensorRT engines ahead of its first run"),
    "run": ("run", "generate from a bundle with the speculative runtime (streams text)"),
    "complete": ("complete", "fill in the code at a cursor in a file (fill-in-the-middle)"),
    "bench": ("bench", "speculative vs autoregressive tokens/s on a prompt set, lossless check"),
    "tune": ("tune", "measure this machine and store the best verify length in the bundle"),
    "devices": ("devices", "device profiles (detected one marked); `devices plan`: fit and speed"),
    "serve": ("serve", "OpenAI-compatible HTTP server over a bundle (loopback by default)"),
    "train": ("train", "distil a DFlash drafter for a target (prompts -> responses -> training)"),
    "eval-drafter": ("eval_drafter", "measure a drafter's acceptance length on held-out prompts"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv[:1] and argv[0] in COMMANDS else None
    try:
        # imports the verb's module: a missing extra is named below, even for --help
        parser = _parser(command)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        with warnings.catch_warnings():  # clamped arguments: one line each, like errors
            from ..runtime.validate import ClampedArgumentWarning

            warnings.simplefilter("always", ClampedArgumentWarning)
            warnings.showwarning = _one_line_warnings(
                command, warnings.showwarning, ClampedArgumentWarning
            )
            module = importlib.import_module(args._module)
            _check_numbers(args, {**NUMBERS, **getattr(module, "NUMBERS", {})})
            return module.run(args) or 0
    except USER_ERRORS as err:
        print(f"dflash-edge {command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # a lighter install than the command needs: name the extra
        extra = _extra_providing(err.name or "", prefer=(command or "").replace("-", "_"))
        if extra is None:
            raise
        print(
            f"dflash-edge {command}: error: this command needs the package {err.name!r}, which is "
            "not "
            f'installed here; install the {extra!r} extra: pip install "dflash-edge[{extra}]"',
            file=sys.stderr,
        )
        return 2


def _parser(command: str | None) -> argparse.ArgumentParser:
    """The parser with every subcommand listed; only `command`'s module is imported (for its
    arguments)."""
    parser = argparse.ArgumentParser(
        prog="dflash-edge", description="DFlash speculative decoding for edge devices."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=f"{__name__}.{module}")
        if name == command:
            importlib.import_module(f"{__name__}.{module}").add_arguments(p)
    return parser


def _one_line_warnings(command: str | None, show, category):
    """warnings.showwarning that prints `category` as `dflash-edge CMD: warning: ...` and others as
    `show` does."""

    def one_line(message, cat, filename, lineno, file=None, line=None):
        if issubclass(cat, category):
            print(f"dflash-edge {command}: warning: {message}", file=sys.stderr)
        else:
            show(message, cat, filename, lineno, file, line)

    return one_line


def _check_numbers(args, numbers: dict[str, Number]) -> None:
    """The subcommand's numeric options with a rule in `numbers`, checked (and normalised: a thread
    count above the usable CPUs is lowered to them) before anything loads."""

    for name in numbers:
        if getattr(args, name, None) is not None:
            setattr(args, name, check(name, getattr(args, name), cli_label(name), numbers))


def _extra_providing(module: str, prefer: str = "") -> str | None:
    """The optional extra of our package metadata (pyproject) that installs `module`: `prefer` (the
    command's own extra, e.g. train -> [export] -> torch) when it does, else the first that lists
    it; None if none does."""

    top = module.split(".")[0].lower()
    try:
        requires = importlib.metadata.requires("dflash-edge") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    direct: dict[str, list[str]] = {}  # extra -> the requirements it lists (nested extras too)
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[\w,-]+\])?.*extra\s*==\s*[\"']([\w-]+)[\"']", req)
        if m:
            name = m.group(1).lower().replace("-", "_")
            nested = (
                [f"[{e}]" for e in (m.group(2) or "[]")[1:-1].split(",") if e]
                if name == "dflash_edge"
                else []
            )
            direct.setdefault(m.group(3), []).extend(nested or [name])

    def provides(extra: str, seen: frozenset = frozenset()) -> bool:
        items = direct.get(extra, [])
        return top in items or any(
            provides(i[1:-1], seen | {extra})
            for i in items
            if i.startswith("[") and i[1:-1] not in seen
        )

    if prefer in direct and provides(prefer):
        return prefer
    return next((extra for extra, items in direct.items() if top in items), None)
