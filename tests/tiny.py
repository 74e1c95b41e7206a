"""Tiny random models built in-process (tier 1): HF configs for each family and a matching
drafter."""

from __future__ import annotations

# family -> extra config fields; shared dims below keep every model a few hundred KB.
FAMILY_EXTRAS = {
    "llama": {"tie_word_embeddings": True},
    "llama-untied-llama3rope": {
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "qwen2": {"tie_word_embeddings": True},
    "qwen2-yarn": {
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    },
    "qwen3": {"tie_word_embeddings": False, "head_dim": 16},
}

BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
)

# 4 layers of 4 query and 2 KV heads of 16: the dims of the family-table and hybrid-target tests
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
# a Qwen3.5 linear-attention (gated delta) layer at those dims
LINEAR_HEADS = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
)


def hf_model(variant: str, seed: int = 0, overrides: dict | None = None):
    """A randomly initialised transformers model of `variant` (a FAMILY_EXTRAS key), `overrides` on
    top."""
    import torch
    import transformers

    family = variant.split("-")[0]
    kwargs = {**BASE, **FAMILY_EXTRAS[variant], **(overrides or {})}
    scaling = kwargs.pop("rope_scaling", None)
    cls = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    }[family]
    config = getattr(transformers, cls[0])(**kwargs)
    if scaling:
        config.rope_parameters = {"rope_theta": kwargs["rope_theta"], **scaling}
    torch.manual_seed(seed)
    model = getattr(transformers, cls[1])(config).eval()
    with torch.no_grad():  # HF zero-inits norms/biases: randomise them so every weight is exercised
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_hf(model, path) -> str:
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


def add_tiny_tokenizer(path, vocab_size: int = 96) -> None:
    """A word-level tokenizer (`t0`..`tN`, whitespace-split) and a chat template for a tiny
    checkpoint."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(Path(path) / "tokenizer.json"))
    template = (
        "{% for m in messages %}t1 {{ m['content'] }} t2 {% endfor %}"
        "{% if add_generation_prompt %}t3{% endif %}"
    )
    (Path(path) / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


def check_two_token_distribution(
    target, prompt, sample_pair, n: int = 1500, top_k: int = 5
) -> None:
    """Assert that `sample_pair(seed) -> (t1, t2)` follows the target's exact joint p(t1, t2).

    Sampling at temperature 1 with top-k; chi-square p > 1e-3 and total variation < 0.08 over n
    seeds."""
    import numpy as np
    import torch
    from scipy.stats import chisquare

    from dflash_edge.runtime.sampling import SamplingParams, token_probs

    base = SamplingParams(temperature=1.0, top_k=top_k)
    with torch.no_grad():  # exact joint from the target
        room = len(prompt) + 16
        p1 = token_probs(
            target(torch.tensor([prompt]), target.new_cache(room)).logits[0, -1].numpy(), base
        )
        joint = {}
        for t1 in np.flatnonzero(p1):
            l2 = (
                target(torch.tensor([prompt + [int(t1)]]), target.new_cache(room))
                .logits[0, -1]
                .numpy()
            )
            for t2, q in enumerate(token_probs(l2, base)):
                if q > 0:
                    joint[(int(t1), t2)] = p1[t1] * q
    counts = dict.fromkeys(joint, 0)
    for seed in range(n):
        counts[tuple(sample_pair(seed))] += 1
    keys = sorted(joint)
    observed = np.array([counts[k] for k in keys], dtype=float)
    expected = np.array([joint[k] for k in keys]) * n
    assert observed.sum() == n
    assert chisquare(observed, expected).pvalue > 1e-3
    assert 0.5 * np.abs(observed / n - expected / n).sum() < 0.08  # total variation


def drafted_pairs(generator, prompt):
    """`sample_pair` for check_two_token_distribution: seed -> the first two tokens a runtime
    `generator` samples after `prompt` with its drafter on (temperature 1, top-k 5)."""
    from dflash_edge.runtime.sampling import SamplingParams

    def sample_pair(seed):
        params = SamplingParams(1.0, top_k=5, seed=seed)
        return generator.generate_ids(
            prompt, 2, params, draft="drafter", stop_token_ids=()
        ).token_ids

    return sample_pair
