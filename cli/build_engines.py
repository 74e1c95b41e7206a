"""`dflash-edge build-engines`: TensorRT engines for a bundle's graphs, recorded in its manifest.

$ dflash-edge build-engines bundle/                      # fp16, every graph
$ dflash-edge build-engines bundle/ --precision int8 --device orin-nano-8gb
"""

from __future__ import annotations

import argparse

from ..engines.build import (
    PRECISION_FLAGS,  # light: engines imports tensorrt only when building
    EngineOptions,
    build_engines,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare `build-engines`' options on its subparser."""
    parser.add_argument(
        "bundle", metavar="BUNDLE", help="bundle directory (from `dflash-edge export`)"
    )
    parser.add_argument(
        "--precision",
        choices=sorted(PRECISION_FLAGS),
        default="fp16",
        help="engine precision (int8/fp8 without a QDQ-quantised bundle fall back to fp16)",
    )
    parser.add_argument(
        "--device",
        metavar="NAME",
        help="device label for the manifest (default: detected GPU name)",
    )
    parser.add_argument(
        "--workspace-gb", type=float, default=4.0, metavar="N", help="builder workspace limit (GiB)"
    )
    parser.add_argument(
        "--graph", action="append", metavar="NAME", help="build only this graph (repeatable)"
    )


def run(args: argparse.Namespace) -> int:
    """Build, then print each engine's path."""

    engines = build_engines(
        EngineOptions(
            args.bundle,
            precision=args.precision,
            device=args.device,
            workspace_gb=args.workspace_gb,
            graphs=tuple(args.graph) if args.graph else None,
        )
    )
    for graph, by_precision in engines.items():
        entry = by_precision.get(args.precision)
        if entry and (not args.graph or graph in args.graph):
            print(entry["file"]["path"])
    return 0
