"""Where the drafter shipped for the default model lives (found without importing `train`)."""
from __future__ import annotations

import json
from pathlib import Path

# Shipped drafters, by the target they were trained for (matched on the target's dims).
SHIPPED = Path(__file__).resolve().parent.parent / "drafters"


def default_drafter_path(target_config) -> Path | None:
    """The shipped drafter directory that fits `target_config`, or None."""
    if not SHIPPED.is_dir():
        return None
    for cfg_file in sorted(SHIPPED.glob("*/config.json")):
        cfg = json.loads(cfg_file.read_text())
        if (cfg.get("hidden_size"), cfg.get("vocab_size"), cfg.get("num_target_layers")) == (
                target_config.hidden_size, target_config.vocab_size, target_config.num_hidden_layers):
            return cfg_file.parent
    return None
