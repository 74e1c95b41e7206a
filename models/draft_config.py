"""The DFlash drafter's configuration in z-lab's `config.json` layout (torch-free: the streamed
export reads it).

Sliding-window layers (`layer_types` entries "sliding_attention", window `sliding_window` = W), as
z-lab's reference (dflash/model.py `_attention_mask`), vLLM
(`qwen3_dflash._resolve_layer_attention`) and SGLang (`models/dflash.py`: RadixAttention DECODER
with window_left = W - 1) all apply them:

- keys are placed by absolute position: cached context [0, start), new context [start, start + C),
  then the block [start + C, start + C + B); every block position p is a query;
- a full-attention layer is non-causal: every query sees every context position and the whole block;
- a sliding layer is causal, the window counting the query itself: the query at p sees the keys at
  positions k with p - W < k <= p, i.e. the last W - 1 - j context positions before the block plus
  block positions 0..j for block row j. The block therefore never needs more than the W - 1 context
  positions before `start + C`: that is all a sliding layer's cache keeps (runtime/kv.WindowKV);
- `is_causal` (z-lab, vLLM) or `dflash_config.causal` (vLLM) overrides causality for every layer; a
  non-causal sliding layer also hides keys W or more positions *after* the query (z-lab's rule).
  vLLM's `dflash_config.use_swa` / `swa_window_size` (MiMo drafters) is refused by name.

>>> raw = json.loads(Path("drafter/config.json").read_text())  # doctest: +SKIP
>>> cfg = DraftConfig.from_dict(raw)  # doctest: +SKIP
>>> default_target_layer_ids(28, 5)
[1, 7, 13, 19, 25]
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..runtime.errors import ModelFormatError
from .config import TargetConfig, layer_types_of

FULL, SLIDING = "full_attention", "sliding_attention"

# SmolLM2's vocabulary has no mask token; we use a special token that chat never produces.
# (`<empty_output>`, id 16, a Jupyter-notebook marker from SmolLM2's code pre-training data.)
SMOLLM2_MASK_TOKEN = "<empty_output>"
# z-lab's published drafter class, named by reference (transformers' `repo--module.Class` form), so
# `AutoModel.from_pretrained(dir, trust_remote_code=True)` opens our drafters with their code, never
# a copy.
ZLAB_MODEL_CLASS = "z-lab/Qwen3-8B-DFlash-b16--dflash.DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule: spread evenly from layer 1 to layer L-3 (the middle layer for a 1-layer
    drafter)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [
        int(round(start + i * (end - start) / (num_draft_layers - 1)))
        for i in range(num_draft_layers)
    ]


# config.json keys describing windows: parsed here, kept from the target's refusal of sliding layers
_WINDOW_KEYS = (
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "is_causal",
    "causal",
)


@dataclass
class DraftConfig(TargetConfig):
    """Qwen3-style dims plus the DFlash fields of a z-lab `config.json`."""

    ARCHITECTURES = ("DFlashDraftModel",)  # `architectures` names this class reads

    block_size: int = 16
    num_target_layers: int = 0
    mask_token_id: int = 0
    target_layer_ids: list[int] = field(default_factory=list)
    # per draft layer: FULL or SLIDING ([] -> all FULL)
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None  # W of the SLIDING layers (None when none slides)
    causal: bool | None = (
        None  # `is_causal` / `dflash_config.causal`; None: sliding layers causal, full not
    )

    def __post_init__(self):
        super().__post_init__()
        self.layer_types = list(self.layer_types or [FULL] * self.num_hidden_layers)
        self.check_windows()

    def check_windows(self) -> None:
        """Raise ModelFormatError unless `layer_types` / `sliding_window` describe this drafter's
        layers."""
        layer_types_of(
            {"num_hidden_layers": self.num_hidden_layers, "layer_types": self.layer_types},
            (FULL, SLIDING),
        )
        w = self.sliding_window
        if SLIDING in self.layer_types and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise ModelFormatError(
                f"drafter config.json sliding_window={w!r}: layer_types has "
                f"'sliding_attention' layers, which need a positive integer window"
            )

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s window W (None: full attention)."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def layer_causal(self, layer: int) -> bool:
        """Whether layer `layer`'s block queries are causal (see the module docstring)."""
        return self.layer_types[layer] == SLIDING if self.causal is None else self.causal

    @property
    def window_layers(self) -> list[int]:
        """Indices of the sliding layers (their context cache keeps W - 1 positions)."""
        return [i for i, kind in enumerate(self.layer_types) if kind == SLIDING]

    @classmethod
    def for_target(
        cls,
        target: TargetConfig,
        *,
        num_layers: int = 1,
        block_size: int = 16,
        mask_token_id: int,
        target_layer_ids: list[int] | None = None,
    ) -> "DraftConfig":
        """A drafter config sized to `target` (same width, heads and vocabulary)."""
        dims = {
            k: v
            for k, v in target.to_dict().items()
            if k not in ("model_type", "num_hidden_layers")
        }
        ids = target_layer_ids or default_target_layer_ids(target.num_hidden_layers, num_layers)
        return cls(
            model_type="qwen3",
            num_hidden_layers=num_layers,
            block_size=block_size,
            num_target_layers=target.num_hidden_layers,
            mask_token_id=mask_token_id,
            target_layer_ids=list(ids),
            **{**dims, "tie_word_embeddings": False},
        )

    @classmethod
    def from_dict(cls, raw: dict) -> "DraftConfig":
        archs = raw.get("architectures") or []
        if not set(archs) & set(cls.ARCHITECTURES):  # (dflash2_config.read_draft_config: either)
            raise ModelFormatError(
                f"config.json architectures={archs} is not a DFlash drafter "
                f"(expected ['DFlashDraftModel'] or ['DFlash2DraftModel'])"
            )
        dflash = dict(raw.get("dflash_config") or {})
        if "mask_token_id" not in dflash:
            raise ModelFormatError("drafter config.json lacks dflash_config.mask_token_id")
        if "target_layer_ids" not in dflash:  # z-lab derives them when absent
            if not raw.get("num_target_layers") or not raw.get("num_hidden_layers"):
                raise ModelFormatError(
                    "drafter config.json has neither dflash_config.target_layer_ids nor "
                    "num_target_layers (+ num_hidden_layers) to derive them from"
                )
            dflash["target_layer_ids"] = default_target_layer_ids(
                raw["num_target_layers"], raw["num_hidden_layers"]
            )
        if dflash.get("use_swa"):
            raise ModelFormatError(
                "drafter config.json dflash_config.use_swa is not supported (vLLM's MiMo form); "
                "declare the windows as layer_types 'sliding_attention' + sliding_window"
            )
        merged = {**raw, "model_type": "qwen3", **dflash}
        kinds = layer_types_of(merged, (FULL, SLIDING))
        causal = merged.get("is_causal", dflash.get("causal"))
        window = merged.get("sliding_window") if SLIDING in kinds else None
        # (the target's
        cfg = super().from_dict({k: v for k, v in merged.items() if k not in _WINDOW_KEYS})
        # refusal of windows)
        cfg.layer_types, cfg.sliding_window, cfg.causal = (
            kinds,
            window,
            causal,
        )
        cfg.check_windows()
        return cfg

    def to_dict(self) -> dict:
        """z-lab's config.json layout."""
        base = {f.name: getattr(self, f.name) for f in fields(TargetConfig)}
        base.pop("bos_token_id"), base.pop("eos_token_id")
        return {
            "architectures": ["DFlashDraftModel"],
            "auto_map": {"AutoModel": ZLAB_MODEL_CLASS},
            **base,
            "model_type": "qwen3",
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            **({} if self.causal is None else {"is_causal": self.causal}),
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
            "torch_dtype": "bfloat16",
        }

    def check_fits(self, target: TargetConfig) -> None:
        """Raise ModelFormatError unless this drafter can run on `target`."""
        pairs = [
            ("hidden_size", self.hidden_size, target.hidden_size),
            ("vocab_size", self.vocab_size, target.vocab_size),
            ("num_target_layers", self.num_target_layers, target.num_hidden_layers),
        ]
        for name, mine, theirs in pairs:
            if mine != theirs:
                raise ModelFormatError(
                    f"drafter {name}={mine} does not fit the target's {theirs}; "
                    f"use a drafter trained for this target (or `dflash-edge train`)"
                )
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if bad or not self.target_layer_ids:
            raise ModelFormatError(
                f"drafter target_layer_ids {self.target_layer_ids} out of range for a "
                f"{target.num_hidden_layers}-layer target (valid: "
                f"0..{target.num_hidden_layers - 1})"
            )
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise ModelFormatError(
                f"drafter mask_token_id {self.mask_token_id} is outside the vocabulary "
                f"(size {target.vocab_size})"
            )
