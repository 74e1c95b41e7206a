"""Sampled DFlash2 drafts: tokens per verify step under the two lossless rules (runtime/lattice.py
RULES: "rejection", z-lab's, and "coupling", a shared uniform) on the same prompts and seeds.

Two drafters: the random DFlash2 fixture (tests/dflash2_fixture.py) on the tests' tiny qwen3 target,
and the shipped default drafter converted to DFlash2 (models/dflash2_weights.from_dflash1: neutral
conv, zero selector, so q is the softmax of its own logits over its top-16) on the default target.
Every step verifies the whole block (draft="drafter"); the figure is the mean tokens a verify step
commits (accepted drafts + 1), with its standard error over steps.

    python benchmarks/sampled_acceptance.py --setup fixture --seeds 8
    python benchmarks/sampled_acceptance.py --setup default --prompts 6 --seeds 2 --tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from output import emit_json  # noqa: E402

RULE_NAMES = ("rejection", "coupling")


def _export(root: Path, target: str, drafter: Path, block: int | None, context: int) -> Path:
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    opts = ExportOptions(
        root / "bundle", target, str(drafter), block, max_context=context, force=True
    )
    return Path(export_bundle(opts, progress=False))


def fixture_bundle(root: Path) -> tuple[Path, list]:
    """The tests' tiny qwen3 target + the random DFlash2 fixture at block 8; id prompts."""
    from dflash_edge.models import load_target

    from dflash2_fixture import write_dflash2
    from runtime_cases import PROMPTS
    from tiny import add_tiny_tokenizer, hf_model, save_hf

    target_dir = save_hf(hf_model("qwen3"), root / "target")
    add_tiny_tokenizer(root / "target")
    write_dflash2(root / "drafter", load_target(target_dir).config)
    return _export(root, target_dir, root / "drafter", 8, 256), list(PROMPTS)


def default_bundle(root: Path, prompts: int) -> tuple[Path, list]:
    """The default target + the shipped drafter converted to DFlash2; the bench prompt set."""
    import torch

    from dflash_edge.data import read_prompts
    from dflash_edge.models.dflash2_config import DFlash2Config
    from dflash_edge.models.dflash2_weights import from_dflash1
    from dflash_edge.models.drafter import load_drafter, save_drafter
    from dflash_edge.models.fetch import fetch_default_model

    shipped = Path(__file__).resolve().parent.parent / "data" / "drafters" / "smollm2-135m-instruct"
    d1 = load_drafter(shipped)
    cfg2 = DFlash2Config(**{**vars(d1.config), "selector_rank": 4, "conv_group_size": 16})
    save_drafter(from_dflash1(d1, cfg2), root / "d2", dtype=torch.float32)
    bundle = _export(root, str(fetch_default_model()), root / "d2", None, 1024)
    return bundle, [row["prompt"] for row in read_prompts("bench", limit=prompts)]


def measure(gen, prompts: list, temps, seeds: int, tokens: int) -> list[dict]:
    """Per temperature and rule: tokens per verify step over every prompt x seed (same runs)."""
    rows = []
    for temperature in temps:
        for rule in RULE_NAMES:
            gen.sampled_rule = rule
            steps = []
            for prompt in prompts:
                for seed in range(seeds):
                    opts = {"temperature": temperature, "seed": seed, "draft": "drafter"}
                    if isinstance(prompt, str):
                        res = gen.generate(prompt, max_new_tokens=tokens, **opts)
                    else:
                        res = gen.generate_ids(prompt, tokens, stop_token_ids=(), **opts)
                    steps += res.stats.acceptance_lengths
            rows.append(
                {
                    "temperature": temperature,
                    "rule": rule,
                    "verify_steps": len(steps),
                    "tokens_per_step": round(statistics.fmean(steps), 3),
                    "stderr": round(statistics.stdev(steps) / len(steps) ** 0.5, 3),
                }
            )
            print(rows[-1], file=sys.stderr)
    gen.sampled_rule = "rejection"
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", choices=("fixture", "default"), default="fixture")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0])
    ap.add_argument("--seeds", type=int, default=8, help="seeds per prompt")
    ap.add_argument("--prompts", type=int, default=6, help="prompts of the bench set (default)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per run")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)

    from dflash_edge.runtime import Generator

    with tempfile.TemporaryDirectory(prefix="sampled-acc-") as tmp:
        root = Path(tmp)
        if args.setup == "fixture":
            bundle, prompts = fixture_bundle(root)
        else:
            bundle, prompts = default_bundle(root, args.prompts)
        gen = Generator.load(bundle)
        rows = measure(gen, prompts, args.temperatures, args.seeds, args.tokens)
    emit_json({"setup": args.setup, "args": vars(args), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
