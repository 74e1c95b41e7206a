"""Data the code reads at run time, installed with the package: the shipped drafter and the prompt
sets.

Floor 1 (beside devices/): pure Python, imports nothing of ours, so every room may read it. Paths
come from `importlib.resources`, so a non-editable install behaves exactly like the checkout.

>>> sorted(PROMPT_SETS)
['bench', 'code', 'heldout', 'quote']
>>> prompt_set_path("quote").name
'quote.jsonl'
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

# name -> what it holds (each is prompts/<name>.jsonl: one {"prompt", "category"[, "id"]} object per
# line)
PROMPT_SETS = {
    "bench": "mixed everyday prompts (chat, code, maths, ...): `bench` and `tune` by default",
    "quote": "prompts whose answers quote their input (fix, rewrite, convert, extract)",
    "code": (
        "code edits that rewrite given code, asked in chat (edit-*) and as editors ask, code "
        "only (editor-*), and fill-in-the-middle cases (rows with a 'suffix': "
        "the 'prompt' is the prefix, 'expected' the middle; need a model with FIM tokens)"
    ),
    "heldout": (
        "held-out prompts never used in drafter training: quality reports and drafter evaluation"
    ),
}


def _root() -> Path:
    return Path(str(resources.files(__name__)))


def prompt_set_path(name: str) -> Path:
    """The JSONL file of the shipped prompt set `name` (a key of PROMPT_SETS)."""
    if name not in PROMPT_SETS:
        raise KeyError(f"no shipped prompt set {name!r}; shipped: {', '.join(sorted(PROMPT_SETS))}")
    return _root() / "prompts" / f"{name}.jsonl"


def drafters_dir() -> Path:
    """The folder of shipped drafters (one z-lab-format drafter folder per target)."""
    return _root() / "drafters"


def shipped_drafter(hidden_size: int, vocab_size: int, num_layers: int) -> Path | None:
    """The shipped drafter folder trained for a target of these dims, or None."""
    root = drafters_dir()
    if not root.is_dir():
        return None
    for cfg_file in sorted(root.glob("*/config.json")):
        cfg = json.loads(cfg_file.read_text())
        if (cfg.get("hidden_size"), cfg.get("vocab_size"), cfg.get("num_target_layers")) == (
            hidden_size,
            vocab_size,
            num_layers,
        ):
            return cfg_file.parent
    return None


def read_prompts(spec: str | Path | None, limit: int = 0, default: str = "bench") -> list[dict]:
    """Rows {"id", "category", "prompt"[, "suffix", "expected"]} from a JSONL file, or from the
    shipped set named `spec` (None: `default`). A row with a `suffix` is a fill-in-the-middle case:
    `prompt` is the text before the gap. ValueError names the file, the line and the fix.

    >>> len(read_prompts("quote", limit=3))
    3
    """
    spec = default if spec in (None, "") else spec
    path = prompt_set_path(str(spec)) if str(spec) in PROMPT_SETS else Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(
            f"prompts file {path} not found; pass a JSONL file with a 'prompt' per line or a "
            "shipped "
            f"set: {', '.join(sorted(PROMPT_SETS))}"
        )
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n} is not valid JSON ({err})") from err
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{n} needs a string field 'prompt'")
        fim = {k: row[k] for k in ("suffix", "expected") if k in row}
        if not all(isinstance(v, str) for v in fim.values()):
            raise ValueError(f"{path}:{n}: 'suffix' and 'expected' must be strings")
        rows.append(
            {
                "id": row.get("id", f"p{n}"),
                "category": row.get("category", ""),
                "prompt": row["prompt"],
                **fim,
            }
        )
    return rows[:limit] if limit else rows
