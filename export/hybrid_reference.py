"""The torch reference parity compares a hybrid (linear-attention) bundle with: models/
linear_attention's HybridModel for `target_hybrid`, the drafter on the hybrid's embedding and head.

Same contract as sources.reference: `reference(src, block)(inputs) -> {graph: [outputs per case]}`,
the cases those of parity.run_hybrid (a prefill, then a verify-shaped call keeping all of it). The
target's weights are the bundle's (`src.target_ckpt`: StoredWeights, low-bit blocks dequantised);
unlike the dense reference it is built whole (the target's size in memory during parity).

>>> want = hybrid_reference(src, block=16)(inputs)       # doctest: +SKIP
"""

from __future__ import annotations

from types import SimpleNamespace

from ..models.families.qwen3_5 import LINEAR
from .sources import _lazy_drafter, _numpy, _tensors


def hybrid_reference(src, block: int):
    """`inputs -> outputs` for a hybrid bundle's `target_hybrid` and `drafter` cases (numpy)."""

    def run(inputs: dict) -> dict:
        import torch

        from ..models.drafter import WindowedDrafterGraph
        from ..models.graphs import DrafterGraph
        from ..models.linear_attention import load_hybrid

        model = load_hybrid(src.target_dir, src.target_cfg, ckpt=src.target_ckpt)
        full = [i for i, kind in enumerate(src.target_cfg.layer_types) if kind != LINEAR]
        vocab = None if src.vocab is None else torch.as_tensor(src.vocab)
        # a drafter borrows
        host = SimpleNamespace(
            model=SimpleNamespace(embed_tokens=model.embed_tokens),
            lm_head=model.lm_head,
            config=src.target_cfg,
        )
        graph = WindowedDrafterGraph if src.draft_cfg.window_layers else DrafterGraph
        drafter = graph(host, _lazy_drafter(src), vocab)
        with torch.no_grad():
            target = _target_cases(model, full, inputs["target_hybrid"])
            drafts = [_numpy(drafter(*_tensors(feeds))) for feeds in inputs["drafter"]]
        return {"target_hybrid": target, "drafter": drafts}

    return run


def _target_cases(model, full: list[int], cases: list[tuple]) -> list[tuple]:
    """(logits [1, T, V], next_ids [1, T], new_key / new_value [T, Lf, Hkv, D]) per call, the state
    carried from call to call (each case keeps all of the one before: parity.run_hybrid)."""
    import torch

    state, out = model.new_state(), []
    for feeds in cases:
        ids, start = torch.from_numpy(feeds[0][0]), state.length
        logits, state, _ = model.step(ids, state)  # [T, V]
        # [T, Lf, Hkv, D]
        rows = [
            torch.stack([cache[i][:, start:] for i in full]).permute(2, 0, 1, 3).numpy()
            for cache in (state.keys, state.values)
        ]
        out.append((logits[None].numpy(), logits.argmax(-1)[None].numpy(), *rows))
    return out
