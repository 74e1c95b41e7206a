"""Target model configuration: one dataclass built from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..runtime.errors import ModelFormatError
from .families import available, family

# Fields every supported family must declare (others have defaults below).
_REQUIRED = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass
class TargetConfig:
    """Decoder-only transformer dims shared by the llama, qwen2 and qwen3 families.

    >>> cfg = TargetConfig.from_dict({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    ...     "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})
    >>> cfg.head_dim, cfg.num_key_value_heads
    (8, 4)
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int = 0  # 0 -> same as num_attention_heads
    head_dim: int = 0  # 0 -> hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3"|"yarn", ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    torch_dtype: str | None = (
        None  # the checkpoint's declared dtype ("bfloat16", ...), checked on load
    )
    hidden_act: str = "silu"  # the only MLP activation the families here use
    # mixture of experts (qwen3_moe; models/families/qwen3_moe.py): 0 experts = every layer dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = (
        1  # layer i is sparse when (i + 1) % step == 0 and i not in mlp_only_layers
    )
    mlp_only_layers: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        self.eos_token_id = list(self.eos_token_id or [])
        if self.hidden_act != "silu":
            raise ModelFormatError(
                f"config.json hidden_act={self.hidden_act!r} is not supported (only 'silu': "
                f"the SwiGLU MLP of llama/qwen2/qwen3); this checkpoint needs another architecture"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ModelFormatError(
                f"config.json num_experts_per_tok={self.num_experts_per_tok} must be in 1.."
                f"num_experts={self.num_experts}; fix config.json"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelFormatError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; fix config.json"
            )

    @classmethod
    def from_dict(cls, raw: dict) -> "TargetConfig":
        own = family(raw["model_type"]).Config if raw.get("model_type") in available() else cls
        if cls is TargetConfig and own is not cls:  # a family with fields of its own (Qwen3.5)
            return own.from_dict(raw)
        missing = [k for k in _REQUIRED if raw.get(k) is None]
        if missing:
            raise ModelFormatError(
                f"config.json lacks required key(s) {missing}; is this a decoder-only LLM config?"
            )
        raw = dict(raw)
        _refuse_unsupported_moe(raw)
        _refuse_sliding_window(raw)
        # transformers 5 writes num_local_experts
        raw.setdefault("num_experts", raw.get("num_local_experts"))
        raw.setdefault("torch_dtype", raw.get("dtype"))  # transformers >= 5 writes `dtype`
        # transformers >= 5 folds rope_theta and rope_scaling into one `rope_parameters` dict.
        rope = raw.pop("rope_parameters", None)
        if rope:
            rope = dict(rope)
            raw.setdefault("rope_theta", rope.pop("rope_theta", 10000.0))
            if rope.get("rope_type", "default") != "default":
                raw.setdefault("rope_scaling", rope)
        scaling = raw.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            raw["rope_scaling"] = None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names and v is not None})

    @classmethod
    def from_json(cls, path: str | Path) -> "TargetConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ModelFormatError(
                f"{path} not found: a target checkpoint directory needs config.json "
                f"(run `dflash-edge fetch` for the default model)"
            )
        raw = json.loads(path.read_text())
        gen = path.parent / "generation_config.json"
        if gen.is_file():  # published models list their chat-turn eos ids here (Llama-3.1: 3 ids)
            raw["eos_token_id"] = _merge_ids(
                raw.get("eos_token_id"), json.loads(gen.read_text()).get("eos_token_id")
            )
        return cls.from_dict(raw)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _merge_ids(*values) -> list[int]:
    """Ids from several `eos_token_id` fields (int, list or None), in order, without repeats."""
    out: list[int] = []
    for value in values:
        for tid in [value] if isinstance(value, int) else value or []:
            if tid not in out:
                out.append(tid)
    return out


def _refuse_unsupported_moe(raw: dict) -> None:
    """Mixture-of-experts variants whose layers this package does not compute, refused by name with
    the reason."""
    kind = raw.get("model_type")
    if kind == "gpt_oss":
        raise ModelFormatError(
            "model_type 'gpt_oss' is not supported: its attention has learned sinks and its "
            "experts are MXFP4 with a clamped, biased SwiGLU; only qwen3_moe experts are computed "
            "here"
        )
    if raw.get("shared_expert_intermediate_size") or kind == "qwen2_moe":
        raise ModelFormatError(
            f"model_type {kind!r} is not supported: shared_expert_intermediate_size="
            f"{raw.get('shared_expert_intermediate_size')} adds a gated shared expert to every "
            f"MoE layer, which only qwen3_moe (no shared expert) leaves out; use a qwen3_moe model"
        )


# The attention kinds a `layer_types` entry may name; a target here runs only full attention, a
# DFlash
# drafter may also slide (models/draft_config.py), and hybrid families add their own kinds.
LAYER_TYPES = ("full_attention", "sliding_attention")
LINEAR = "linear_attention"  # a hybrid family's linear-attention layers (families/qwen3_5.py)


def layer_types_of(raw: dict, known: tuple[str, ...] = LAYER_TYPES) -> list[str]:
    """Each layer's attention kind, as transformers decides it: from `layer_types`, or (older
    configs) from `use_sliding_window`, `sliding_window` and `max_window_layers`. Unknown kinds are
    refused by name.

    >>> layer_types_of(
    ...     {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}
    ... )
    ['sliding_attention', 'full_attention']
    """
    n = raw.get("num_hidden_layers") or 0
    types = raw.get("layer_types")
    if types is None and raw.get("use_sliding_window") and raw.get("sliding_window"):
        types = [
            "full_attention" if i < raw.get("max_window_layers", n) else "sliding_attention"
            for i in range(n)
        ]
    types = list(types or ["full_attention"] * n)
    unknown = sorted({kind for kind in types if kind not in known})
    if unknown:
        raise ModelFormatError(
            f"config.json layer_types names unknown layer type(s) {unknown}; known: "
            f"{', '.join(known)}"
        )
    if len(types) != n:
        raise ModelFormatError(
            f"config.json layer_types has {len(types)} entries for num_hidden_layers={n}; "
            f"give one per layer"
        )
    return types


def _refuse_sliding_window(raw: dict) -> None:
    """Every target layer here attends to the whole context: refuse, by name, a config whose layers
    slide (DFlash drafters may: draft_config.DraftConfig parses their windows itself)."""
    types = layer_types_of(raw)
    sliding = [i for i, kind in enumerate(types) if kind != "full_attention"]
    if sliding:
        raise ModelFormatError(
            f"config.json layer_types marks layer(s) {sliding} as {types[sliding[0]]!r} "
            f"(sliding_window={raw.get('sliding_window')}): only full attention is supported, "
            f"and running these layers with it would change the model's output"
        )
