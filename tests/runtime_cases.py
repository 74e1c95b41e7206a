"""Inputs the runtime tests share (test_runtime.py, test_adapt.py, test_proposals.py): prompts,
samplers, the torch reference run.

A helper, not a test module: pytest collects nothing here (not named test_*).
"""

from __future__ import annotations

from dflash_edge.runtime.sampling import SamplingParams

from fixtures_bundle import MAX_CONTEXT

PROMPTS = [
    [5, 17, 33, 42, 8],
    [90, 1, 64, 12, 77, 3, 3, 19, 45, 60, 11],
    [7],
    [(13 * i) % 90 + 3 for i in range(29)],
]  # 29 tokens: 3 full chunks + an overlapped one
# a 6-token cycle: prompt lookup proposes from the first step
REPEATING = [5, 17, 33, 42, 8, 61] * 2 + [5, 17, 33]
SAMPLERS = [
    SamplingParams(temperature=1.0, seed=3),
    SamplingParams(temperature=0.7, top_k=12, seed=4),
    SamplingParams(temperature=1.3, top_p=0.8, seed=5),
]


def reference(
    tb,
    prompt,
    max_new_tokens=40,
    sampling=SamplingParams(),
    stop=None,
    max_context=MAX_CONTEXT,
    speculative=False,
):
    """The torch reference loop's run of `prompt` on a TinyBundle's target (and drafter, if
    `speculative`)."""
    from dflash_edge.models.reference_loop import (
        GenerationConfig,
        speculative_generate,
        target_generate,
    )

    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        max_context=max_context,
        stop_token_ids=stop,
    )
    if speculative:
        return speculative_generate(tb.target, tb.drafter, prompt, gen)
    return target_generate(tb.target, prompt, gen)
