"""`dflash-edge tune BUNDLE`: measure this machine and the drafter, store the best verify length in
the bundle.

The measurement is `runtime/calibrate.py` (decode, verify(k) for every k, one draft pass, the
drafter's acceptance on calibration prompts); the choice (k, or 0: do not draft) is written to
`tuned.json` next to the bundle's hashed files (atomically). `run`, `bench` and `Generator` seed
their adaptive policy with it; `--verify-len` / `verify_len=` override it.

    dflash-edge tune bundle/ [--prompts calib.jsonl] [--budget-s 120]
"""

from __future__ import annotations

import json
import sys

from ..runtime.errors import DflashEdgeError
from ..runtime.tuning import write_tuned
from .common import add_prompts_arg, add_provider_arg, add_thread_args, load_prompts, prompt_of


def add_arguments(p) -> None:

    p.add_argument("bundle", help="bundle directory (tuned.json is written into it)")
    add_prompts_arg(p, "bench", "calibration prompts")
    p.add_argument(
        "--budget-s", type=float, default=120.0, help="seconds to spend measuring (default 120)"
    )
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens per calibration prompt")
    p.add_argument("--context", type=int, default=256, help="cached positions while timing steps")
    add_provider_arg(p)
    add_thread_args(p)


def run(args) -> int:
    from ..runtime.calibrate import tune
    from ..runtime.generator import Generator

    if not args.budget_s > 0:
        raise DflashEdgeError(f"--budget-s {args.budget_s}: give a positive number of seconds")
    prompts = load_prompts(args.prompts)
    gen = Generator.load(
        args.bundle, provider=args.provider, threads=args.threads, spin=args.spin, use_tuned=False
    )
    tuned = tune(
        gen, [prompt_of(r) for r in prompts], args.budget_s, args.max_new_tokens, args.context, _bar
    )
    path = write_tuned(gen.bundle, tuned)
    print(
        json.dumps(
            {
                "tuned": str(path),
                "verify_len": tuned.verify_len,
                "decode_ms": tuned.decode_ms,
                "draft_ms": tuned.draft_ms,
                "expected_tokens_per_s": tuned.expected_tokens_per_s,
                "acceptance": tuned.acceptance,
                "calibration": tuned.calibration,
            },
            indent=2,
        )
    )
    return 0


def _bar(desc: str, total: int):
    """A progress bar on stderr (tqdm is not a runtime dependency: none without it)."""
    try:
        from tqdm import tqdm
    except ImportError:
        from ..runtime.calibrate import no_progress

        return no_progress(desc, total)
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
