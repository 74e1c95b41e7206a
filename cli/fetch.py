"""`dflash-edge fetch`: put a target checkpoint in the cache and print its path.

$ dflash-edge fetch                                  # the default model (SmolLM2-135M-Instruct)
~/.cache/dflash-edge/models/smollm2-135m-instruct
$ dflash-edge fetch --gguf qwen2.5-0.5b.gguf --name qwen
~/.cache/dflash-edge/models/qwen
"""

from __future__ import annotations

import argparse

from ..models.fetch import fetch_default_model, fetch_gguf
from ..runtime.errors import DflashEdgeError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare `fetch`'s options on its subparser."""
    parser.add_argument(
        "--gguf",
        metavar="FILE",
        help="import this GGUF (llama / qwen2 / qwen3) instead of the default model",
    )
    parser.add_argument(
        "--name", metavar="NAME", help="cache name for --gguf (default: the file's stem)"
    )
    parser.add_argument(
        "--force", action="store_true", help="re-download / re-import even if already cached"
    )


def run(args: argparse.Namespace) -> int:
    """Fetch or import, then print the checkpoint directory."""

    if args.gguf:
        path = fetch_gguf(args.gguf, name=args.name, force=args.force)
    elif args.name:
        raise DflashEdgeError(
            "--name only applies with --gguf FILE; the default model has a fixed name."
        )
    else:
        path = fetch_default_model(force=args.force)
    print(path)
    return 0
