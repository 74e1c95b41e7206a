"""The whole recipe, stage by stage: prompts -> target responses (+ features) -> training -> drafter.

Every stage writes under one work directory and skips what is already there, so rerunning the
same command resumes (prompts are rebuilt identically from the seed; shards and checkpoints persist).

    work/prompts_train.jsonl   work/responses/shard_*.pt   work/ckpt/   (out: the drafter)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .prompts import HELDOUT_FILE, PromptSpec, build_prompts, read_jsonl, write_jsonl
from .responses import GenSpec, write_shards


@dataclass
class RecipeConfig:
    target: str | None = None                  # checkpoint dir, or None/"default"
    work_dir: str = ""
    prompts: PromptSpec = field(default_factory=PromptSpec)
    gen: GenSpec = field(default_factory=GenSpec)
    num_threads: int = 2


def load_target_and_tokenizer(spec: str | None):
    from dflash_edge.export.fetch import resolve_target
    from dflash_edge.export.models import load_target
    from dflash_edge.runtime.tokenizer import ChatTokenizer

    path = resolve_target(spec)
    return load_target(path), ChatTokenizer.from_dir(path), path


def encode_prompt(tok, prompt: str) -> list[int]:
    """The chat encoding every stage (training, evaluation, benchmarks) uses for a prompt."""
    return tok.encode_chat([{"role": "user", "content": prompt}])


def prompt_files(cfg: RecipeConfig) -> tuple[list[dict], list[dict]]:
    """(train, heldout) prompts; the train file is (re)built in the work dir, held-out ones are excluded."""
    work = Path(cfg.work_dir)
    train_file = work / "prompts_train.jsonl"
    if train_file.exists():
        return read_jsonl(train_file), read_jsonl(HELDOUT_FILE)
    train, heldout = build_prompts(cfg.prompts)
    if HELDOUT_FILE.exists():  # the shipped held-out set wins: never train on any of its prompts
        heldout = read_jsonl(HELDOUT_FILE)
        banned = {" ".join(r["prompt"].lower().split()) for r in heldout}
        train = [r for r in train if " ".join(r["prompt"].lower().split()) not in banned]
    write_jsonl(train, train_file)
    return train, heldout


def generate_responses(cfg: RecipeConfig, target, tok, train: list[dict]) -> list[Path]:
    """Target responses + features for every training prompt (resumable shards)."""
    from tqdm import tqdm

    ids = [encode_prompt(tok, r["prompt"]) for r in train]
    out = Path(cfg.work_dir) / "responses"
    meta = out / "gen_spec.json"
    out.mkdir(parents=True, exist_ok=True)
    wanted = json.dumps(asdict(cfg.gen), sort_keys=True)
    if meta.exists() and meta.read_text() != wanted:
        raise ValueError(f"{out} holds responses made with another generation spec ({meta.read_text()}); "
                         f"use a new --work-dir or delete {out}")
    meta.write_text(wanted)
    bar = tqdm(total=-(-len(ids) // cfg.gen.batch_size), desc="responses", unit="batch")

    def progress(done, total, path):
        bar.n = done
        bar.refresh()

    paths = write_shards(target, ids, out, cfg.gen, progress)
    bar.close()
    return paths


def prepare_data(cfg: RecipeConfig) -> list[Path]:
    torch.set_num_threads(cfg.num_threads)
    target, tok, _ = load_target_and_tokenizer(cfg.target)
    train, _ = prompt_files(cfg)
    return generate_responses(cfg, target, tok, train)
