"""The torch reference loop is lossless: greedy identity, sampling identity and distribution (tier
1)."""

import pytest

from dflash_edge.models import load_target, reference_loop
from dflash_edge.models.drafter import DraftConfig, new_drafter
from dflash_edge.models.reference_loop import (
    GenerationConfig,
    speculative_generate,
    target_generate,
)
from dflash_edge.runtime.errors import ContextOverflowError
from dflash_edge.runtime.sampling import SamplingParams

from runtime_cases import SAMPLERS
from tiny import check_two_token_distribution

PROMPTS = [[5, 17, 33, 2 + 40, 8], [90, 1, 64, 12, 77, 3, 3, 19, 45, 60, 11], [7]]


def _drafter(target, block):
    cfg = DraftConfig.for_target(target.config, num_layers=2, block_size=block, mask_token_id=5)
    return new_drafter(cfg, seed=block)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("block", [2, 4, 8, 16])
def test_greedy_identity_random_drafter(tiny_checkpoints, variant, block):
    target = load_target(tiny_checkpoints[variant][1])
    drafter = _drafter(target, block)
    for prompt in PROMPTS:
        ref = target_generate(target, prompt, GenerationConfig(max_new_tokens=40))
        stop = ref.token_ids[17]  # a stop token the output is known to reach
        gen = GenerationConfig(max_new_tokens=40, stop_token_ids=(stop,))
        want = target_generate(target, prompt, gen)
        got = speculative_generate(target, drafter, prompt, gen)
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason == "stop" and got.token_ids[-1] == stop


@pytest.mark.parametrize("block", [2, 4, 8, 16])
@pytest.mark.parametrize("hit", [1.0, 0.8])
def test_greedy_identity_with_long_acceptances(tiny_target, oracle, block, hit):
    drafter = _drafter(tiny_target, block)
    for i, prompt in enumerate(PROMPTS):
        ref = target_generate(tiny_target, prompt, GenerationConfig(max_new_tokens=60))
        oracle(reference_loop, prompt + ref.token_ids, hit, seed=i)
        stop = ref.token_ids[45]
        gen = GenerationConfig(max_new_tokens=60, stop_token_ids=(stop,))
        want = target_generate(tiny_target, prompt, gen)
        got = speculative_generate(tiny_target, drafter, prompt, gen)
        assert got.token_ids == want.token_ids
        assert max(got.acceptance_lengths) > 1 and all(
            1 <= a <= block for a in got.acceptance_lengths
        )
        if hit == 1.0:
            assert all(a == block for a in got.acceptance_lengths[:-1])


def test_budget_ends_inside_a_block(tiny_target, oracle):
    drafter = _drafter(tiny_target, 8)
    ref = target_generate(
        tiny_target, PROMPTS[0], GenerationConfig(max_new_tokens=50, stop_token_ids=())
    )
    oracle(reference_loop, PROMPTS[0] + ref.token_ids, 1.0)
    got = speculative_generate(
        tiny_target, drafter, PROMPTS[0], GenerationConfig(max_new_tokens=13, stop_token_ids=())
    )
    assert got.token_ids == ref.token_ids[:13] and got.finish_reason == "length"


@pytest.mark.parametrize("sampling", SAMPLERS)
def test_sampling_same_seed_same_tokens(tiny_target, oracle, sampling):
    drafter = _drafter(tiny_target, 8)
    gen = GenerationConfig(max_new_tokens=48, sampling=sampling, stop_token_ids=())
    want = target_generate(tiny_target, PROMPTS[1], gen)
    oracle(reference_loop, PROMPTS[1] + want.token_ids, 0.9)
    got = speculative_generate(tiny_target, drafter, PROMPTS[1], gen)
    assert got.token_ids == want.token_ids and max(got.acceptance_lengths) > 1


def test_sampling_distribution_matches_target(tiny_target):
    """Joint distribution of the first two sampled tokens over many seeds vs the exact target
    one."""
    drafter = _drafter(tiny_target, 4)

    def sample_pair(seed):
        gen = GenerationConfig(
            max_new_tokens=2, sampling=SamplingParams(1.0, top_k=5, seed=seed), stop_token_ids=()
        )
        return speculative_generate(tiny_target, drafter, PROMPTS[0], gen).token_ids

    check_two_token_distribution(tiny_target, PROMPTS[0], sample_pair)


def test_prompt_longer_than_context_names_the_limit(tiny_target):
    with pytest.raises(
        ContextOverflowError, match="the prompt has 20 tokens but the context holds 16"
    ):
        speculative_generate(
            tiny_target, _drafter(tiny_target, 4), list(range(20)), GenerationConfig(max_context=16)
        )


def test_generation_stops_cleanly_at_context_end(tiny_target):
    gen = GenerationConfig(max_new_tokens=100, max_context=24, stop_token_ids=())
    got = speculative_generate(tiny_target, _drafter(tiny_target, 4), PROMPTS[1], gen)
    want = target_generate(tiny_target, PROMPTS[1], gen)
    assert got.finish_reason == want.finish_reason == "context"
    assert got.token_ids == want.token_ids and len(got.token_ids) == 24 - len(PROMPTS[1])


def test_block_size_below_two_is_refused(tiny_target):
    with pytest.raises(ValueError, match="block_size 1 < 2"):
        speculative_generate(
            tiny_target, _drafter(tiny_target, 4), PROMPTS[0], GenerationConfig(block_size=1)
        )
