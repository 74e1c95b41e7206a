"""Tiny bundles exported in-process (tier 1): a tiny target + random drafter + a word-level
tokenizer.

`tiny_bundle(variant, block)` builds (once per session) a bundle from the `tiny_checkpoints` fixture
and returns a `TinyBundle`: the path, the torch target and drafter it came from, and a loaded
`Generator`."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tiny import add_tiny_tokenizer

MAX_CONTEXT = 128
# small, so test prompts span several chunks (and the overlapped / padded last one)
PREFILL_CHUNK = 8


@dataclass
class TinyBundle:
    path: Path
    target: object  # torch reference target
    drafter: object  # torch reference drafter (random weights)
    generator: object  # dflash_edge.runtime.Generator on the bundle


def build_tiny_bundle(
    root: Path,
    ckpt_dir: str,
    block: int,
    max_context: int = MAX_CONTEXT,
    prefill_chunk: int = PREFILL_CHUNK,
    seed: int = 0,
) -> TinyBundle:
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
    out = export_tiny(
        root / "bundle",
        str(ckpt),
        str(root / "drafter"),
        block_size=block,
        max_context=max_context,
        prefill_chunk=prefill_chunk,
        force=True,
    )
    return TinyBundle(Path(out), target, drafter, Generator.load(out))


def export_tiny(out, target, draft="random", **options) -> Path:
    """export_bundle(ExportOptions(out, target, draft, **options)) without a progress bar: the
    tests' one call into the exporter's API."""
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    opts = ExportOptions(out=out, target=target, draft=draft, **options)
    return export_bundle(opts, progress=False)


def export_again(bundle: TinyBundle, out, block: int, **options) -> Path:
    """`bundle`'s own target and drafter exported again into `out` (draft block `block`, the tiny
    context and chunk, no parity run), `options` on top."""
    root = bundle.path.parent
    return export_tiny(
        out,
        str(root / "target"),
        str(root / "drafter"),
        block_size=block,
        max_context=MAX_CONTEXT,
        prefill_chunk=PREFILL_CHUNK,
        verify=False,
        **options,
    )


def export_args(out, target, draft, *flags, block=4, context=256, chunk=16) -> list[str]:
    """`dflash-edge export` arguments for a tiny checkpoint, `flags` after the sizes."""
    sizes = [
        "--block-size",
        str(block),
        "--max-context",
        str(context),
        "--prefill-chunk",
        str(chunk),
    ]
    return [
        "export",
        "--out",
        str(out),
        "--target",
        str(target),
        "--draft",
        str(draft),
        *sizes,
        *flags,
    ]


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
