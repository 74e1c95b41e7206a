"""The training loop: AdamW on the drafter only, periodic atomic checkpoints, exact `--resume`.

The batch of step s is drawn from a generator seeded with (seed, s), so a resumed run sees the
same data as an uninterrupted one (and worker processes can build batches ahead, in any order).
A time budget (`max_minutes`) ends a run early, with the learning-rate decay squeezed to fit.

>>> cfg = TrainConfig(steps=400)  # doctest: +SKIP
>>> drafter = train_drafter(target, samples, cfg, ckpt_dir="/tmp/ck")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

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


def train_drafter(
    target,
    drafter,
    samples,
    cfg: TrainConfig,
    ckpt_dir: str | Path | None = None,
    resume: bool = False,
    on_eval=None,
    eval_every: int = 0,
    vocab: torch.Tensor | None = None,
):
    """Train `drafter` in place on `samples` (list of responses.Sample); returns the per-step
    losses.

    `on_eval(drafter, step)` (optional) is called every `eval_every` steps and at the end;
    `vocab` (optional) restricts the loss's softmax to those token ids (a reduced draft vocabulary).
    """
    from tqdm import tqdm

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
    embed = target.model.embed_tokens

    head = DraftHead.build(
        target.lm_head.weight, getattr(torch, resolve_dtype(cfg.head_dtype, cfg.device)), vocab
    )
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    ckpt = Path(ckpt_dir) / "last.pt" if ckpt_dir else None
    if ckpt:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
    start = load_checkpoint(ckpt, drafter, opt) if resume and ckpt and ckpt.exists() else 0
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
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup, spent)
        gen = (
            torch.Generator().manual_seed(cfg.seed * 7_000_003 + step)
            if cfg.sample_positions
            else None
        )
        out = dflash_loss(drafter, embed, head, batch.to(device), cfg.gamma, gen)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append(out.loss.item())
        s = stats.update(loss=losses[-1], tau=estimated_tau(out.correct, out.counted))
        bar.update(1)
        bar.set_postfix(loss=f"{s['loss']:.3f}", tau_est=f"{s['tau']:.2f}")
        if ckpt and time.monotonic() - last_save > cfg.ckpt_minutes * 60:
            save_checkpoint(ckpt, drafter, opt, step + 1, cfg)
            last_save = time.monotonic()
        if on_eval and eval_every and (step + 1) % eval_every == 0 and step + 1 < cfg.steps:
            on_eval(drafter.eval(), step + 1)
            drafter.train()
    else:
        step = cfg.steps
    bar.close()
    if ckpt:
        save_checkpoint(ckpt, drafter, opt, step, cfg)
    drafter.eval()
    if on_eval:
        on_eval(drafter, step)
    return losses
