"""Qwen3.5 family (hybrid): torch-free configuration and tensor names (the torch layers:
models/linear_attention.py).

Qwen3.5 stacks Gated DeltaNet linear-attention layers (`layer_types` "linear_attention": a causal
depthwise conv of kernel 4 with a conv state, then the gated delta rule over a fixed-size recurrent
state) with, every fourth layer, gated full attention (q_proj also yields an output gate; per-head
zero-centred RMSNorm on q and k; RoPE on the first `partial_rotary_factor` (0.25) of each head).
Every RMSNorm but the linear layers' gated one is zero-centred (`x * (1 + w)`).

Published layouts: `model_type` "qwen3_5" (image-text: `text_config`, weights under
`model.language_model.*`, the vision tower under `model.visual.*`, ignored for text) and
"qwen3_5_text" (weights under `model.*`).

>>> cfg = HybridConfig.from_dict({"model_type": "qwen3_5", "text_config": {
...     "model_type": "qwen3_5_text", "vocab_size": 64, "hidden_size": 32,
...     "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
...     "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
...     "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8}})
>>> cfg.layer_types, cfg.rotary_dim, cfg.weight_prefix
(['linear_attention', 'linear_attention', 'linear_attention', 'full_attention'], 4, 'model.language_model')
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ...devices.dims import LinearDims
from ...runtime.errors import ModelFormatError
from .. import dense_family
from ..config import LINEAR, TargetConfig, layer_types_of
from ..spec import AttentionSpec
from . import INTERFACE

# what qwen3_5_text takes with `from .qwen3_5 import *`
__all__ = list(INTERFACE)
FULL = "full_attention"
GGUF = None
MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
# config.json keys parsed here (the dense TargetConfig would refuse or drop them)
_HYBRID_KEYS = ("layer_types", "full_attention_interval", "partial_rotary_factor")


@dataclass
class HybridConfig(TargetConfig):
    """TargetConfig plus the linear-attention dims and per-layer kinds of a Qwen3.5 text model."""

    layer_types: list[str] = field(default_factory=list)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    partial_rotary_factor: float = 0.25
    weight_prefix: str = "model"  # "model.language_model" in the image-text layout

    def __post_init__(self):
        super().__post_init__()
        self.layer_types = list(
            self.layer_types
            or [LINEAR if (i + 1) % 4 else FULL for i in range(self.num_hidden_layers)]
        )
        layer_types_of(
            {"num_hidden_layers": self.num_hidden_layers, "layer_types": self.layer_types},
            (FULL, LINEAR),
        )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ModelFormatError(
                f"config.json linear_num_value_heads={self.linear_num_value_heads} is not a "
                f"multiple of linear_num_key_heads={self.linear_num_key_heads}; fix config.json"
            )
        if not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ModelFormatError(
                f"config.json partial_rotary_factor={self.partial_rotary_factor} gives "
                f"{self.rotary_dim} rotary dims of head_dim {self.head_dim}; expected an even "
                f"number in 2..head_dim"
            )

    def dense_view(self) -> TargetConfig:
        """The dims a dense config shares (what a drafter is sized from:
        `DraftConfig.for_target`)."""
        return TargetConfig(**{f.name: getattr(self, f.name) for f in fields(TargetConfig)})

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR]

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv (and of its state): q, k and v of every linear head."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def from_dict(cls, raw: dict) -> "HybridConfig":
        """From a `qwen3_5` (image-text, `text_config`) or `qwen3_5_text` config.json."""
        prefix = "model"
        if raw.get("model_type") == "qwen3_5":
            if not isinstance(raw.get("text_config"), dict):
                raise ModelFormatError(
                    "config.json model_type 'qwen3_5' lacks its text_config section"
                )
            outer = {
                k: raw[k]
                for k in (
                    "tie_word_embeddings",
                    "eos_token_id",
                    "bos_token_id",
                    "dtype",
                    "torch_dtype",
                )
                if k in raw
            }
            raw, prefix = {**outer, **raw["text_config"]}, "model.language_model"
        if raw.get("model_type") not in MODEL_TYPES:
            raise ModelFormatError(
                f"config.json model_type {raw.get('model_type')!r} is not Qwen3.5 "
                f"(expected one of {MODEL_TYPES})"
            )
        rope = dict(raw.get("rope_parameters") or {})
        partial = raw.get("partial_rotary_factor", rope.pop("partial_rotary_factor", 0.25))
        # text positions are equal on all three axes
        for key in (
            "mrope_section",
            "mrope_interleaved",
        ):
            rope.pop(key, None)
        kinds = layer_types_of(
            {**raw, "layer_types": raw.get("layer_types") or _interval_types(raw)}, (FULL, LINEAR)
        )
        dense = {k: v for k, v in raw.items() if k not in _HYBRID_KEYS}
        cfg = super().from_dict({**dense, "model_type": "qwen3_5", "rope_parameters": rope or None})
        cfg.layer_types, cfg.partial_rotary_factor, cfg.weight_prefix = kinds, partial, prefix
        cfg.__post_init__()
        return cfg


Config = HybridConfig


def _interval_types(raw: dict) -> list[str]:
    """transformers' default when `layer_types` is absent: full attention every
    `full_attention_interval` layers."""
    every = raw.get("full_attention_interval", 4)
    return [LINEAR if (i + 1) % every else FULL for i in range(raw.get("num_hidden_layers") or 0)]


def attention_spec(cfg: HybridConfig) -> AttentionSpec:
    """The full-attention layers' spec (q_proj is twice as wide: queries and their output gate)."""
    return dense_family.attention(cfg, qk_norm=True)


def tensors(cfg: HybridConfig) -> dict[str, tuple[int, ...]]:
    """The text model's tensors (published names, under `cfg.weight_prefix`), name -> shape."""
    p, h = cfg.weight_prefix, cfg.hidden_size
    out = {f"{p}.embed_tokens.weight": (cfg.vocab_size, h), f"{p}.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i, kind in enumerate(cfg.layer_types):
        layer = f"{p}.layers.{i}"
        out.update(
            {
                f"{layer}.input_layernorm.weight": (h,),
                f"{layer}.post_attention_layernorm.weight": (h,),
                f"{layer}.mlp.gate_proj.weight": (cfg.intermediate_size, h),
                f"{layer}.mlp.up_proj.weight": (cfg.intermediate_size, h),
                f"{layer}.mlp.down_proj.weight": (h, cfg.intermediate_size),
            }
        )
        out.update(
            _linear_tensors(cfg, f"{layer}.linear_attn")
            if kind == LINEAR
            else _attention_tensors(cfg, f"{layer}.self_attn")
        )
    return out


def _linear_tensors(cfg: HybridConfig, name: str) -> dict[str, tuple[int, ...]]:
    h, heads = cfg.hidden_size, cfg.linear_num_value_heads
    return {
        f"{name}.in_proj_qkv.weight": (cfg.conv_dim, h),
        f"{name}.in_proj_z.weight": (cfg.value_dim, h),
        f"{name}.in_proj_b.weight": (heads, h),
        f"{name}.in_proj_a.weight": (heads, h),
        f"{name}.conv1d.weight": (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim),
        f"{name}.dt_bias": (heads,),
        f"{name}.A_log": (heads,),
        f"{name}.norm.weight": (cfg.linear_value_head_dim,),
        f"{name}.out_proj.weight": (h, cfg.value_dim),
    }


def _attention_tensors(cfg: HybridConfig, name: str) -> dict[str, tuple[int, ...]]:
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = {
        f"{name}.q_proj.weight": (2 * q, h),
        f"{name}.k_proj.weight": (kv, h),
        f"{name}.v_proj.weight": (kv, h),
        f"{name}.o_proj.weight": (h, q),
        f"{name}.q_norm.weight": (d,),
        f"{name}.k_norm.weight": (d,),
    }
    if cfg.attention_bias:
        out.update(
            {
                f"{name}.q_proj.bias": (2 * q,),
                f"{name}.k_proj.bias": (kv,),
                f"{name}.v_proj.bias": (kv,),
                f"{name}.o_proj.bias": (h,),
            }
        )
    return out


def manifest_fields(cfg: HybridConfig) -> dict:
    """A hybrid target's keys for the bundle manifest's `model` (runtime/io_tables.hybrid_dims reads
    them)."""
    return {
        "layer_types": list(cfg.layer_types),
        "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        **{
            f"linear_{k}": getattr(cfg, f"linear_{k}")
            for k in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim")
        },
    }


def mlp_specs(cfg: HybridConfig) -> tuple:
    """Every layer's MLP is dense."""
    return (None,) * cfg.num_hidden_layers


def check_tensors(cfg: HybridConfig, names) -> None:
    """Nothing beyond the per-tensor name and shape check."""


def text_prefix(cfg: HybridConfig) -> str:
    return cfg.weight_prefix


def dense_view(cfg: HybridConfig) -> TargetConfig:
    return cfg.dense_view()


def planner_dims(cfg: HybridConfig):
    """The dense dims plus the linear-attention layers; q_proj also yields the output gate."""
    linear = LinearDims(
        num_layers=len(cfg.linear_layers),
        num_key_heads=cfg.linear_num_key_heads,
        num_value_heads=cfg.linear_num_value_heads,
        key_head_dim=cfg.linear_key_head_dim,
        value_head_dim=cfg.linear_value_head_dim,
        conv_kernel=cfg.linear_conv_kernel_dim,
    )
    return dense_family.planner_dims(cfg, linear=linear, gated=True)


def reference(cfg: HybridConfig):
    """The torch reference (models/linear_attention.py's HybridModel) with random weights."""
    from ..linear_attention import HybridModel

    return HybridModel(cfg)
