"""Find the drafter a command asked for: a directory, the shipped default, or a random one
(loudly)."""

from __future__ import annotations

import sys

from ..data import shipped_drafter
from .drafter import DraftConfig, load_drafter, new_drafter
from .locate import drafter_folder

# Tokens tried, in order, as the mask id of a freshly initialised drafter (the first one in the
# vocabulary wins).
MASK_CANDIDATES = ("<|MASK|>", "<mask>", "<empty_output>", "<|fim_pad|>", "<|endoftext|>")


def pick_mask_token(tokenizer) -> int:
    for text in MASK_CANDIDATES:
        tid = tokenizer.tokenizer.token_to_id(text)
        if tid is not None:
            return tid
    return tokenizer.tokenizer.get_vocab_size() - 1


RANDOM_WARNING = (
    "WARNING: no trained drafter for this target: using a RANDOMLY INITIALISED drafter. Output is "
    "still lossless, but almost no draft tokens will be accepted (no speed-up). Train one with "
    "`dflash-edge train` or pass --draft DIR."
)


def random_drafter(target, tokenizer, num_layers: int = 1, block_size: int = 16, seed: int = 0):
    return random_drafter_for(target.config, tokenizer, num_layers, block_size, seed)


def random_drafter_for(
    target_config, tokenizer, num_layers: int = 1, block_size: int = 16, seed: int = 0
):
    """A randomly initialised drafter sized to a target config (no target model needed)."""
    cfg = DraftConfig.for_target(
        target_config,
        num_layers=num_layers,
        block_size=block_size,
        mask_token_id=pick_mask_token(tokenizer),
    )
    return new_drafter(cfg, seed=seed)


def default_drafter_path(target_config):
    """The shipped drafter folder trained for `target_config` (package data), or None."""

    return shipped_drafter(
        target_config.hidden_size, target_config.vocab_size, target_config.num_hidden_layers
    )


def resolve_drafter(spec: str | None, target, tokenizer):
    """`spec`: a drafter directory or hub id, 'default' (the drafter shipped for the default
    target) or 'random'."""
    if spec in (None, "default"):
        path = default_drafter_path(target.config)
        if path is not None:
            return _tagged(load_drafter(path, target_config=target.config), str(path))
        spec = "random"
    if spec == "random":
        print(RANDOM_WARNING, file=sys.stderr)
        return _tagged(random_drafter(target, tokenizer), "random")
    return _tagged(load_drafter(drafter_folder(spec), target_config=target.config), str(spec))


def _tagged(drafter, source: str):
    drafter.source = source  # recorded in bundle manifests: where the drafter came from
    return drafter
