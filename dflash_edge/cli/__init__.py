"""`dflash-edge` command line: one module per verb in this package (argument parsing, printing, chaining).

A subcommand is declared as data (name -> module of this package + help); the module is imported only
when that subcommand runs, so `dflash-edge --help` is instant. Each module has `add_arguments(parser)`
and `run(args)`; the work itself lives in the rooms below (export/, quantize/, runtime/, ...).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from dflash_edge.devices.errors import DeviceError, MeterError
from dflash_edge.runtime.errors import DflashEdgeError

# errors printed as one line (exit 2) instead of a traceback
USER_ERRORS = (DflashEdgeError, DeviceError, MeterError)

# name -> (module of dflash_edge.cli with `add_arguments(parser)` and `run(args)`, one-line help)
COMMANDS = {
    "fetch": ("fetch", "obtain the default model (or import a GGUF) into the cache"),
    "generate": ("generate", "generate with the torch reference speculative loop"),
    "export": ("export", "export target + drafter to an ONNX bundle"),
    "quantize": ("quantize", "fp32 bundle -> int4/int8/fp16 bundle with a quality report"),
    "build-engines": ("build_engines", "build TensorRT engines for a bundle (needs TensorRT)"),
    "run": ("run", "generate from a bundle with the speculative runtime (streams text)"),
    "bench": ("bench", "speculative vs autoregressive tokens/s on a prompt set, lossless check"),
    "tune": ("tune", "measure this machine and store the best verify length in the bundle"),
    "devices": ("devices", "device profiles (detected one marked); `devices plan`: fit and speed"),
    "serve": ("serve", "OpenAI-compatible HTTP server over a bundle (loopback by default)"),
    "train": ("train", "distil a DFlash drafter for a target (prompts -> responses -> training)"),
    "eval-drafter": ("eval_drafter", "measure a drafter's acceptance length on held-out prompts"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="dflash-edge", description="DFlash speculative decoding for edge devices.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=f"{__name__}.{module}")
        if argv[:1] == [name]:
            importlib.import_module(f"{__name__}.{module}").add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        _check_numbers(args)
        return importlib.import_module(args._module).run(args) or 0
    except USER_ERRORS as err:
        print(f"dflash-edge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:             # a lighter install than the command needs: name the extra
        extra = _extra_providing(err.name or "")
        if extra is None:
            raise
        print(f"dflash-edge {args.command}: error: this command needs the package {err.name!r}, which is not "
              f"installed here; install the {extra!r} extra: pip install \"dflash-edge[{extra}]\"", file=sys.stderr)
        return 2


def _check_numbers(args) -> None:
    """Every subcommand's numeric options with a rule in runtime/validate.py, checked before anything loads."""
    from dflash_edge.runtime.validate import CLI_LABELS, RULES, check

    for name in RULES:
        if getattr(args, name, None) is not None:
            check(name, getattr(args, name), CLI_LABELS[name])


def _extra_providing(module: str) -> str | None:
    """The first optional extra of our package metadata (pyproject) that installs `module`, else None."""
    import importlib.metadata
    import re

    top = module.split(".")[0].lower()
    try:
        requires = importlib.metadata.requires("dflash-edge") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9_.-]+).*extra\s*==\s*[\"']([\w-]+)[\"']", req)
        if m and m.group(1).lower().replace("-", "_") == top:
            return m.group(2)
    return None
