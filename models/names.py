"""The tensors a checkpoint must hold, name -> shape, from the config alone (torch-free).

The streamed export checks a checkpoint against this table before reading any weight (one error
listing every missing, misshaped or unexpected tensor); tests assert it equals the torch models' own
state dicts.

>>> from dflash_edge.models.spec import AttentionSpec
>>> sorted(layer_tensors("layers.0", AttentionSpec(8, 2, 1, 4, 1e-6, qk_norm=True), 16))[:2]
['layers.0.input_layernorm.weight', 'layers.0.mlp.down_proj.weight']
"""

from __future__ import annotations

from .families import family
from .spec import AttentionSpec, MoESpec


def layer_tensors(prefix: str, s: AttentionSpec, intermediate: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors (models/layers.DecoderLayer) under `prefix`."""
    q, kv, hidden = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.hidden_size
    out = {
        f"{prefix}.input_layernorm.weight": (hidden,),
        f"{prefix}.post_attention_layernorm.weight": (hidden,),
        f"{prefix}.mlp.gate_proj.weight": (intermediate, hidden),
        f"{prefix}.mlp.up_proj.weight": (intermediate, hidden),
        f"{prefix}.mlp.down_proj.weight": (hidden, intermediate),
    }
    attn = f"{prefix}.self_attn"
    for proj, rows in (("q", q), ("k", kv), ("v", kv)):
        out[f"{attn}.{proj}_proj.weight"] = (rows, hidden)
        if s.qkv_bias:
            out[f"{attn}.{proj}_proj.bias"] = (rows,)
    out[f"{attn}.o_proj.weight"] = (hidden, q)
    if s.o_bias:
        out[f"{attn}.o_proj.bias"] = (hidden,)
    if s.qk_norm:
        out[f"{attn}.q_norm.weight"] = out[f"{attn}.k_norm.weight"] = (s.head_dim,)
    return out


def target_tensors(cfg, spec: AttentionSpec) -> dict[str, tuple[int, ...]]:
    """A target checkpoint's tensors (Hugging Face names); a tied model's `lm_head.weight` is not
    required."""
    out = {
        "model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size),
        "model.norm.weight": (cfg.hidden_size,),
    }
    for i, moe in enumerate(family(cfg.model_type).mlp_specs(cfg)):
        prefix = f"model.layers.{i}"
        layer = layer_tensors(prefix, spec, cfg.intermediate_size)
        if moe is not None:  # a sparse layer: router + experts instead of the dense MLP
            layer = {
                k: v for k, v in layer.items() if not k.startswith(f"{prefix}.mlp.")
            } | moe_tensors(prefix, moe)
        out.update(layer)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return out


def moe_tensors(prefix: str, m: MoESpec) -> dict[str, tuple[int, ...]]:
    """A sparse layer's MLP tensors under `prefix` (`model.layers.N`), name -> shape."""
    out = {f"{prefix}.mlp.gate.weight": (m.num_experts, m.hidden_size)}
    for e in range(m.num_experts):
        expert = f"{prefix}.mlp.experts.{e}"
        out[f"{expert}.gate_proj.weight"] = out[f"{expert}.up_proj.weight"] = (
            m.intermediate,
            m.hidden_size,
        )
        out[f"{expert}.down_proj.weight"] = (m.hidden_size, m.intermediate)
    return out


def drafter_tensors(cfg, spec: AttentionSpec) -> dict[str, tuple[int, ...]]:
    """A z-lab drafter checkpoint's tensors (`layers.{i}.…`, `fc`, `hidden_norm`, `norm`: no
    `model.` prefix)."""
    out = {
        "fc.weight": (cfg.hidden_size, len(cfg.target_layer_ids) * cfg.hidden_size),
        "hidden_norm.weight": (cfg.hidden_size,),
        "norm.weight": (cfg.hidden_size,),
    }
    for i in range(cfg.num_hidden_layers):
        out.update(layer_tensors(f"layers.{i}", spec, cfg.intermediate_size))
    out.update(cfg.extra_tensors() if hasattr(cfg, "extra_tensors") else {})  # DFlash2's
    return out
