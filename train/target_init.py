"""Start a drafter from the target's own top layers instead of random weights.

With ~10^5 training tokens (what a CPU can regenerate in an hour) a randomly initialised drafter
learns little more than bigram statistics. Copying the target's layers right above the deepest
captured feature gives it the target's attention and MLP weights to start from:

* drafter layer i <- target layer `d + 1 + i`, where `d` is the deepest captured layer id;
* `fc` passes that layer's features through (identity on its slot, zero elsewhere) and
  `hidden_norm` is the first copied layer's input norm, so the context keys/values of drafter
  layer 0 are exactly the target's at that depth;
* where the target has no per-head q/k norms (Llama, Qwen2) and the drafter (Qwen3 style) has: their
  weights are set to the median per-head RMS of the target's queries and keys on the training
  features, so attention logits keep their scale;
* the final norm is the target's.
"""

from __future__ import annotations

import torch

from .conditioning import feature_rows


def copied_layer_ids(
    num_target_layers: int, deepest_capture: int, num_draft_layers: int
) -> list[int]:
    """Target layers copied into the drafter: the ones right above the deepest captured feature."""
    start = min(deepest_capture + 1, num_target_layers - num_draft_layers)
    if start < 0:
        raise ValueError(
            f"a {num_draft_layers}-layer drafter cannot copy layers of a "
            f"{num_target_layers}-layer target"
        )
    return list(range(start, start + num_draft_layers))


def _head_rms(x: torch.Tensor, head_dim: int) -> float:
    """Median RMS of the head vectors of `x` [T, n*head_dim]."""
    return x.view(x.shape[0], -1, head_dim).pow(2).mean(-1).sqrt().median().item()


@torch.no_grad()
def init_from_target(drafter, target, samples, max_rows: int = 4096) -> list[int]:
    """Overwrite `drafter` with the target's top layers (see module doc); returns the copied ids."""
    cfg = drafter.config
    ids = list(cfg.target_layer_ids)
    slot = ids.index(max(ids))
    copied = copied_layer_ids(cfg.num_target_layers, max(ids), cfg.num_hidden_layers)
    src_layers = target.model.layers
    H = cfg.hidden_size
    rescale_qk = hasattr(drafter.layers[0].self_attn, "q_norm") and not hasattr(
        src_layers[0].self_attn, "q_norm"
    )
    dev = target.lm_head.weight.device
    feats = (
        feature_rows(samples, max_rows)[:max_rows, slot * H : (slot + 1) * H].to(dev)
        if rescale_qk
        else None
    )
    for layer, tid in zip(drafter.layers, copied):
        src = src_layers[tid]
        own = layer.state_dict()
        for name, value in src.state_dict().items():
            if name in own and own[name].shape == value.shape:
                own[name].copy_(value)
        if rescale_qk:
            h = src.input_layernorm(feats)
            layer.self_attn.q_norm.weight.fill_(_head_rms(src.self_attn.q_proj(h), cfg.head_dim))
            layer.self_attn.k_norm.weight.fill_(_head_rms(src.self_attn.k_proj(h), cfg.head_dim))
    fc = torch.zeros_like(drafter.fc.weight)
    fc[:, slot * H : (slot + 1) * H] = torch.eye(H)
    drafter.fc.weight.copy_(fc)
    drafter.hidden_norm.weight.copy_(src_layers[copied[0]].input_layernorm.weight)
    drafter.norm.weight.copy_(target.model.norm.weight)
    return copied
