"""Output shared by the benchmarks: the result as JSON on stdout and, with --json, in a file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def emit_json(result, path=None, *, indent: int = 2, shown=None) -> None:
    """Print `shown` (default: `result`) as JSON; when `path` is given, write `result` there too.

    >>> emit_json({"ms": 1.5}, args.json)
    """
    print(json.dumps(result if shown is None else shown, indent=indent))
    if path:
        Path(path).write_text(json.dumps(result, indent=indent) + "\n")


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=f"{__doc__} Imported by the benchmarks; nothing to run."
    ).parse_args()
