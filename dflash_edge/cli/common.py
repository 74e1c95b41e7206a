"""Options and helpers that several verbs share: thread flags, prompt sets."""
from __future__ import annotations

from pathlib import Path


def add_thread_args(p) -> None:
    """`--threads` and `--no-spin`, the same on every command that loads a bundle (run, bench, tune, serve)."""
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: one per usable CPU)")
    p.add_argument("--no-spin", dest="spin", action="store_false",
                   help="intra-op threads sleep between ops instead of spinning (for cores shared with other work)")


def add_prompts_arg(p, default: str, what: str) -> None:
    from dflash_edge.data import PROMPT_SETS

    p.add_argument("--prompts", default=None, help=f"{what}: a JSONL file with a 'prompt' per line, or a shipped set "
                                                   f"({', '.join(sorted(PROMPT_SETS))}; default: {default})")


def load_prompts(spec: str | Path | None, limit: int = 0, default: str = "bench") -> list[dict]:
    """Rows {"id", "category", "prompt"} of a JSONL file or a shipped set (dflash_edge.data)."""
    from dflash_edge.data import read_prompts
    from dflash_edge.runtime.errors import DflashEdgeError

    try:
        return read_prompts(spec, limit, default)
    except ValueError as err:
        raise DflashEdgeError(str(err)) from err
