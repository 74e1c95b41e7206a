"""A reduced draft vocabulary: the drafter's LM head over the N tokens the target says most often.

The drafter's cost on a CPU is mostly its LM head (block x 49k rows for SmolLM2: ~90% of the draft
FLOPs). Exporting the drafter with only the N most frequent output tokens cuts that by 49k/N; a
draft token outside the set is simply never proposed, and verification by the full target keeps the
output lossless. The ranking comes from the target's own training responses: `dflash-edge train`
writes it next to the drafter as `draft_vocab.json` (z-lab loaders ignore the extra file).

>>> ids = load_draft_vocab(  # doctest: +SKIP
...     "data/drafters/smollm2-135m-instruct", 8192, vocab_size=49152)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..runtime.errors import ModelFormatError

DRAFT_VOCAB_FILE = "draft_vocab.json"


def draft_vocab_json(token_lists, always=()) -> str:
    """`draft_vocab.json` text: token ids seen in `token_lists`, most frequent first (`always`
    leading)."""
    counts = Counter()
    for tokens in token_lists:
        counts.update(int(t) for t in tokens)
    lead = [int(t) for t in always]
    ranked = lead + [
        t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t not in set(lead)
    ]
    return json.dumps({"token_ids": ranked, "counted_tokens": sum(counts.values())}) + "\n"


def load_draft_vocab(drafter_dir: str | Path | None, size: int, vocab_size: int):
    """Sorted LongTensor of `size` token ids: the ranked ones of `drafter_dir`, then the lowest
    unranked ids."""
    import torch

    if not 0 < size <= vocab_size:
        raise ModelFormatError(
            f"--draft-vocab {size} must be between 1 and the vocabulary size ({vocab_size}); "
            f"0 keeps the full vocabulary"
        )
    path = Path(drafter_dir) / DRAFT_VOCAB_FILE if drafter_dir else None
    if path is None or not path.exists():
        raise ModelFormatError(
            f"{path or 'a random drafter'}: no {DRAFT_VOCAB_FILE} (token frequencies written by "
            f"`dflash-edge train`), so a reduced draft vocabulary cannot be chosen; export "
            f"without --draft-vocab"
        )
    ranked = [t for t in json.loads(path.read_text())["token_ids"] if 0 <= t < vocab_size][:size]
    # pad with the lowest ids (BPE merge order, roughly frequency) not yet taken
    if len(ranked) < size:
        taken = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in taken][: size - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)
