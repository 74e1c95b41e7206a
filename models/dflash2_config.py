"""A DFlash2 drafter's configuration (z-lab's current generation; torch-free).

A DFlash2 drafter is a DFlash drafter (draft_config.py) plus, per layer, two grouped dynamic causal
convolutions (`attention_conv`, `mlp_conv`: taps within the block only) and a `candidate_selector`
that scores pairs of consecutive top-k candidates. Its `config.json` says
`architectures: ["DFlash2DraftModel"]` (or `Qwen3DFlash2DraftModel`); the DFlash2 fields are read
from `dflash_config` first, then the top level (z-lab's `_draft_value`).

>>> cfg = read_draft_config(json.loads(Path("d/config.json").read_text()))  # doctest: +SKIP
>>> sorted(DFLASH2_FIELDS)[:2]
['conv_group_size', 'conv_kernel_size']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import ModelFormatError
from .draft_config import DraftConfig

DFLASH2_ARCHITECTURES = ("DFlash2DraftModel", "Qwen3DFlash2DraftModel")
# field -> default where a config omits it (None: required)
DFLASH2_FIELDS = {
    "conv_group_size": None,
    "conv_kernel_size": None,
    "selector_rank": None,
    "selector_top_k": None,
    "input_embedding_scale": 1.0,
    "output_multiplier": 1.0,
    "final_logit_softcapping": None,
}
# read from dflash_config first, then the top level (the DFlash fields too)
_LOOKED_UP = (*DFLASH2_FIELDS, "mask_token_id", "target_layer_ids", "block_size")


@dataclass
class DFlash2Config(DraftConfig):
    """DraftConfig plus the conv and selector sizes of a DFlash2 drafter."""

    ARCHITECTURES = DFLASH2_ARCHITECTURES
    conv_group_size: int = 16
    conv_kernel_size: int = 2
    selector_rank: int = 256
    selector_top_k: int = 16
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self):
        super().__post_init__()
        self.check_dflash2()

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    def check_dflash2(self) -> None:
        ints = ("conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k")
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelFormatError(
                    f"drafter config.json {name}={v!r}: a DFlash2 drafter needs a positive integer"
                )
        if self.hidden_size % self.conv_group_size:
            raise ModelFormatError(
                f"drafter config.json conv_group_size={self.conv_group_size} does not divide "
                f"hidden_size={self.hidden_size}; the conv groups must tile the hidden state"
            )
        if self.selector_top_k > self.vocab_size:
            raise ModelFormatError(
                f"drafter config.json selector_top_k={self.selector_top_k} is larger than the "
                f"vocabulary ({self.vocab_size})"
            )

    @classmethod
    def from_dict(cls, raw: dict) -> "DFlash2Config":
        dflash = dict(raw.get("dflash_config") or {})
        for key in _LOOKED_UP:
            if key not in dflash and raw.get(key) is not None:
                dflash[key] = raw[key]
        required = [k for k, default in DFLASH2_FIELDS.items() if default is None]
        missing = [k for k in required if k not in dflash and k != "final_logit_softcapping"]
        if missing:
            raise ModelFormatError(
                f"DFlash2 drafter config.json lacks {missing} (in dflash_config or at the top "
                f"level); is it a complete DFlash2DraftModel config?"
            )
        return super().from_dict({**raw, "dflash_config": dflash})

    def to_dict(self) -> dict:
        """z-lab's DFlash2 config.json layout (the DFlash2 fields inside `dflash_config`)."""
        out = super().to_dict()
        out["architectures"] = [DFLASH2_ARCHITECTURES[0]]
        out.pop("auto_map", None)  # z-lab's DFlash1 class cannot open it
        out["dflash_config"].update(
            {name: getattr(self, name) for name in (*DFLASH2_FIELDS, "block_size")}
        )
        return out

    def extra_tensors(self) -> dict[str, tuple[int, ...]]:
        """The tensors of a DFlash2 checkpoint beyond a DFlash drafter's (names.py)."""
        h, k = self.hidden_size, self.conv_kernel_size
        out = {}
        for i in range(self.num_hidden_layers):
            for conv in ("attention_conv", "mlp_conv"):
                out[f"layers.{i}.{conv}.base_kernel"] = (2, k, h)
                out[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * k * self.conv_groups, h)
        rank, vocab = self.selector_rank, self.vocab_size
        out["candidate_selector.hidden_projection.weight"] = (rank, h)
        out["candidate_selector.predecessor_codebook"] = (vocab, rank)
        out["candidate_selector.successor_codebook"] = (vocab, rank)
        return out


def read_draft_config(raw: dict) -> DraftConfig:
    """A drafter config.json's config: DFlash2Config for a DFlash2 drafter, else DraftConfig."""
    if set(raw.get("architectures") or []) & set(DFLASH2_ARCHITECTURES):
        return DFlash2Config.from_dict(raw)
    return DraftConfig.from_dict(raw)


def open_drafter_files(path: Path, target_config=None):
    """(config, Checkpoint of its headers) of a z-lab drafter folder; with `target_config`, checked
    to fit that target (export/sources.open_drafter and drafter.load_drafter both start here)."""
    from .checkpoint import Checkpoint

    cfg_file = Path(path) / "config.json"
    if not cfg_file.exists():
        raise ModelFormatError(
            f"{cfg_file} not found: a DFlash drafter directory needs config.json + "
            "model.safetensors"
        )
    cfg = read_draft_config(json.loads(cfg_file.read_text()))
    if target_config is not None:
        cfg.check_fits(target_config)
    ckpt = Checkpoint.open(path)
    ckpt.check_dtypes(cfg.torch_dtype)
    return cfg, ckpt
