"""Tier 2: the real default model (SmolLM2-135M-Instruct) end to end in the torch reference."""

import pytest
import torch

from dflash_edge.models.reference_loop import (
    GenerationConfig,
    speculative_generate,
    target_generate,
)
from dflash_edge.models.resolve_drafter import random_drafter
from dflash_edge.runtime.tokenizer import ChatTokenizer

pytestmark = pytest.mark.tier2

PROMPTS = [
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "List three uses of a paperclip.",
]


def test_logits_match_transformers(smollm2_dir, smollm2):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tok = ChatTokenizer.from_dir(smollm2_dir)
    ids = torch.tensor([tok.encode_chat([{"role": "user", "content": PROMPTS[0]}])])
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        out = smollm2(ids, smollm2.new_cache(ids.shape[1]), capture=(15,))
    assert (ref.logits - out.logits).abs().max().item() <= 1e-3
    assert (ref.hidden_states[16] - out.hidden).abs().max().item() <= 1e-3


def test_chat_answer_is_sensible(smollm2_dir, smollm2):
    tok = ChatTokenizer.from_dir(smollm2_dir)
    ids = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    res = target_generate(smollm2, ids, GenerationConfig(max_new_tokens=24))
    assert "Paris" in tok.decode(res.token_ids) and res.finish_reason == "stop"


def test_speculative_equals_target_greedy(smollm2_dir, smollm2):
    tok = ChatTokenizer.from_dir(smollm2_dir)
    drafter = random_drafter(smollm2, tok, num_layers=1, block_size=16)
    gen = GenerationConfig(max_new_tokens=64, stop_token_ids=())  # all 64 tokens, no early stop
    for prompt in PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        want = target_generate(smollm2, ids, gen)
        got = speculative_generate(smollm2, drafter, ids, gen)
        assert len(want.token_ids) == 64
        assert got.token_ids == want.token_ids
