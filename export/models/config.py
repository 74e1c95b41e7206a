"""Target model configuration: one dataclass built from a Hugging Face `config.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from dflash_edge.runtime.errors import ModelFormatError

# Fields every supported family must declare (others have defaults below).
_REQUIRED = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads")


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
    num_key_value_heads: int = 0          # 0 -> same as num_attention_heads
    head_dim: int = 0                     # 0 -> hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None      # {"rope_type": "linear"|"llama3"|"yarn", ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        self.eos_token_id = list(self.eos_token_id or [])
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelFormatError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; fix config.json")

    @classmethod
    def from_dict(cls, raw: dict) -> "TargetConfig":
        missing = [k for k in _REQUIRED if raw.get(k) is None]
        if missing:
            raise ModelFormatError(f"config.json lacks required key(s) {missing}; is this a decoder-only LLM config?")
        raw = dict(raw)
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
            raise ModelFormatError(f"{path} not found: a target checkpoint directory needs config.json "
                                   f"(run `dflash-edge fetch` for the default model)")
        return cls.from_dict(json.loads(path.read_text()))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
