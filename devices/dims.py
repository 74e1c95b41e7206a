"""Model dims for the planner: presets (devices/presets.json), parameter counts. A checkpoint's
dims come from its family (models.planner_dims, a higher floor): callers pass them in.

>>> target, drafter, tau = preset("qwen3-8b")             # doctest: +SKIP
>>> target.total_params / 1e9, target.active_params / 1e9  # doctest: +SKIP
(8.19, 8.19)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import DeviceError

PRESETS_FILE = Path(__file__).resolve().parent / "presets.json"


@dataclass(frozen=True)
class LinearDims:
    """The Gated DeltaNet (linear-attention) layers of a hybrid target such as Qwen3.5: no KV cache,
    but per layer a conv state (the last `conv_kernel - 1` inputs of q, k and v) and a recurrent
    state [Hv, Dk, Dv], fixed in size whatever the context."""

    num_layers: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:  # q, k and v channels of the depthwise conv
        return 2 * self.num_key_heads * self.key_head_dim + self.value_dim

    def params(self, hidden: int) -> int:
        """All linear layers' weights: in_proj_qkv, in_proj_z, in_proj_b/a, out_proj, the conv
        taps."""
        per_layer = (
            hidden * (self.conv_dim + self.value_dim + 2 * self.num_value_heads)
            + self.value_dim * hidden
            + self.conv_dim * self.conv_kernel
        )
        return self.num_layers * per_layer

    @property
    def state_elements(self) -> int:  # all layers: conv state + recurrent state
        recurrent = self.num_value_heads * self.key_head_dim * self.value_head_dim
        return self.num_layers * (self.conv_dim * (self.conv_kernel - 1) + recurrent)

    @property
    def row_elements(self) -> int:  # all layers, one token: the rows a call returns for rollback
        nv = self.num_value_heads
        return self.num_layers * (
            self.conv_dim + nv * (self.key_head_dim + self.value_head_dim + 1)
        )

    @property
    # all layers, one token: decay, rank-1 update and read of the state
    def token_flops(
        self,
    ) -> int:
        return self.num_layers * 6 * self.num_value_heads * self.key_head_dim * self.value_head_dim


@dataclass(frozen=True)
class ModelDims:
    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    num_experts: int = 0  # MoE: experts per layer (0: dense)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    dense_layers: int = 0  # MoE: layers whose MLP is dense (mlp_only_layers, decoder_sparse_step)
    linear: LinearDims | None = (
        None  # hybrid: its linear-attention layers (of num_layers; the rest are full)
    )
    attn_output_gate: bool = (
        False  # gated full attention (Qwen3.5): q_proj also yields the output gate
    )

    def __post_init__(self):
        if isinstance(self.linear, dict):  # from presets.json
            object.__setattr__(self, "linear", LinearDims(**self.linear))
        if self.linear and not 0 < self.linear.num_layers < self.num_layers:
            raise DeviceError(
                f"linear.num_layers={self.linear.num_layers} must be in 1..{self.num_layers - 1} "
                f"(num_layers minus at least one full-attention layer); fix the preset or config"
            )

    @property
    def full_layers(self) -> int:  # layers with a KV cache
        return self.num_layers - (self.linear.num_layers if self.linear else 0)

    @property
    def mixer_params(self) -> int:  # all layers' attention (full and linear) weights
        return self.full_layers * self.attn_params + (
            self.linear.params(self.hidden_size) if self.linear else 0
        )

    @property
    def attn_params(self) -> int:  # per layer: q, k, v, o projections
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return (
            3 if self.attn_output_gate else 2
        ) * self.hidden_size * q + 2 * self.hidden_size * kv

    def mlp_params(self, active: bool) -> int:  # per layer
        if not self.num_experts:
            return 3 * self.hidden_size * self.intermediate_size
        experts = self.experts_per_token if active else self.num_experts
        return (
            experts * 3 * self.hidden_size * self.moe_intermediate_size
            + self.hidden_size * self.num_experts
        )

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def layer_params(self, active: bool = False) -> int:
        """All decoder layers' linear weights (every expert, or only the active ones)."""
        return self.mixer_params + self.mlps(self.mlp_params(active))

    def mlps(self, sparse_mlp: float) -> float:
        """Every layer's MLP weights when a sparse layer's is `sparse_mlp` (dense layers of an MoE
        model: their own)."""
        dense = self.dense_layers if self.num_experts else 0
        return (
            self.num_layers - dense
        ) * sparse_mlp + dense * 3 * self.hidden_size * self.intermediate_size

    @property
    def total_params(self) -> int:
        return self.layer_params() + self.embed_params * (1 if self.tie_word_embeddings else 2)

    @property
    def active_params(self) -> int:
        """Weights one token touches: active layers + LM head (+ one embedding row, ignored)."""
        return self.layer_params(active=True) + self.embed_params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.full_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def state_bytes(self, dtype_bytes: int = 4) -> int:
        """The linear layers' conv + recurrent states (0 for a dense model): the same at any
        context."""
        return self.linear.state_elements * dtype_bytes if self.linear else 0


@dataclass(frozen=True)
class DraftDims:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_target_layer_ids: int
    block_size: int
    # a DFlash2 drafter's (0 for DFlash1): conv taps K and groups G, selector rank, vocabulary
    conv_kernel: int = 0
    conv_groups: int = 0
    selector_rank: int = 0
    vocab_size: int = 0

    @property
    def wide_params(self) -> int:
        """DFlash2's conv (2 per layer: projection [2KG, H] + base taps [2, K, H]) and selector
        projection [rank, H] weights: kept at >= 8 bits and run per block position."""
        h, k = self.hidden_size, self.conv_kernel
        conv = self.num_layers * 2 * (2 * k * self.conv_groups * h + 2 * k * h)
        return conv + self.selector_rank * h

    @property
    def codebook_params(self) -> int:
        """DFlash2's two selector codebooks [V, rank] (float tensors, gathered: no FLOPs)."""
        return 2 * self.vocab_size * self.selector_rank

    @property
    def layer_params(self) -> int:
        h, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        return self.num_layers * (2 * h * q + 2 * h * kv + 3 * h * self.intermediate_size)

    def fc_params(self, target_hidden: int) -> int:
        return self.num_target_layer_ids * target_hidden * self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def load_presets(path: str | Path = PRESETS_FILE) -> dict:
    return {k: v for k, v in json.loads(Path(path).read_text()).items() if not k.startswith("_")}


def preset(name: str, path: str | Path = PRESETS_FILE) -> tuple[ModelDims, DraftDims, float]:
    """(target dims, drafter dims, assumed acceptance length) of a named preset."""
    presets = load_presets(path)
    if name not in presets:
        raise DeviceError(f"unknown model preset {name!r}; known presets: {', '.join(presets)}")
    entry = presets[name]
    return ModelDims(**entry["target"]), DraftDims(**entry["drafter"]), float(entry["tau"])


def _need(cfg: dict, key: str, where: str):
    if key not in cfg:
        raise DeviceError(f"{where}: missing {key!r}; is this a Hugging Face model config.json?")
    return cfg[key]


def draft_dims_from_config(cfg: dict, where: str = "drafter config.json") -> DraftDims:
    """DraftDims from a z-lab format DFlash drafter `config.json` dict."""
    hidden, heads = _need(cfg, "hidden_size", where), _need(cfg, "num_attention_heads", where)
    ids = (
        cfg.get("dflash_config", {}).get("target_layer_ids")
        or cfg.get("target_layer_ids")
        or [0] * 5
    )
    dflash2 = {}
    if any("DFlash2" in a for a in cfg.get("architectures") or []):
        value = {**cfg, **(cfg.get("dflash_config") or {})}  # dflash_config first
        dflash2 = {
            "conv_kernel": int(value.get("conv_kernel_size", 2)),
            "conv_groups": hidden // int(value.get("conv_group_size", 16)),
            "selector_rank": int(value.get("selector_rank", 256)),
            "vocab_size": int(_need(cfg, "vocab_size", where)),
        }
    return DraftDims(
        num_layers=_need(cfg, "num_hidden_layers", where),
        hidden_size=hidden,
        intermediate_size=_need(cfg, "intermediate_size", where),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        num_target_layer_ids=len(ids),
        # z-lab's DFlash2 keeps its block in dflash_config
        block_size=cfg.get("block_size") or cfg.get("dflash_config", {}).get("block_size", 16),
        **dflash2,
    )


def recipe_drafter(target: ModelDims, num_layers: int = 5, block_size: int = 16) -> DraftDims:
    """The z-lab recipe's drafter for a target without one: `num_layers` dense layers at the
    target's widths."""
    inter = target.intermediate_size if not target.num_experts else 3 * target.hidden_size
    return DraftDims(
        num_layers=num_layers,
        hidden_size=target.hidden_size,
        intermediate_size=inter,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        num_target_layer_ids=5,
        block_size=block_size,
    )
