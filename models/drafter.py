"""The DFlash block-diffusion drafter in torch, in z-lab's checkpoint format (docs/design.md §1).

The drafter has no embedding or LM head: it borrows the target's. Per step it takes the target's
hidden states at `target_layer_ids` for the newly committed tokens (context), projects them with
`fc` + `hidden_norm`, caches their K/V in every layer, and denoises a block `[last token, MASK x
(B-1)]` with non-causal attention over [cached context ; block]; a sliding-window layer attends
causally to the keys of its window instead (`attention_mask`; the rule: draft_config.py).

>>> drafter = load_drafter("my-drafter/", target_config=target.config)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..runtime.publish import publish_dir
from .config import TargetConfig
from .dflash2 import CandidateSelector, DFlash2Layer, draft_lattice, greedy_walk
from .dflash2_config import DFlash2Config, open_drafter_files
from .draft_config import (  # noqa: F401  (re-exported: callers import them from here)
    SMOLLM2_MASK_TOKEN,
    ZLAB_MODEL_CLASS,
    DraftConfig,
    default_target_layer_ids,
)
from .families.qwen3 import attention_spec
from .graphs import DrafterGraph, _split_layers, _stack_layers
from .layers import DecoderLayer, RMSNorm, RotaryTable
from .static_cache import StaticKVCache
from .target import lm_logits
from .weights import load_streamed


class DFlashDrafter(nn.Module):
    """Tensor names are z-lab's: `layers.{i}.…`, `norm`, `fc`, `hidden_norm` (no `model.`
    prefix). A DFlash2Config gives DFlash2's layers, embedding scale and `candidate_selector`
    (dflash2.py)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        n_ctx = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_ctx * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(attention_spec(cfg), cfg.intermediate_size)
            for _ in range(cfg.num_hidden_layers)
        )
        if isinstance(cfg, DFlash2Config):
            self.layers = nn.ModuleList(DFlash2Layer(cfg) for _ in range(cfg.num_hidden_layers))
            self.candidate_selector = CandidateSelector(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryTable(
            cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings
        )

    def new_cache(self, max_len: int) -> StaticKVCache:
        return StaticKVCache.for_config(self.config, max_len, self.fc.weight.dtype)

    def step(
        self,
        block_embeds,
        block_positions,
        ctx_feats,
        ctx_positions,
        past,
        past_positions=None,
    ):
        """Pure forward: (normed block hidden [1, B, H], new context K list, new context V list).

        `ctx_feats` [1, C, n_ids*H] are the target features of context positions not cached yet;
        every block position attends to [cached context ; new context ; whole block], a sliding
        layer to the part its window shows (`attention_mask`). `past[i]`: layer i's cached context,
        a (K, V) pair of [1, Hkv, S_i, D]; `past_positions[i]` [S_i]: the
        positions of layer i's cached rows (default 0..S_i-1; a window cache passes its last W-1
        positions, negative ones for empty rows)."""
        scale = float(getattr(self.config, "input_embedding_scale", 1.0))  # DFlash2's
        block_embeds = block_embeds * scale if scale != 1.0 else block_embeds
        ctx = self.hidden_norm(self.fc(ctx_feats))  # [1, C, H]
        num_ctx = ctx.shape[1]
        rope_q = self.rope(block_positions)
        new_pos = torch.cat([ctx_positions, block_positions])  # [C + B]
        rope_kv = self.rope(new_pos)
        x = block_embeds  # [1, B, H]
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            held = (
                torch.arange(past[i][0].shape[2]) if past_positions is None else past_positions[i]
            )
            mask = attention_mask(
                block_positions,
                torch.cat([held, new_pos]),
                self.config.window(i),
                self.config.layer_causal(i),
            )
            x, k, v = layer(x, rope_q, *past[i], mask, ctx=ctx, rope_kv=rope_kv)
            new_k.append(k[:, :, :num_ctx])  # [1, Hkv, C, D]: block K/V dropped
            new_v.append(v[:, :, :num_ctx])
        return self.norm(x), new_k, new_v

    def forward(
        self, block_embeds: torch.Tensor, ctx_feats: torch.Tensor, cache: StaticKVCache
    ) -> torch.Tensor:
        """Append the new context to `cache` and denoise the block placed right after it."""
        num_ctx, block = ctx_feats.shape[1], block_embeds.shape[1]
        cache.check_room(num_ctx)
        start = cache.length
        ctx_positions = torch.arange(start, start + num_ctx)
        block_positions = torch.arange(start + num_ctx, start + num_ctx + block)
        past = [cache.past(i) for i in range(self.config.num_hidden_layers)]
        hidden, new_k, new_v = self.step(
            block_embeds,
            block_positions,
            ctx_feats,
            ctx_positions,
            past,
        )
        for i, (k, v) in enumerate(zip(new_k, new_v)):
            cache.write(i, k, v)
        cache.advance(num_ctx)
        return hidden


def attention_mask(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None, causal: bool
):
    """Additive mask [T, K] for queries at `query_pos` [T] over keys at `key_pos` [K]
    (draft_config.py's rule); None when every key is visible (a full, non-causal layer over real
    positions).

    >>> attention_mask(torch.tensor([3]), torch.arange(5), window=2, causal=True)[0].eq(0).tolist()
    [False, False, True, True, False]
    """
    q, k = query_pos[:, None], key_pos[None, :]  # [T, 1], [1, K]
    keep = (k >= 0).expand(len(query_pos), -1)  # negative: an empty window row
    if causal:
        keep = keep & (k <= q)
    if window is not None:
        keep = keep & (q - k < window)
        if not causal:  # nor W or more after it
            keep = keep & (k - q < window)
    if bool(keep.all()):
        return None
    return torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)


def new_drafter(cfg: DraftConfig, seed: int = 0) -> DFlashDrafter:
    """A randomly initialised drafter (small normal weights, unit norms)."""
    torch.manual_seed(seed)
    model = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
    return model.eval()


def load_drafter(
    path: str | Path, target_config: TargetConfig | None = None, dtype=torch.float32
) -> DFlashDrafter:
    """Load a z-lab-format drafter directory; with `target_config`, check that it fits that
    target."""

    cfg, ckpt = open_drafter_files(Path(path).expanduser(), target_config)
    return load_streamed(lambda: DFlashDrafter(cfg), ckpt, dtype).to(dtype).eval()


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` with every parametrized tensor replaced by its effective value.

    (Training may reparametrise weights, e.g. `fc`'s input scaling; the file holds plain names.)
    """
    out = {}
    for name, value in model.state_dict().items():
        if ".parametrizations." not in name:
            out[name] = value
        elif name.endswith(".original"):
            owner, tensor = name.removesuffix(".original").split(".parametrizations.")
            out[f"{owner}.{tensor}"] = getattr(model.get_submodule(owner), tensor)
    return out


def save_drafter(
    model: DFlashDrafter, path: str | Path, dtype=torch.bfloat16, extra_files: dict | None = None
) -> Path:
    """Write config.json + model.safetensors atomically (temp dir, then rename over `path`)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        cfg = model.config.to_dict()
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        tensors = {
            k: v.detach().to("cpu", dtype).contiguous() for k, v in plain_state_dict(model).items()
        }
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        publish_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def window_positions(start: torch.Tensor, rows: int) -> torch.Tensor:
    """Positions [rows] of a window cache's rows: the `rows` positions before `start` (negative:
    empty rows)."""
    return start.reshape(()) - rows + torch.arange(rows, dtype=torch.long)


class WindowedDrafterGraph(DrafterGraph):
    """`graphs.DrafterGraph` for a drafter with sliding layers, whose graph I/O
    (runtime/io_tables.py) splits the context cache: full layers in `past_key/past_value` [S, Ld,
    Hkv, D] (every position before `start`; None when every layer slides), sliding layers in
    `window_key/window_value` [W-1, Lw, Hkv, D] (the W-1 positions before `start`). Returns
    (draft_ids, new_key, new_value, new_window_key, new_window_value), None where a kind has no
    layers."""

    def forward(
        self, block_ids, ctx_hidden, start, past_key, past_value, window_key=None, window_value=None
    ):
        cfg = self.drafter.config
        num_ctx, block = ctx_hidden.shape[1], block_ids.shape[1]
        ctx_positions = start + torch.arange(num_ctx, dtype=torch.long)  # [C]
        block_positions = start + num_ctx + torch.arange(block, dtype=torch.long)  # [B]
        slid = cfg.window_layers
        full = [i for i in range(cfg.num_hidden_layers) if i not in slid]
        past, past_pos = ([None] * cfg.num_hidden_layers for _ in range(2))
        for layers, keys, values, positions in (
            (full, past_key, past_value, lambda: torch.arange(past_key.shape[0])),
            (slid, window_key, window_value, lambda: window_positions(start, window_key.shape[0])),
        ):
            for i, k, v in (
                zip(layers, _split_layers(keys), _split_layers(values)) if layers else ()
            ):
                past[i], past_pos[i] = (k, v), positions()
        hidden, new_k, new_v = self.drafter.step(
            self.embed(block_ids),
            block_positions,
            ctx_hidden,
            ctx_positions,
            past,
            past_pos,
        )
        draft_ids, *lattice = self.drafts(hidden, block_ids)
        return (
            draft_ids,
            *(
                _stack_layers([new[i] for i in layers]) if layers else None
                for layers in (full, slid)
                for new in (new_k, new_v)
            ),
            *lattice,
        )

    def drafts(self, hidden, block_ids) -> tuple:
        """(draft_ids [1, B-1],) from the normed block `hidden` [1, B, H]; a DFlash2 drafter's:
        (its greedy walk, candidate_ids [1, B-1, k], lattice_scores [1, B-1, k, k])."""
        if hasattr(self.drafter, "candidate_selector"):
            cand, scores = draft_lattice(self.drafter, self.lm_head, hidden[:, 1:], block_ids[:, 0])
            return greedy_walk(cand, scores), cand, scores
        draft_ids = lm_logits(self.lm_head, hidden[:, 1:]).argmax(-1)  # [1, B-1]
        if self.vocab is not None:
            draft_ids = self.vocab_ids[draft_ids]  # local row -> token id
        return (draft_ids,)
