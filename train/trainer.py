"""The training loop: AdamW on the drafter only, periodic atomic checkpoints, exact `--resume`.

The batch of step s is drawn from a generator seeded with (seed, s), so a resumed run sees the
same data as an uninterrupted one (and worker processes can build batches ahead, in any order).
A time budget (`max_minutes`) ends a run early, with the learning-rate decay squeezed to fit.

>>> cfg = TrainConfig(steps=400)  # doctest: +SKIP
>>> run = RunOptions(ckpt_dir="/tmp/ck")  # doctest: +SKIP
>>> losses = train_drafter(target, drafter, samples, cfg, run)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from .dataset import make_batch, sample_anchors
from .hardware import resolve_dtype
from .objective import DraftHead, dflash_loss, estimated_tau, lr_at


@dataclass
class TrainConfig:
    steps: int = 1000
    seqs_per_step: int = 8
    anchors_per_seq: int = 16
    gamma: float = 7.0
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    ckpt_minutes: float = 3.0
    head_dtype: str = (
        "auto"  # LM head precision in the loss: bf16 where faster (hardware.py), else fp32
    )
    sample_positions: bool = (
        True  # keep position k with prob. exp(-(k-1)/gamma) instead of weighting
    )
    ctx_window: int = 0  # >0: blocks see only this many context positions before their anchor ...
    ctx_window_steps: int = 0  # ... for the first N steps (a curriculum), then the whole context
    device: str = "cpu"  # where the drafter trains ("cuda": the target must already be there)
    loader_workers: int = 0  # >0: processes building batches ahead (a GPU outruns one CPU thread)
    max_minutes: float = 0.0  # >0: stop after this long (this process), LR decay fitted to it


class RunningStats:
    """Exponential moving averages for the progress bar."""

    def __init__(self, decay: float = 0.95):
        self.decay, self.values = decay, {}

    def update(self, **kw: float) -> dict[str, float]:
        for k, v in kw.items():
            old = self.values.get(k)
            self.values[k] = v if old is None else self.decay * old + (1 - self.decay) * v
        return self.values


def draw_batch(samples, cfg: TrainConfig, step: int, block: int, mask_id: int):
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    rows = torch.randint(len(samples), (cfg.seqs_per_step,), generator=gen).tolist()
    picked = [samples[r] for r in rows]
    anchors = [sample_anchors(s, cfg.anchors_per_seq, gen) for s in picked]
    window = cfg.ctx_window if step < cfg.ctx_window_steps else 0
    return make_batch(picked, anchors, block, mask_id, window)


class _StepBatches:
    """Map-style dataset: item i is the batch of step `start + i` (for a DataLoader's workers)."""

    def __init__(self, samples, cfg: TrainConfig, start: int, block: int, mask_id: int):
        self.samples, self.cfg, self.start, self.block, self.mask_id = (
            samples,
            cfg,
            start,
            block,
            mask_id,
        )

    def __len__(self) -> int:
        return max(self.cfg.steps - self.start, 0)

    def __getitem__(self, i: int):
        return draw_batch(self.samples, self.cfg, self.start + i, self.block, self.mask_id)


def step_batches(samples, cfg: TrainConfig, start: int, block: int, mask_id: int):
    """The batches of steps start..steps-1, in order: built inline, or ahead by `cfg.loader_workers`
    processes."""
    data = _StepBatches(samples, cfg, start, block, mask_id)
    if cfg.loader_workers <= 0:
        return (data[i] for i in range(len(data)))
    from torch.utils.data import DataLoader

    return iter(
        DataLoader(
            data,
            batch_size=None,
            shuffle=False,
            num_workers=cfg.loader_workers,
            pin_memory=cfg.device.startswith("cuda"),
            prefetch_factor=4,
        )
    )


def save_checkpoint(path: Path, drafter, opt, step: int, cfg: TrainConfig) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "drafter": drafter.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "draft_config": drafter.config.to_dict(),
            "train_config": asdict(cfg),
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(path: Path, drafter, opt) -> int:
    """Restore drafter + optimizer from `path` (onto the drafter's device); returns the next
    step."""
    blob = torch.load(path, weights_only=False, map_location=next(drafter.parameters()).device)
    if blob["draft_config"] != drafter.config.to_dict():
        raise ValueError(
            f"{path} was trained with another drafter config ({blob['draft_config']}); "
            f"resume with the same --layers/--block-size or use a new --work-dir"
        )
    drafter.load_state_dict(blob["drafter"])
    opt.load_state_dict(blob["optimizer"])
    return int(blob["step"])


@dataclass
class RunOptions:
    """Where and how one `train_drafter` run keeps state and reports.

    ckpt_dir: folder of `last.pt` (saved every `TrainConfig.ckpt_minutes` and at the end; None:
    no checkpoints); resume: continue from it; on_eval(drafter, step): called every `eval_every`
    steps and at the end; vocab: token ids the loss's softmax is restricted to (a reduced draft
    vocabulary).
    """

    ckpt_dir: str | Path | None = None
    resume: bool = False
    on_eval: Callable | None = None
    eval_every: int = 0
    vocab: torch.Tensor | None = None


class _Loop:
    """One run's optimiser, loss head and checkpoint file; `step` is one optimiser step."""

    def __init__(self, target, drafter, cfg: TrainConfig, run: RunOptions):
        self.drafter, self.cfg, self.run = drafter, cfg, run
        self.device = _place(target, drafter, cfg)
        self.embed = target.model.embed_tokens
        dtype = getattr(torch, resolve_dtype(cfg.head_dtype, cfg.device))
        self.head = DraftHead.build(target.lm_head.weight, dtype, run.vocab)
        self.params = [p for p in drafter.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(
            self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)
        )
        self.ckpt = Path(run.ckpt_dir) / "last.pt" if run.ckpt_dir else None
        if self.ckpt:
            self.ckpt.parent.mkdir(parents=True, exist_ok=True)

    def start(self) -> int:
        """The first step: the checkpoint's when resuming from one, else 0."""
        if self.run.resume and self.ckpt and self.ckpt.exists():
            return load_checkpoint(self.ckpt, self.drafter, self.opt)
        return 0

    def step(self, step: int, batch, spent: float):
        """One optimiser step on `batch` at the learning rate of `step` (`spent`: of the time
        budget); returns dflash_loss's output."""
        cfg = self.cfg
        for g in self.opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup, spent)
        seed = cfg.seed * 7_000_003 + step
        gen = torch.Generator().manual_seed(seed) if cfg.sample_positions else None
        out = dflash_loss(
            self.drafter, self.embed, self.head, batch.to(self.device), cfg.gamma, gen
        )
        self.opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        return out

    def save(self, step: int) -> None:
        if self.ckpt:
            save_checkpoint(self.ckpt, self.drafter, self.opt, step, self.cfg)

    def evaluate(self, step: int) -> None:
        """`run.on_eval` every `eval_every` steps before the last (the last is `finish`'s)."""
        run = self.run
        if run.on_eval and run.eval_every and step % run.eval_every == 0 and step < self.cfg.steps:
            run.on_eval(self.drafter.eval(), step)
            self.drafter.train()

    def finish(self, step: int) -> None:
        self.save(step)
        self.drafter.eval()
        if self.run.on_eval:
            self.run.on_eval(self.drafter, step)


def _place(target, drafter, cfg: TrainConfig) -> torch.device:
    """Freeze the target, move the drafter to `cfg.device` (the target must already be there)."""
    target.requires_grad_(False)  # frozen: no gradient buffers for the 49k-row embedding
    device = torch.device(cfg.device)
    if target.lm_head.weight.device != device:
        raise ValueError(
            f"the target is on {target.lm_head.weight.device} but training runs on {device}: "
            f"move it first (target.to({cfg.device!r}))"
        )
    drafter.to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the drafter's fp32 matmuls on tensor cores
    return device


def train_drafter(target, drafter, samples, cfg: TrainConfig, run: RunOptions = RunOptions()):
    """Train `drafter` in place on `samples` (list of responses.Sample); returns the per-step
    losses. `run` names the checkpoint folder, resuming, the evaluation hook and a reduced vocab.
    """
    from tqdm import tqdm

    loop = _Loop(target, drafter, cfg, run)
    start = loop.start()
    block, mask_id = drafter.config.block_size, drafter.config.mask_token_id
    stats, began = RunningStats(), time.monotonic()
    last_save, budget = began, cfg.max_minutes * 60
    drafter.train()
    bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step")
    losses, step = [], start
    for step, batch in enumerate(step_batches(samples, cfg, start, block, mask_id), start):
        spent = (time.monotonic() - began) / budget if budget else 0.0
        if spent >= 1.0:
            bar.write(
                f"time budget of {cfg.max_minutes:g} min spent: stopping at step {step} of "
                f"{cfg.steps}"
            )
            break
        out = loop.step(step, batch, spent)
        losses.append(out.loss.item())
        s = stats.update(loss=losses[-1], tau=estimated_tau(out.correct, out.counted))
        bar.update(1)
        bar.set_postfix(loss=f"{s['loss']:.3f}", tau_est=f"{s['tau']:.2f}")
        if loop.ckpt and time.monotonic() - last_save > cfg.ckpt_minutes * 60:
            loop.save(step + 1)
            last_save = time.monotonic()
        loop.evaluate(step + 1)
    else:
        step = cfg.steps
    bar.close()
    loop.finish(step)
    return losses
