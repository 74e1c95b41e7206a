"""Acceptance of a drafter on held-out prompts: τ per category and per-position acceptance rates.

Two measurements of the same quantity:
- `reference_eval`: the torch reference speculative loop, prompt by prompt (the authority).
- `replay_eval`: greedy decoding replayed on the target's own greedy responses (cached with their
  features): every anchor's block in one batched drafter pass, then the accept/advance walk. It is
  exact for greedy decoding up to float rounding, and takes seconds, so training uses it.

>>> spec = EvalSpec(block_size=16)  # doctest: +SKIP
>>> report = reference_eval(target, drafter, prompt_ids, categories, spec)  # doctest: +SKIP
>>> print(format_report(report))  # doctest: +SKIP
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from ..models.reference_loop import GenerationConfig, speculative_generate
from .dataset import all_anchor_batch
from .objective import block_hidden, simulated_tau


@dataclass
class EvalSpec:
    block_size: int = 16
    max_new_tokens: int = 128


@dataclass
class AcceptanceReport:
    block_size: int
    # category -> lengths
    steps: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def add(self, category: str, lengths: list[int]) -> None:
        self.steps[category].extend(lengths)

    def tau(self, category: str | None = None) -> float:
        xs = self.steps[category] if category else [x for v in self.steps.values() for x in v]
        return sum(xs) / max(len(xs), 1)

    def position_rates(self) -> list[float]:
        """P(draft position k accepted) for k = 1..B-1, over all verify steps."""
        xs = torch.tensor([x for v in self.steps.values() for x in v], dtype=torch.float32)
        if xs.numel() == 0:
            return [0.0] * (self.block_size - 1)
        return [((xs - 1) >= k).float().mean().item() for k in range(1, self.block_size)]

    def to_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "tau": self.tau(),
            "tau_per_category": {c: self.tau(c) for c in sorted(self.steps)},
            "verify_steps": sum(len(v) for v in self.steps.values()),
            "position_acceptance": self.position_rates(),
        }


def format_report(rep: AcceptanceReport) -> str:
    lines = [
        f"mean acceptance length tau = {rep.tau():.3f}  (block {rep.block_size}, "
        f"{sum(len(v) for v in rep.steps.values())} verify steps)"
    ]
    lines += [
        f"  {c:<10} tau = {rep.tau(c):.3f}  ({len(rep.steps[c])} steps)" for c in sorted(rep.steps)
    ]
    rates = rep.position_rates()
    lines.append(
        "per-position acceptance P(k accepted): "
        + " ".join(f"{k + 1}:{r:.2f}" for k, r in enumerate(rates))
    )
    return "\n".join(lines)


@torch.no_grad()
def reference_eval(
    target,
    drafter,
    prompt_ids: list[list[int]],
    categories: list[str],
    spec: EvalSpec,
    progress=None,
) -> AcceptanceReport:
    """Run `speculative_generate` (greedy) on every prompt; collect acceptance lengths per
    category."""

    rep = AcceptanceReport(spec.block_size)
    gen = GenerationConfig(max_new_tokens=spec.max_new_tokens, block_size=spec.block_size)
    for ids, cat in zip(prompt_ids, categories):
        res = speculative_generate(target, drafter, ids, gen)
        rep.add(cat, res.acceptance_lengths)
        if progress:
            progress(rep)
    return rep


class BlockAcceptance:
    """Leading correct greedy draft tokens of the block at any response position of one sample.

    The drafter runs once over blocks at every anchor (cheap); the LM head (the expensive part) runs
    only for the anchors a replayed decode actually visits.
    """

    @torch.no_grad()
    def __init__(self, drafter, embed, head_weight: torch.Tensor, sample, block: int):
        batch = all_anchor_batch(sample, block, drafter.config.mask_token_id).to(head_weight.device)
        # [K, B, H]
        self.hidden = block_hidden(drafter, embed, batch)[0].view(
            -1, block, drafter.config.hidden_size
        )
        self.labels = batch.labels.view(-1, block)  # [K, B]
        self.head, self.start = head_weight, sample.prompt_len

    @torch.no_grad()
    def __getitem__(self, i: int) -> int:
        draft = (self.hidden[i, 1:].to(self.head.dtype) @ self.head.T).argmax(-1)  # [B-1]
        return int((draft == self.labels[i, 1:]).long().cumprod(0).sum())


@torch.no_grad()
def replay_eval(
    drafter, embed, head_weight, samples, categories: list[str], spec: EvalSpec
) -> AcceptanceReport:
    """Greedy acceptance replayed on cached greedy responses (see module docstring)."""
    rep = AcceptanceReport(spec.block_size)
    for s, cat in zip(samples, categories):
        acc = BlockAcceptance(drafter, embed, head_weight, s, spec.block_size)
        rep.add(cat, simulated_tau(acc, s.prompt_len, len(s.tokens) - 1, spec.max_new_tokens))
    return rep
