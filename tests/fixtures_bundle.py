"""Tiny bundles exported in-process (tier 1): a tiny target + random drafter + a word-level
tokenizer.

`tiny_bundle(variant, block)` builds (once per session) a bundle from the `tiny_checkpoints` fixture
and returns a `TinyBundle`: the path, the torch target and drafter it came from, and a loaded
`Generator`."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

MAX_CONTEXT = 128
PREFILL_CHUNK = (
    8  # small, so test prompts span several chunks (and the overlapped / padded last one)
)
CHAT_TEMPLATE = (
    "{% for m in messages %}t1 {{ m['content'] }} t2 {% endfor %}"
    "{% if add_generation_prompt %}t3{% endif %}"
)


@dataclass
class TinyBundle:
    path: Path
    target: object  # torch reference target
    drafter: object  # torch reference drafter (random weights)
    generator: object  # dflash_edge.runtime.Generator on the bundle


def add_tiny_tokenizer(ckpt: Path, vocab_size: int = 96) -> None:
    """A word-level tokenizer ("t0".."t95") and a chat template, so the tiny checkpoint exports like
    a real one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))


def build_tiny_bundle(
    root: Path,
    ckpt_dir: str,
    block: int,
    max_context: int = MAX_CONTEXT,
    prefill_chunk: int = PREFILL_CHUNK,
    seed: int = 0,
) -> TinyBundle:
    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.models import load_target
    from dflash_edge.models.drafter import DraftConfig, load_drafter, new_drafter, save_drafter
    from dflash_edge.runtime import Generator

    ckpt = root / "target"
    shutil.copytree(ckpt_dir, ckpt)
    add_tiny_tokenizer(ckpt)
    target = load_target(ckpt)
    cfg = DraftConfig.for_target(target.config, num_layers=2, block_size=block, mask_token_id=5)
    save_drafter(new_drafter(cfg, seed=seed + block), root / "drafter")
    drafter = load_drafter(root / "drafter", target_config=target.config)
    out = export_bundle(
        ExportOptions(
            out=root / "bundle",
            target=str(ckpt),
            draft=str(root / "drafter"),
            block_size=block,
            max_context=max_context,
            prefill_chunk=prefill_chunk,
            force=True,
        ),
        progress=False,
    )
    return TinyBundle(Path(out), target, drafter, Generator.load(out))


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoints, tmp_path_factory):
    """Factory: tiny_bundle(variant, block) -> TinyBundle, each built once per session."""
    built: dict[tuple[str, int], TinyBundle] = {}

    def get(variant: str = "qwen3", block: int = 8) -> TinyBundle:
        if (variant, block) not in built:
            root = tmp_path_factory.mktemp(f"bundle-{variant}-b{block}")
            built[variant, block] = build_tiny_bundle(root, tiny_checkpoints[variant][1], block)
        return built[variant, block]

    return get
