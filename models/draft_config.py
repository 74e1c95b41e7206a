"""The DFlash drafter's configuration in z-lab's `config.json` layout (torch-free: the streamed export reads it).

>>> cfg = DraftConfig.from_dict(json.loads(Path("drafter/config.json").read_text()))   # doctest: +SKIP
>>> default_target_layer_ids(28, 5)
[1, 7, 13, 19, 25]
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from dflash_edge.runtime.errors import ModelFormatError

from .config import TargetConfig

# SmolLM2's vocabulary has no mask token; we use a special token that chat never produces.
# (`<empty_output>`, id 16, a Jupyter-notebook marker from SmolLM2's code pre-training data.)
SMOLLM2_MASK_TOKEN = "<empty_output>"
# z-lab's published drafter class, named by reference (transformers' `repo--module.Class` form), so
# `AutoModel.from_pretrained(dir, trust_remote_code=True)` opens our drafters with their code, never a copy.
ZLAB_MODEL_CLASS = "z-lab/Qwen3-8B-DFlash-b16--dflash.DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule: spread evenly from layer 1 to layer L-3 (the middle layer for a 1-layer drafter)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DraftConfig(TargetConfig):
    """Qwen3-style dims plus the DFlash fields of a z-lab `config.json`."""

    block_size: int = 16
    num_target_layers: int = 0
    mask_token_id: int = 0
    target_layer_ids: list[int] = field(default_factory=list)

    @classmethod
    def for_target(cls, target: TargetConfig, *, num_layers: int = 1, block_size: int = 16,
                   mask_token_id: int, target_layer_ids: list[int] | None = None) -> "DraftConfig":
        """A drafter config sized to `target` (same width, heads and vocabulary)."""
        dims = {k: v for k, v in target.to_dict().items() if k not in ("model_type", "num_hidden_layers")}
        ids = target_layer_ids or default_target_layer_ids(target.num_hidden_layers, num_layers)
        return cls(model_type="qwen3", num_hidden_layers=num_layers, block_size=block_size,
                   num_target_layers=target.num_hidden_layers, mask_token_id=mask_token_id,
                   target_layer_ids=list(ids), **{**dims, "tie_word_embeddings": False})

    @classmethod
    def from_dict(cls, raw: dict) -> "DraftConfig":
        if "DFlashDraftModel" not in raw.get("architectures", []):
            raise ModelFormatError(f"config.json architectures={raw.get('architectures')} is not a DFlash drafter "
                                   f"(expected ['DFlashDraftModel'])")
        dflash = dict(raw.get("dflash_config") or {})
        if "mask_token_id" not in dflash:
            raise ModelFormatError("drafter config.json lacks dflash_config.mask_token_id")
        if "target_layer_ids" not in dflash:       # z-lab derives them when absent
            if not raw.get("num_target_layers") or not raw.get("num_hidden_layers"):
                raise ModelFormatError("drafter config.json has neither dflash_config.target_layer_ids nor "
                                       "num_target_layers (+ num_hidden_layers) to derive them from")
            dflash["target_layer_ids"] = default_target_layer_ids(raw["num_target_layers"], raw["num_hidden_layers"])
        merged = {**raw, "model_type": "qwen3", **dflash}
        return super().from_dict(merged)

    def to_dict(self) -> dict:
        """z-lab's config.json layout."""
        base = {f.name: getattr(self, f.name) for f in fields(TargetConfig)}
        base.pop("bos_token_id"), base.pop("eos_token_id")
        return {
            "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": ZLAB_MODEL_CLASS},
            **base, "model_type": "qwen3",
            "layer_types": ["full_attention"] * self.num_hidden_layers, "sliding_window": None,
            "block_size": self.block_size, "num_target_layers": self.num_target_layers,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
            "torch_dtype": "bfloat16",
        }

    def check_fits(self, target: TargetConfig) -> None:
        """Raise ModelFormatError unless this drafter can run on `target`."""
        pairs = [("hidden_size", self.hidden_size, target.hidden_size),
                 ("vocab_size", self.vocab_size, target.vocab_size),
                 ("num_target_layers", self.num_target_layers, target.num_hidden_layers)]
        for name, mine, theirs in pairs:
            if mine != theirs:
                raise ModelFormatError(f"drafter {name}={mine} does not fit the target's {theirs}; "
                                       f"use a drafter trained for this target (or `dflash-edge train`)")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if bad or not self.target_layer_ids:
            raise ModelFormatError(f"drafter target_layer_ids {self.target_layer_ids} out of range for a "
                                   f"{target.num_hidden_layers}-layer target (valid: 0..{target.num_hidden_layers - 1})")
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise ModelFormatError(f"drafter mask_token_id {self.mask_token_id} is outside the vocabulary "
                                   f"(size {target.vocab_size})")
