"""`dflash-edge build-engines`: build a bundle's TensorRT engines ahead of the first run.

The runtime's TensorRT path (`run --provider tensorrt`: onnxruntime's TensorRT execution provider)
builds its engines into BUNDLE/.trt-cache on first load; this opens the same sessions now, so that
load finds them. Precision is the bundle's (an fp16 bundle gets fp16 kernels).

$ dflash-edge build-engines bundle/
"""

from __future__ import annotations

import argparse
import sys

from ..engines.build import build_engines  # light: onnxruntime is imported when building


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare `build-engines`' options on its subparser."""
    parser.add_argument(
        "bundle", metavar="BUNDLE", help="bundle directory (from `dflash-edge export`)"
    )


def run(args: argparse.Namespace) -> int:
    """Build, then print the cache folder and what it holds."""
    report = build_engines(args.bundle)
    print(
        f"built {len(report['files'])} file(s), {report['bytes'] / 1e6:.1f} MB, in "
        f"{report['load_seconds']:.0f} s (+{report['warm_seconds']:.0f} s warm-up runs)",
        file=sys.stderr,
    )
    print(report["cache"])
    return 0
