"""Proposal sources: where the tokens a verify step checks come from. Every source answers one interface:

    propose(last, pos, limit) -> Proposal   up to `limit` tokens for positions pos+1.. after `last` (at pos)
    commit(tokens)                          the tokens the target committed this step, in order

A source is `free` when proposing costs no model pass (none, prompt lookup): the loop asks the free ones every
step, before the policy chooses (policy.py); a costly one (the drafter) runs only when chosen, or probed. The
target verifies whatever was chosen the same way, so the output never depends on the source.

>>> src = LookupProposals([1, 2, 3, 9, 1, 2])
>>> p = src.propose(last=2, pos=5, limit=2); p.tokens, p.first, p.agreement
([3, 9], 6, 2)
>>> src.commit([3]); src.propose(3, 6, 2).tokens
[9, 1]
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from .lookup import PromptLookup


@dataclass(slots=True)
class Proposal:
    """Tokens one source proposes for positions first, first+1, ... (the drafter's is a view: valid until its
    next pass)."""

    source: str                 # the proposing source's name
    tokens: Sequence[int]
    first: int                  # absolute position of tokens[0]
    agreement: int = 0          # prompt lookup: tokens before the proposal that agree with its source
    seconds: float = 0.0        # wall time of the model pass that made it (0: free)


class ProposalSource(Protocol):
    name: str                   # "plain" | "drafter" | "lookup" | ...
    free: bool                  # proposes without a model pass: asked every step, before the choice

    def propose(self, last: int, pos: int, limit: int) -> Proposal: ...

    def commit(self, tokens: list[int]) -> None: ...


class NoProposals:
    """Plain decoding: proposes nothing, so the target's step is one token."""

    name, free = "plain", True

    def propose(self, last: int, pos: int, limit: int) -> Proposal:
        return Proposal(self.name, (), pos + 1)

    def commit(self, tokens: list[int]) -> None:
        pass


class DrafterProposals:
    """The DFlash drafter: one pass drafts a block after `last` from the target's cached features [.. pos)."""

    name, free = "drafter", False

    def __init__(self, drafter):
        self.drafter = drafter              # kv.DraftModel (or a wrapper with its `draft`)

    def propose(self, last: int, pos: int, limit: int) -> Proposal:
        t = time.perf_counter()
        drafts = self.drafter.draft(last, ctx_end=pos)          # [B-1] view
        return Proposal(self.name, drafts[:limit], pos + 1, seconds=time.perf_counter() - t)

    def commit(self, tokens: list[int]) -> None:
        pass                                # its context cache follows `pos` (ctx_end) by itself


class LookupProposals:
    """Prompt lookup (lookup.py): what followed the earlier occurrence of the text's suffix; costs no pass."""

    name, free = "lookup", True

    def __init__(self, history: list[int]):
        self.lookup = PromptLookup(history)             # token ids by absolute position, grown by `commit`

    def propose(self, last: int, pos: int, limit: int) -> Proposal:
        tokens = self.lookup.propose(limit)
        return Proposal(self.name, tokens, pos + 1, agreement=self.lookup.matched)

    def commit(self, tokens: list[int]) -> None:
        self.lookup.extend(tokens)


def free_offers(sources: dict[str, ProposalSource], last: int, pos: int, limit: int) -> dict[str, Proposal]:
    """The proposals of the sources that cost no model pass (what the policy chooses among, with the drafter's
    expected acceptance)."""
    return {name: s.propose(last, pos, limit) for name, s in sources.items() if s.free}


def chosen_proposals(sources: dict[str, ProposalSource], offers: dict[str, Proposal], choice, last: int, pos: int,
                     limit: int) -> dict[str, Proposal]:
    """`offers` plus the costly sources' proposals `choice` (policy.Choice) needs: the chosen one, or all of them
    when it probes (they run unverified, to measure their acceptance)."""
    made = dict(offers)
    for name, s in sources.items():
        if not s.free and (name == choice.source or choice.probe):
            made[name] = s.propose(last, pos, limit)
    return made
