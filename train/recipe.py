"""The whole recipe, stage by stage: prompts -> target responses (+ features) -> training ->
drafter.

Every stage writes under one work directory and skips what is already there, so rerunning the same
command resumes (prompts are rebuilt identically from the seed; shards and checkpoints persist).

    work/prompts_train.jsonl   work/responses/shard_*.pt   work/ckpt/   (out: the drafter)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..models import load_target
from ..models.draft_vocab import DRAFT_VOCAB_FILE, draft_vocab_json
from ..models.drafter import DraftConfig, new_drafter, save_drafter
from ..models.fetch import resolve_target
from ..models.resolve_drafter import pick_mask_token
from .evaluate import EvalSpec, format_report, replay_eval
from .hardware import resolve_dtype
from .model_card import model_card
from .objective import frequent_tokens
from .prompts import HELDOUT_FILE, PromptSpec, build_prompts, read_jsonl, write_jsonl
from .responses import GenSpec, load_shard, write_shards
from .trainer import RunOptions, TrainConfig, train_drafter


@dataclass
class RecipeConfig:
    target: str | None = None  # checkpoint dir, or None/"default"
    work_dir: str = ""
    out: str = ""  # where the best drafter is written (z-lab format)
    layers: int = 1
    block_size: int = 16
    draft_vocab: int = 0  # >0: softmax of the loss over the N most frequent tokens
    soft_topk: int = 0  # >0: distil the target's top-k next-token distributions (soft_targets.py)
    scale_features: bool = True  # train fc on per-channel unit-scale features (conditioning.py)
    init: str = "random"  # "target": start from the target's top layers (target_init.py)
    max_shards: int = 0  # >0: train on the first N response shards only
    eval_prompts: int = 60  # held-out prompts replayed at each evaluation
    eval_every: int = 100
    prompts: PromptSpec = field(default_factory=PromptSpec)
    gen: GenSpec = field(default_factory=lambda: GenSpec(capture=(1, 8, 14, 20, 27)))
    train: TrainConfig = field(default_factory=TrainConfig)
    num_threads: int = 2
    device: str = "cpu"  # where the target generates and the drafter trains ("cuda")
    command: str = ""  # recorded in the model card


def load_target_and_tokenizer(spec: str | None, dtype: str = "float32", device: str = "cpu"):
    from ..runtime.tokenizer import ChatTokenizer

    path = resolve_target(spec)
    target = load_target(path, dtype=getattr(torch, resolve_dtype(dtype, device))).requires_grad_(
        False
    )
    return target.to(device), ChatTokenizer.from_dir(path), path


def encode_prompt(tok, prompt: str) -> list[int]:
    """The chat encoding every stage (training, evaluation, benchmarks) uses for a prompt."""
    return tok.encode_chat([{"role": "user", "content": prompt}])


def prompt_files(cfg: RecipeConfig) -> tuple[list[dict], list[dict]]:
    """(train, heldout) prompts; the train file is (re)built in the work dir, held-out ones are
    excluded."""
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
        raise ValueError(
            f"{out} holds responses made with another generation spec ({meta.read_text()}); "
            f"use a new --work-dir or delete {out}"
        )
    meta.write_text(wanted)
    total = -(-len(ids) // cfg.gen.batch_size)
    bar = tqdm(total=min(total, cfg.max_shards or total), desc="responses", unit="batch")

    def progress(done, total, path):
        bar.n = done
        bar.refresh()

    paths = write_shards(target, ids, out, cfg.gen, progress, limit=cfg.max_shards)
    bar.close()
    return paths


def prepare_data(cfg: RecipeConfig):
    """Prompts, training responses and held-out responses (each resumable); returns (fp32 target on
    `cfg.device`, tokenizer, held-out prompt rows, held-out samples for evaluation)."""
    torch.set_num_threads(cfg.num_threads)
    gen_target, tok, _ = load_target_and_tokenizer(cfg.target, cfg.gen.dtype, cfg.device)
    train_rows, heldout = prompt_files(cfg)
    generate_responses(cfg, gen_target, tok, train_rows)
    if gen_target.lm_head.weight.dtype == torch.float32:
        target = gen_target
    else:
        del gen_target
        target, _, _ = load_target_and_tokenizer(cfg.target, device=cfg.device)
    return (
        target,
        tok,
        heldout,
        spread(generate_heldout(cfg, target, tok, heldout), cfg.eval_prompts),
    )


# ---------------------------------------------------------------- training stage
def shard_paths(shard_dir: Path, max_shards: int = 0) -> list[Path]:
    paths = sorted(shard_dir.glob("shard_*.pt"))
    if max_shards:
        paths = paths[:max_shards]
    if not paths:
        raise FileNotFoundError(
            f"no response shards in {shard_dir}: run the data stage first "
            f"(`dflash-edge train` builds them)"
        )
    return paths


def load_samples(
    shard_dir: Path,
    max_shards: int = 0,
    target=None,
    soft_topk: int = 0,
    capture: tuple[int, ...] = (),
) -> list:
    """The samples of the first `max_shards` shards (all if 0); with `soft_topk` > 0 each also
    carries the target's top-k next-token distributions (computed once with `target`, cached beside
    the shard)."""

    paths = shard_paths(shard_dir, max_shards)
    per_shard = [load_shard(p) for p in paths]
    if soft_topk:
        from tqdm import tqdm

        from .soft_targets import attach_soft_targets

        with tqdm(total=len(paths), desc=f"soft targets (top {soft_topk})", unit="shard") as bar:
            attach_soft_targets(
                target, paths, per_shard, capture, soft_topk, lambda i, n: bar.update(1)
            )
    return [s for group in per_shard for s in group]


def generate_heldout(cfg: RecipeConfig, target, tok, heldout: list[dict]) -> list:
    """The target's fp32 greedy responses to every held-out prompt (for exact replayed
    acceptance)."""

    spec = replace(cfg.gen, sampled_fraction=0.0, dtype="float32")
    out = Path(cfg.work_dir) / "heldout"
    write_shards(target, [encode_prompt(tok, r["prompt"]) for r in heldout], out, spec)
    return sorted(load_samples(out), key=lambda s: s.index)


def spread(rows: list, n: int) -> list:
    """`n` rows evenly spaced over `rows` (every category of a category-sorted file gets its
    share)."""
    if not n or n >= len(rows):
        return rows
    return [rows[i * len(rows) // n] for i in range(n)]


def build_drafter(target, tok, cfg: RecipeConfig, samples=()):
    """A fresh drafter reading the captured target layers.

    With `cfg.init == "target"` it starts as a copy of the target's layers above the deepest
    captured feature (`target_init.py`; `samples` measure the q/k norm scales). Otherwise its
    final norm starts as the target's scaled by 0.1: with the full scale (the LM head is tied to
    the embedding) a mask position's logits peak on the mask token itself and the first loss is ~118
    nats on SmolLM2; at 0.1 it is ~16, and greedy acceptance does not depend on the logit scale.
    """

    dcfg = DraftConfig.for_target(
        target.config,
        num_layers=cfg.layers,
        block_size=cfg.block_size,
        mask_token_id=pick_mask_token(tok),
        target_layer_ids=list(cfg.gen.capture),
    )
    drafter = new_drafter(dcfg, seed=cfg.train.seed)
    if cfg.init == "target":
        from .target_init import init_from_target

        init_from_target(drafter, target, samples)
        return drafter
    with torch.no_grad():
        drafter.norm.weight.copy_(0.1 * target.model.norm.weight)
    return drafter


class BestKeeper:
    """Evaluation callback: replayed τ on held-out responses; the best drafter so far goes to
    `out`."""

    def __init__(self, cfg: RecipeConfig, target, heldout_samples, categories, log, wall: dict):

        self.cfg, self.target, self.log, self.wall = cfg, target, log, wall
        # more files saved with the drafter (draft_vocab.json)
        self.extra_files: dict[str, str] = {}
        self.t0 = time.monotonic()
        self.samples, self.categories = heldout_samples, categories
        self.spec = EvalSpec(block_size=cfg.block_size, max_new_tokens=cfg.gen.max_new_tokens)
        self.head = target.lm_head.weight.detach()
        self.best_file = Path(cfg.work_dir) / "best.json"
        self.best = (
            json.loads(self.best_file.read_text()) if self.best_file.exists() else {"tau": 0.0}
        )

    def __call__(self, drafter, step: int) -> None:

        rep = replay_eval(
            drafter,
            self.target.model.embed_tokens,
            self.head,
            self.samples,
            self.categories,
            self.spec,
        )
        self.log(f"step {step}: replayed held-out " + format_report(rep))
        if rep.tau() > self.best["tau"]:
            wall = {
                **self.wall,
                "training up to this step, this process": time.monotonic() - self.t0,
            }
            self.best = {"step": step, **rep.to_dict(), "wall_s": wall, "command": self.cfg.command}
            save_with_card(drafter, Path(self.cfg.out), self.cfg, self.best, self.extra_files)
            self.best_file.write_text(json.dumps(self.best, indent=2))
            self.log(f"step {step}: new best tau {rep.tau():.3f} -> {self.cfg.out}")


def save_with_card(
    drafter, out: Path, cfg: RecipeConfig, result: dict, extra_files: dict | None = None
) -> None:

    save_drafter(
        drafter,
        out,
        dtype=torch.bfloat16,
        extra_files={"README.md": model_card(cfg, result), **(extra_files or {})},
    )


def run_recipe(cfg: RecipeConfig, resume: bool = False, log=print, data_only: bool = False) -> dict:
    """All stages (only the data ones with `data_only`); returns the best held-out result
    (replayed greedy τ and per-position rates)."""

    t0 = time.monotonic()
    target, tok, heldout, held = prepare_data(cfg)
    wall = {"prompts + responses + held-out responses, this process": time.monotonic() - t0}
    samples = load_samples(
        Path(cfg.work_dir) / "responses", cfg.max_shards, target, cfg.soft_topk, cfg.gen.capture
    )
    if data_only:
        tokens = sum(len(s.tokens) - s.prompt_len for s in samples)
        log(
            f"data ready in {cfg.work_dir}: {len(samples)} responses ({tokens} tokens), "
            f"{len(held)} held-out"
        )
        return {"responses": len(samples), "tokens": tokens, "wall_s": wall}
    vocab = (
        frequent_tokens(
            (s.tokens[s.prompt_len :] for s in samples), cfg.draft_vocab, target.config.eos_token_id
        )
        if cfg.draft_vocab
        else None
    )
    log(
        f"training on {len(samples)} responses "
        f"({sum(len(s.tokens) - s.prompt_len for s in samples)} tokens), "
        f"draft vocab {len(vocab) if vocab is not None else 'full'}"
    )
    keeper = BestKeeper(
        cfg, target, held, [heldout[s.index].get("category", "all") for s in held], log, wall
    )
    keeper.extra_files[DRAFT_VOCAB_FILE] = draft_vocab_json(
        (s.tokens[s.prompt_len :] for s in samples), always=target.config.eos_token_id
    )
    drafter = build_drafter(target, tok, cfg, samples)
    if cfg.scale_features:
        from .conditioning import feature_rms, scale_fc_inputs

        scale_fc_inputs(
            drafter, feature_rms(samples), init_std=None if cfg.init == "target" else 0.02
        )
    run = RunOptions(
        Path(cfg.work_dir) / f"ckpt-L{cfg.layers}-B{cfg.block_size}",
        resume=resume,
        on_eval=keeper,
        eval_every=cfg.eval_every,
        vocab=vocab,
    )
    train_drafter(target, drafter, samples, cfg.train, run)
    return keeper.best
