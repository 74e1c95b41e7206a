"""Measure a loaded Generator here and choose its verify length: what `dflash-edge tune` stores.

Within `budget_s` seconds (about a third on step times, the rest on acceptance):
  decode     the target step of T = 1 (plain decoding)
  verify(k)  the target step of T = k + 1 for every k = 1..B-1, interleaved round-robin, medians
             (made non-decreasing in T: on a busy machine noise must not make a longer step
             look cheaper)
  draft      one drafter pass
  S(j)       the share of drafter steps whose first j drafts the target accepts, on calibration
             prompts (greedy, full block)
then picks k (or 0: do not draft) with the most expected tokens/s (tuning.py). `write_tuned`
stores it.

>>> gen = Generator.load("bundle/", use_tuned=False)          # doctest: +SKIP
>>> tuned = tune(gen, ["Why is the sky blue?"], budget_s=60)  # doctest: +SKIP
>>> tune(gen, prompts, 60, watch=Watch(progress=tqdm_bar))     # doctest: +SKIP
>>> write_tuned(gen.bundle, tuned)                            # doctest: +SKIP
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import DflashEdgeError
from .lattice import lattice_drafter
from .sampling import SamplingParams
from .session import default_threads
from .tuning import Tuned, choose_verify_len, manifest_digest, monotone, survival

# progress(description, total) -> an object with update(n) and close() (e.g. a tqdm bar)
Progress = Callable[[str, int], object]


@dataclass(frozen=True)
class Watch:
    """How a measurement reports and keeps time: `progress` bars (None: silent) and `clock`
    (seconds, monotonic: it times the steps and the budget; tests pass a scripted one)."""

    progress: Progress | None = None
    clock: Callable[[], float] = time.perf_counter

    def bar(self, desc: str, total: int):
        """A progress bar for `total` units (a silent one without `progress`)."""
        return (self.progress or no_progress)(desc, total)


def tune(
    gen,
    prompts: list[str],
    budget_s: float,
    max_new_tokens: int = 96,
    context: int = 256,
    watch: Watch = Watch(),
) -> Tuned:
    """Measure `gen` here and return the `Tuned` choice (not yet written: `tuning.write_tuned`);
    `watch`: the progress bars and the clock."""
    if not prompts:
        raise DflashEdgeError(
            "no calibration prompts: pass --prompts FILE.jsonl with at least one 'prompt'"
        )
    t0 = watch.clock()
    gen.generate_ids([1, 2, 3], 4, draft="drafter")  # warm-up: lazy initialisation
    times, ctx = step_times(gen, context, seconds=budget_s / 3, watch=watch)
    accepted, used = acceptance(gen, prompts, max_new_tokens, deadline=t0 + budget_s, watch=watch)
    drafts = gen.block_size - 1
    target_ms = [round(t, 3) for t in monotone([times[k] for k in range(drafts + 1)])]  # T = 1..B
    verify_ms = {k: target_ms[k] for k in range(1, drafts + 1)}
    s = survival(accepted, drafts)
    best, rates = choose_verify_len(target_ms[0], times["draft"], verify_ms, s)
    return Tuned(
        verify_len=best,
        decode_ms=target_ms[0],
        draft_ms=times["draft"],
        verify_ms=verify_ms,
        acceptance=s,
        manifest_sha256=manifest_digest(gen.bundle.manifest),
        expected_tokens_per_s={k: round(r, 3) for k, r in rates.items()},
        calibration={
            "prompts": used,
            "steps": len(accepted),
            "max_new_tokens": max_new_tokens,
            "context": ctx,
            "seconds": round(watch.clock() - t0, 1),
            "machine": machine_info(0),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )


def step_times(
    gen,
    context: int,
    seconds: float,
    min_rounds: int = 3,
    max_rounds: int = 200,
    watch: Watch = Watch(),
) -> tuple[dict, int]:
    """Median ms of the target step for k = 0..B-1 (T = k + 1) and of one draft, interleaved
    round-robin; (times by k and "draft", the cached positions they were measured at)."""
    tgt, drf, block = gen.target, gen.drafter, gen.block_size
    ctx = max(block + 1, min(context, gen.max_context - max(block, gen.prefill_chunk)))
    vocab = gen.bundle.model["vocab_size"]
    # any in-vocabulary prefix: costs only
    ids = [(7 * i + 3) % min(vocab, 1000) for i in range(ctx)]
    gen._prefill(ids, SamplingParams(), reuse=False)  # a real prefix in both caches

    walk = lattice_drafter(drf, SamplingParams())  # a DFlash2 drafter: + its host walk

    def draft():
        drf.kv.pos = ctx - block  # B new context rows, as after a long accept
        walk.draft(ids[-1], ctx)

    cases = {k: (lambda k=k: tgt.forward(k + 1, ctx)) for k in range(block)}
    cases["draft"] = draft
    samples: dict = {name: [] for name in cases}
    clock = watch.clock
    deadline = clock() + seconds
    bar = watch.bar("tune: step times", max_rounds)
    for n in range(max_rounds):
        for name, fn in cases.items():
            t = clock()
            fn()
            samples[name].append(clock() - t)
        bar.update(1)
        if n + 1 >= min_rounds and clock() > deadline:
            break
    bar.close()
    return {
        name: round(1e3 * statistics.median(v[1:] if len(v) > 1 else v), 3)
        for name, v in samples.items()
    }, ctx


def acceptance(
    gen,
    prompts: list[str],
    max_new_tokens: int,
    deadline: float,
    watch: Watch = Watch(),
) -> tuple[list[int], int]:
    """Drafts accepted per drafter step (full block, greedy) over prompts until `deadline` (at least
    one prompt); (drafts accepted per step, prompts used)."""
    accepted, used = [], 0
    bar = watch.bar("tune: acceptance", len(prompts))
    for prompt in prompts:
        res = gen.generate(prompt, max_new_tokens=max_new_tokens, draft="drafter")
        accepted += [n - 1 for n in res.stats.acceptance_lengths]
        used += 1
        bar.update(1)
        if watch.clock() > deadline:
            break
    bar.close()
    return accepted, used


def machine_info(threads: int) -> dict:
    """What a measurement ran on: platform, CPU model, usable CPUs, intra-op threads, versions."""
    import onnxruntime

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus_usable": default_threads(),
        "intra_op_threads": threads or default_threads(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
    }


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def no_progress(desc: str, total: int) -> _NoBar:
    """The silent `Progress`."""
    return _NoBar()
