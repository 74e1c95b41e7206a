"""A random DFlash2 drafter folder in z-lab's published layout (config.json + model.safetensors),
sized to a target config: what the DFlash2 tests load, export and run."""

from __future__ import annotations

import json
from pathlib import Path


def write_dflash2(
    path: Path,
    target_cfg,
    *,
    layers: int = 2,
    block: int = 8,
    window: int = 48,
    rank: int = 8,
    top_k: int = 16,
    group: int = 16,
    mask_token_id: int = 5,
    seed: int = 0,
    conv_std: float = 0.3,
    softcap: float | None = 20.0,
    multiplier: float = 0.75,
    embed_scale: float | None = None,
    scale_mlp: float = 1.0,
) -> Path:
    """Write the folder; `scale_mlp` multiplies layer 0's gate and up projections (its MLP product
    then overflows float16, as a real DFlash2 body does a few layers in: vLLM #55250)."""
    from safetensors.torch import save_file

    from dflash_edge.models.dflash2_config import DFlash2Config
    from dflash_edge.models.dflash2_weights import new_dflash2
    from dflash_edge.models.draft_config import default_target_layer_ids

    dflash = {
        "block_size": block,
        "conv_group_size": group,
        "conv_kernel_size": 2,
        "mask_token_id": mask_token_id,
        "selector_rank": rank,
        "selector_top_k": top_k,
        "output_multiplier": multiplier,
        "target_layer_ids": default_target_layer_ids(target_cfg.num_hidden_layers, layers),
        **({"final_logit_softcapping": softcap} if softcap else {}),
        **({"input_embedding_scale": embed_scale} if embed_scale else {}),
    }
    raw = {
        "architectures": ["DFlash2DraftModel"],
        "attention_bias": False,
        "is_causal": False,
        "dflash_config": dflash,
        "dtype": "float32",
        "head_dim": target_cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": target_cfg.intermediate_size,
        "layer_types": ["sliding_attention"] * layers,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "num_target_layers": target_cfg.num_hidden_layers,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_parameters": {"rope_theta": target_cfg.rope_theta, "rope_type": "default"},
        "sliding_window": window,
        "tie_word_embeddings": False,
        "use_sliding_window": True,
        "vocab_size": target_cfg.vocab_size,
    }
    model = new_dflash2(DFlash2Config.from_dict(raw), seed=seed, conv_std=conv_std)
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    for name in ("gate_proj", "up_proj"):
        tensors[f"layers.0.mlp.{name}.weight"] *= scale_mlp
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
