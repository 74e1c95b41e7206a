"""Checkpoints in the layout their publishers ship, with random weights (test fixtures and the
real-size benchmark).

`PUBLISHED` holds the config.json of each published model field for field; `reduced()` shrinks only
the dimensions. `write_target` writes bf16 shards + `model.safetensors.index.json` tensor by tensor
(memory: one tensor at a time, so a Qwen3-0.6B-size checkpoint is written in bounded memory);
`write_zlab_drafter` writes a drafter folder as z-lab publishes one."""

from __future__ import annotations

import json
from pathlib import Path

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
PUBLISHED = {
    "Qwen3-0.6B": {
        **QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "tie_word_embeddings": True,
    },
    "Qwen3-4B": {
        **QWEN3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        **QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "tie_word_embeddings": False,
    },
    "Llama-3.1-8B": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
}
GENERATION = {
    "qwen3": {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    },
    "llama": {
        "bos_token_id": 128000,
        "do_sample": True,
        "eos_token_id": [128001, 128008, 128009],
        "temperature": 0.6,
        "top_p": 0.9,
    },
}
# z-lab/Qwen3-8B-DFlash-b16's config.json (num_target_layers, target_layer_ids and dims follow the
# target)
ZLAB_DRAFTER = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "block_size": 16,
    "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "layer_types": ["full_attention"] * 5,
    "max_position_embeddings": 40960,
    "max_window_layers": 5,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 36,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "transformers_version": "4.57.3",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 256,
    "max_window_layers": 6,
}


def reduced(name: str, **dims) -> dict:
    """The published config of `name` with only its dimensions replaced (TINY unless given)."""
    cfg = {
        **PUBLISHED[name],
        **{k: v for k, v in {**TINY, **dims}.items() if k in PUBLISHED[name] or k == "head_dim"},
    }
    if cfg["model_type"] == "llama":
        cfg.pop("head_dim", None)  # Llama-3.1 derives it (hidden / heads)
    return cfg


def _random(shape, name: str, gen):
    import torch

    if len(shape) == 1:  # norms ~1, biases ~0
        base = 0.0 if name.endswith("bias") else 1.0
        return (base + 0.1 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    return (0.02 * torch.randn(shape, generator=gen)).to(torch.bfloat16)


def _write_shards(
    root: Path, named_shapes: list[tuple[str, tuple]], shards: int, seed: int
) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    sizes = [2 * _numel(s) for _, s in named_shapes]
    per_shard = sum(sizes) / shards
    groups, acc = [[] for _ in range(shards)], 0
    for (name, shape), size in zip(named_shapes, sizes):
        groups[min(int(acc // per_shard), shards - 1)].append((name, shape))
        acc += size
    if shards == 1:
        save_file(
            {n: _random(s, n, gen) for n, s in groups[0]},
            str(root / "model.safetensors"),
            metadata={"format": "pt"},
        )
        return
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for (
            name,
            shape,
        ) in group:  # one shard's tensors at a time (a shard is ~1/shards of the model)
            tensors[name] = _random(shape, name, gen)
            weight_map[name] = fname
        save_file(tensors, str(root / fname), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_target(root, config: dict, shards: int = 3, seed: int = 0) -> Path:
    """A target folder as published: config.json, generation_config.json, bf16 shards + index,
    tokenizer."""
    import torch

    from dflash_edge.models import build_target
    from dflash_edge.models.config import TargetConfig

    from tiny import add_tiny_tokenizer

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (root / "generation_config.json").write_text(
        json.dumps(GENERATION[config["model_type"]], indent=2) + "\n"
    )
    cfg = TargetConfig.from_dict(config)
    with torch.device("meta"):
        model = build_target(cfg)
    skip = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    names = [(n, tuple(t.shape)) for n, t in model.state_dict().items() if n not in skip]
    _write_shards(root, names, shards, seed)
    add_tiny_tokenizer(root, cfg.vocab_size)
    return root


def zlab_config(
    target_config: dict,
    num_layers: int = 2,
    with_layer_ids: bool = False,
    mask_token_id: int = 5,
    **dims,
) -> dict:
    """z-lab's published drafter config.json resized to `target_config` (no target_layer_ids: z-lab
    derives them)."""
    t = target_config
    cfg = {
        **ZLAB_DRAFTER,
        **{
            k: t[k]
            for k in (
                "hidden_size",
                "num_key_value_heads",
                "num_attention_heads",
                "vocab_size",
                "rms_norm_eps",
                "rope_theta",
                "max_position_embeddings",
            )
        },
        "head_dim": t.get("head_dim", t["hidden_size"] // t["num_attention_heads"]),
        "intermediate_size": t["intermediate_size"],
        "num_hidden_layers": num_layers,
        "layer_types": ["full_attention"] * num_layers,
        "max_window_layers": num_layers,
        "num_target_layers": t["num_hidden_layers"],
        **dims,
    }
    cfg["dflash_config"] = {"mask_token_id": mask_token_id}
    if with_layer_ids:
        from dflash_edge.models.drafter import default_target_layer_ids

        cfg["dflash_config"]["target_layer_ids"] = default_target_layer_ids(
            t["num_hidden_layers"], num_layers
        )
    return cfg


def write_zlab_drafter(root, config: dict, seed: int = 1) -> Path:
    """A drafter folder as z-lab publishes one: config.json + one bf16 model.safetensors."""
    import torch

    from dflash_edge.models.drafter import DFlashDrafter, DraftConfig

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with torch.device("meta"):
        model = DFlashDrafter(DraftConfig.from_dict(config))
    _write_shards(root, [(n, tuple(t.shape)) for n, t in model.state_dict().items()], 1, seed)
    return root


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
