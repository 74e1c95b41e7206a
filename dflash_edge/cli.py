"""`dflash-edge` command line: one subcommand per verb, each implemented in its stage's module.

A subcommand is declared as data (name -> "module:function" + help); the module is imported only
when that subcommand runs, so `dflash-edge --help` is instant.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from dflash_edge.runtime.errors import DflashEdgeError

# name -> (module with `add_arguments(parser)` and `run(args)`, one-line help)
COMMANDS = {
    "train": ("dflash_edge.train.train_cli", "distil a DFlash drafter for a target (prompts -> responses -> training)"),
    "eval-drafter": ("dflash_edge.train.eval_cli", "measure a drafter's acceptance length on held-out prompts"),
    "fetch": ("dflash_edge.export.fetch_cli", "obtain the default model (or import a GGUF) into the cache"),
    "generate": ("dflash_edge.export.generate_cli", "generate with the torch reference speculative loop"),
    "export": ("dflash_edge.export.export_cli", "export target + drafter to an ONNX bundle"),
    "build-engines": ("dflash_edge.export.engines_cli", "build TensorRT engines for a bundle (needs TensorRT)"),
    "run": ("dflash_edge.runtime.run_cli", "generate from a bundle with the speculative runtime (streams text)"),
    "quantize": ("dflash_edge.quantize.quantize_cli", "fp32 bundle -> int4/int8/fp16 bundle with a quality report"),
    "bench": ("dflash_edge.runtime.bench_cli", "speculative vs autoregressive tokens/s on a prompt set, lossless check"),
    "tune": ("dflash_edge.runtime.tune_cli", "measure this machine and store the best verify length in the bundle"),
    "devices": ("dflash_edge.runtime.devices_cli", "device profiles (detected one marked); `devices plan`: fit and speed"),
    "serve": ("dflash_edge.serve.serve_cli", "OpenAI-compatible HTTP server over a bundle (loopback by default)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="dflash-edge", description="DFlash speculative decoding for edge devices.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if argv[:1] == [name]:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        _check_numbers(args)
        return importlib.import_module(args._module).run(args) or 0
    except DflashEdgeError as err:
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


if __name__ == "__main__":
    sys.exit(main())
