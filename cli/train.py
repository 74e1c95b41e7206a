"""`dflash-edge train`: distil a DFlash drafter for a target (prompts -> responses -> training).

    dflash-edge train --target default --out data/drafters/smollm2-135m-instruct \\
        --work-dir /tmp/dfe-work
    dflash-edge train ... --resume          # continue an interrupted run where it stopped

Needs torch (the `train` extra); the train modules are imported when the command runs, so `--help`
works without it and a run without it names the extra to install.
"""

from __future__ import annotations

import os

from ..models.fetch import cache_home
from ..train.hardware import resolve_device, resolve_dtype
from ..train.prompts import PromptSpec
from .common import add_model_args

# Shared CPUs: OpenMP threads that spin while waiting steal the cores other processes need (and a
# descheduled thread stalls every barrier). Must be set before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def add_arguments(p) -> None:

    p.epilog = 'needs torch: pip install "dflash-edge[train]"'
    add_model_args(p, draft=False)
    p.add_argument("--out", required=True, help="directory for the trained drafter (z-lab format)")
    p.add_argument(
        "--work-dir",
        help="prompts, response shards, checkpoints (default: $DFLASH_EDGE_HOME/train/<out name>)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from the work dir's last checkpoint"
    )
    p.add_argument(
        "--data-only",
        action="store_true",
        help="build prompts, responses and held-out responses in the work dir, then stop (train "
        "later)",
    )
    p.add_argument("--layers", type=int, default=1, help="draft decoder layers (1-5)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--capture", default="1,8,14,20,27", help="target layer ids whose features feed the drafter"
    )
    p.add_argument("--prompts", type=int, default=1500, help="training prompts to build")
    p.add_argument("--max-new-tokens", type=int, default=128, help="response length budget")
    p.add_argument("--gen-batch", type=int, default=32, help="prompts decoded together")
    p.add_argument(
        "--gen-dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="target precision while generating responses (auto: bf16 where this CPU runs it "
        "faster)",
    )
    p.add_argument(
        "--init",
        default="random",
        choices=("random", "target"),
        help="drafter start: random weights, or the target's layers above the deepest captured "
        "feature",
    )
    p.add_argument(
        "--no-feature-scale",
        dest="feature_scale",
        action="store_false",
        help="train fc on raw target features (default: per-channel unit scale, folded into fc on "
        "save)",
    )
    p.add_argument(
        "--sampled-fraction",
        type=float,
        default=0.1,
        help="responses sampled (T=0.7) instead of greedy",
    )
    p.add_argument(
        "--max-shards",
        type=int,
        default=0,
        help="generate and train on the first N response shards only (0: all)",
    )
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seqs-per-step", type=int, default=8)
    p.add_argument("--anchors", type=int, default=16, help="random anchors (blocks) per sequence")
    p.add_argument(
        "--gamma", type=float, default=7.0, help="loss decay exp(-(k-1)/gamma) over block positions"
    )
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument(
        "--ctx-window",
        type=int,
        default=0,
        help="curriculum: blocks see only the last N context positions ... (0: always the whole "
        "context)",
    )
    p.add_argument("--ctx-window-steps", type=int, default=0, help="... during the first N steps")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        help="softmax the loss over the N most frequent tokens (0: full)",
    )
    p.add_argument(
        "--soft-topk",
        type=int,
        default=0,
        help="distil the target's top-k next-token distributions instead of its hard tokens (0: "
        "hard labels)",
    )
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    p.add_argument("--eval-prompts", type=int, default=60)
    p.add_argument("--ckpt-minutes", type=float, default=3.0)
    p.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="training time budget for this process: stop (and evaluate, save) when spent, "
        "with the learning-rate decay fitted to it (0: run all --steps)",
    )
    p.add_argument(
        "--loader-workers",
        type=int,
        default=None,
        help="processes building batches ahead (default: 0 on a CPU, up to 8 beside a GPU)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--device",
        default="auto",
        help="where the target generates and the drafter trains: cpu, cuda, cuda:N, or auto (a "
        "GPU if torch sees one)",
    )
    p.add_argument("--seed", type=int, default=0)


def config_from_args(a):
    """The parsed arguments as a train.recipe.RecipeConfig."""
    from ..train.recipe import RecipeConfig
    from ..train.responses import GenSpec
    from ..train.trainer import TrainConfig

    device = resolve_device(a.device)
    # on a GPU generation is launch-bound: fp32 costs nothing there and gives the target's exact
    # greedy tokens
    gen_dtype = (
        "float32" if device != "cpu" and a.gen_dtype == "auto" else resolve_dtype(a.gen_dtype)
    )
    workers = (
        a.loader_workers
        if a.loader_workers is not None
        else (0 if device == "cpu" else max(0, min(8, (os.cpu_count() or 1) - 2)))
    )
    work = a.work_dir or str(cache_home() / "train" / Path(a.out).name)
    capture = tuple(int(x) for x in a.capture.split(","))
    return RecipeConfig(
        target=a.target,
        work_dir=work,
        out=a.out,
        layers=a.layers,
        block_size=a.block_size,
        draft_vocab=a.draft_vocab,
        soft_topk=a.soft_topk,
        scale_features=a.feature_scale,
        init=a.init,
        max_shards=a.max_shards,
        eval_prompts=a.eval_prompts,
        eval_every=a.eval_every,
        prompts=PromptSpec(num_train=a.prompts, seed=a.seed),
        gen=GenSpec(
            capture=capture,
            max_new_tokens=a.max_new_tokens,
            batch_size=a.gen_batch,
            sampled_fraction=a.sampled_fraction,
            seed=a.seed,
            dtype=gen_dtype,
        ),
        train=TrainConfig(
            steps=a.steps,
            seqs_per_step=a.seqs_per_step,
            anchors_per_seq=a.anchors,
            gamma=a.gamma,
            lr=a.lr,
            seed=a.seed,
            ckpt_minutes=a.ckpt_minutes,
            head_dtype=resolve_dtype("auto", device),
            ctx_window=a.ctx_window,
            ctx_window_steps=a.ctx_window_steps,
            device=device,
            loader_workers=workers,
            max_minutes=a.max_minutes,
        ),
        num_threads=a.threads,
        device=device,
        command="dflash-edge " + " ".join(sys.argv[1:]),
    )


def run(args) -> int:
    from ..train.recipe import run_recipe

    best = run_recipe(config_from_args(args), resume=args.resume, data_only=args.data_only)
    if args.data_only:
        return 0
    print(f"best held-out tau {best.get('tau', 0):.3f} (step {best.get('step')}) -> {args.out}")
    return 0
