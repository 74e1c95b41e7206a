"""Options and helpers that several verbs share: thread, provider, KV-cache flags, prompt sets."""

from __future__ import annotations

from pathlib import Path

from ..data import PROMPT_SETS, read_prompts
from ..runtime.errors import DflashEdgeError
from ..runtime.session import PROVIDERS


def add_thread_args(p) -> None:
    """`--threads` and `--no-spin`, the same on every command that loads a bundle (run, bench, tune,
    serve)."""
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: one per usable CPU)"
    )
    p.add_argument(
        "--no-spin",
        dest="spin",
        action="store_false",
        help="intra-op threads sleep between ops instead of spinning (for cores shared with other "
        "work)",
    )


def add_model_args(p, draft: bool = True) -> None:
    """`--target` (and `--draft`): the checkpoint and drafter a verb reads, spelled alike on every
    verb."""
    p.add_argument(
        "--target",
        default="default",
        help="checkpoint dir, .gguf file, hub id org/name[@REV] (org/name:QUANT for a GGUF repo; "
        "HF cache, HF_HUB_OFFLINE honoured), or 'default' (SmolLM2-135M-Instruct)",
    )
    if draft:
        p.add_argument(
            "--draft",
            default="default",
            help="DFlash drafter dir or hub id org/name[@REV], 'default' (the shipped one) or "
            "'random'",
        )


def add_prompts_arg(p, default: str, what: str) -> None:

    p.add_argument(
        "--prompts",
        default=None,
        help=f"{what}: a JSONL file with a 'prompt' per line, or a shipped set "
        f"({', '.join(sorted(PROMPT_SETS))}; default: {default})",
    )


def load_prompts(spec: str | Path | None, limit: int = 0, default: str = "bench") -> list[dict]:
    """Rows {"id", "category", "prompt"} of a JSONL file or a shipped set (dflash_edge.data)."""

    try:
        return read_prompts(spec, limit, default)
    except ValueError as err:
        raise DflashEdgeError(str(err)) from err


def prompt_of(row: dict):
    """What a prompt row asks the Generator for: its text, or (a row with a `suffix`) the middle
    between its `prompt` and that suffix (runtime/fim.py)."""
    if "suffix" not in row:
        return row["prompt"]
    from ..runtime.fim import FimPrompt

    return FimPrompt(row["prompt"], row["suffix"])


def add_provider_arg(p) -> None:
    """`--provider`, its choices from runtime/session.py's one table (checked by the runtime)."""
    p.add_argument("--provider", default="cpu", help=" | ".join(PROVIDERS))


def add_kv_cache_arg(p) -> None:
    """`--kv-cache`, one meaning and one default in export and quantize."""
    from ..export.choices import AUTO
    from ..export.kv_cache import KV_CACHES

    p.add_argument(
        "--kv-cache",
        default=AUTO,
        choices=(AUTO, *KV_CACHES),
        help="the fused target's KV cache; auto: int8 for int4/int8 targets "
        "(calibrated on the written graph), else fp32 (with a GPU / Jetson --device every "
        "other cache is float16)",
    )
