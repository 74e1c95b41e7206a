"""Proposal sources: where a verify step's tokens come from, each with its own acceptance model.

Every source answers one protocol (`ProposalSource`):

    propose(last, pos, limit) -> Proposal    up to `limit` tokens for positions pos+1.. after `last`
    expected(proposal, kmax) -> E(0..kmax)   tokens a step verifying its first k commits, on average
    commit(tokens)                           the tokens the target committed this step, in order

and says whether proposing is `free` (no model pass: asked every step, before the choice) and what
one proposal costs before it is measured (`cost_s`: 0 when free, None when unknown: probed first). A
source scores its own proposals against the committed tokens, even beyond the k verified and when it
was not verified at all, so its `Acceptance` follows the text. The policy (policy.py) asks sources
by this protocol only; `Proposer` is the loop's one call a step. The target verifies whatever was
chosen the same way, so the output never depends on the source.

>>> src = LookupProposals([1, 2, 3, 9, 1, 2], limit=7)
>>> p = src.propose(last=2, pos=5, limit=2); p.tokens, p.first, p.agreement
([3, 9], 6, 2)
>>> src.commit([3]); src.propose(3, 6, 2).tokens
[9, 1]
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .lookup import PromptLookup


@dataclass(slots=True)
class Proposal:
    """Tokens one source proposes for positions first, first+1, ... (the drafter's is a view: valid
    until its next pass)."""

    source: str  # the proposing source's name
    tokens: Sequence[int]
    first: int  # absolute position of tokens[0]
    agreement: int = 1  # tokens before it agreeing with its source (prompt lookup's match)
    seconds: float = 0.0  # wall time of the model pass that made it (0: free)
    # a sampled drafter walk's (candidates [R, Kc], q [R, Kc]) per token (lattice.py); None:
    # proposed deterministically
    dists: tuple | None = None


class ProposalSource(Protocol):
    name: str  # "drafter" | "lookup" | ... (what Choice.source names)
    free: bool  # proposes without a model pass: asked every step, before the choice
    cost_s: float | None  # seconds a proposal costs before measured (0: free; None: unknown)

    def propose(self, last: int, pos: int, limit: int) -> Proposal: ...

    def expected(self, proposal: Proposal | None, kmax: int) -> np.ndarray: ...

    def commit(self, tokens: list[int]) -> None: ...


class Acceptance:
    """c(a), the chance a source's next proposed token is right after `a` agreeing tokens (a =
    agreement + j for proposal token j), from decayed counts plus a prior; it scores the source's
    latest proposal against the committed tokens as they come.

    Decaying every row at each proposal (not only those observed) lets rows no longer reached fall
    back to the prior instead of keeping an old, better, estimate.

    >>> Acceptance([0.25, 0.4, 0.5], weight=2.0).expected(first=1, kmax=2).round(2).tolist()
    [1.0, 1.25, 1.35]
    """

    def __init__(self, prior, weight: float, decay: float = 0.98):
        self.prior, self.weight, self.decay = np.asarray(prior, float), weight, decay  # [size]
        self.hits, self.trials = np.zeros(len(self.prior)), np.zeros(len(self.prior))  # [size]
        self.pending: list | None = None  # [first, tokens, next j, agreement, end position]

    def c(self) -> np.ndarray:
        return (self.hits + self.weight * self.prior) / (self.trials + self.weight)  # [size]

    def expected(self, first: int, kmax: int) -> np.ndarray:
        """E(k) = 1 + S(1) + .. + S(k), k = 0..kmax, of a proposal whose first token has agreement
        `first`."""
        idx = np.clip(np.arange(first, first + kmax), 1, len(self.prior)) - 1  # [kmax]
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.c()[idx]))])

    def record(self, a: int, hit: bool) -> None:
        i = min(max(a, 1), len(self.hits)) - 1  # past the table: its last row
        self.hits[i] += hit
        self.trials[i] += 1

    def observe(self, proposal: Proposal) -> None:
        """A new proposal: scored from its first position on (it replaces one not finished)."""
        if len(proposal.tokens):
            tokens = proposal.tokens
            tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)  # not a view
            self.pending = [proposal.first, tokens, 0, max(proposal.agreement, 1), proposal.first]
            self.hits *= self.decay
            self.trials *= self.decay

    def commit(self, tokens: list[int]) -> None:
        """Score the pending proposal against the next committed tokens, up to its first miss."""
        if self.pending is None:
            return
        first, proposed, j, agreement, end = self.pending
        for token in tokens:
            if end == first + j:  # at this proposal's j-th position
                hit = proposed[j] == token
                self.record(agreement + j, hit)
                j = j + 1 if hit else len(proposed)
                if j == len(proposed):
                    self.pending = None
                    return
            end += 1
        self.pending[2], self.pending[4] = j, end


class DrafterProposals:
    """The DFlash drafter: one pass drafts a block after `last` from the target's cached features
    [.. pos).

    Its acceptance is counted per position; prior and cost from tuned.json when the bundle has one,
    else a flat 0.3 and an unknown cost (so the policy probes it before drafting with it).
    """

    name, free = "drafter", False

    def __init__(self, drafter, limit: int, tuned=None, clock=time.perf_counter):
        self.drafter = drafter  # draft_model.DraftModel (or a wrapper with its `draft`)
        self.clock = clock  # seconds (tests inject theirs)
        prior = _conditional(tuned.acceptance) if tuned else [0.3] * limit
        self.acceptance = Acceptance(prior, weight=8.0 if tuned else 2.0)
        self.cost_s = tuned.draft_ms / 1e3 if tuned else None

    def propose(self, last: int, pos: int, limit: int) -> Proposal:
        t = self.clock()
        drafts = self.drafter.draft(last, ctx_end=pos)  # [B-1] view
        dists = getattr(self.drafter, "walked", None)  # a sampled walk's (lattice.LatticeDrafter)
        seconds = self.clock() - t
        proposal = Proposal(self.name, drafts[:limit], pos + 1, seconds=seconds, dists=dists)
        self.acceptance.observe(proposal)
        return proposal

    def expected(self, proposal: Proposal | None, kmax: int) -> np.ndarray:
        return self.acceptance.expected(1, kmax)

    def commit(self, tokens: list[int]) -> None:
        self.acceptance.commit(tokens)  # its context cache follows `pos` (ctx_end) by itself


class LookupProposals:
    """Prompt lookup (lookup.py): what followed the earlier occurrence of the text's suffix; costs
    no pass.

    Its acceptance is counted per agreement length a = m + j (m: the match before the proposal),
    because a copy that has agreed for long tends to go on: one table serves every match length. The
    prior a / (a + 3) (0.25 after one agreeing token, 0.73 after 8, 0.91 after 32) is below what
    quoting answers show (0.26, 0.49, 0.59, 0.79 for a = 1..4, ~0.9 beyond: docs/BENCHMARKS.md,
    session 8), so a text that does not quote pays for few failed verifies before the counts take
    over.
    """

    name, free, cost_s = "lookup", True, 0.0

    def __init__(self, history: list[int], limit: int, references: tuple[list[int], ...] = ()):
        # token ids by absolute position, grown by `commit` (+ runs outside the prompt to copy from)
        self.lookup = PromptLookup(history, references=references)
        a = np.arange(1, limit + self.lookup.max_match + 2)  # agreement 1 .. max match + limit
        self.acceptance = Acceptance(a / (a + 3.0), weight=2.0)

    def propose(self, last: int, pos: int, limit: int) -> Proposal:
        tokens = self.lookup.propose(limit)
        proposal = Proposal(self.name, tokens, pos + 1, agreement=self.lookup.matched)
        self.acceptance.observe(proposal)
        return proposal

    def expected(self, proposal: Proposal | None, kmax: int) -> np.ndarray:
        return self.acceptance.expected(proposal.agreement if proposal else 1, kmax)

    def commit(self, tokens: list[int]) -> None:
        self.acceptance.commit(tokens)
        self.lookup.extend(tokens)


def make_sources(
    draft: str, drafter, history: list[int], limit: int, tuned=None, references=()
) -> list[ProposalSource]:
    """The sources of a `draft` mode (validate.DRAFT_MODES), fresh for one generation; `limit` = B -
    1; `references`: token runs prompt lookup also copies from (files outside the prompt)."""
    make = {
        "drafter": lambda: DrafterProposals(drafter, limit, tuned),
        "lookup": lambda: LookupProposals(history, limit, references),
    }
    names = {"none": (), "auto": ("lookup", "drafter")}.get(draft, (draft,))
    return [make[name]() for name in names]


class Proposer:
    """One generation's proposal sources and the policy choosing among them: the loop's one call a
    step to propose (`propose`) and one to report what the target committed (`commit`).

    >>> from .policy import FixedPolicy
    >>> lookup = LookupProposals([1, 2, 3, 4, 1, 2], limit=3)
    >>> pr = Proposer([lookup], FixedPolicy("lookup", 3), limit=3)
    >>> pr.propose(last=2, pos=5, room=100)
    (Choice(source='lookup', k=3, probe=False), [3, 4, 1])
    """

    def __init__(self, sources: list[ProposalSource], policy, limit: int):
        self.sources, self.policy, self.limit = {s.name: s for s in sources}, policy, limit
        self.choice, self.made = None, {}

    def propose(self, last: int, pos: int, room: int):
        """(policy.Choice, the proposals to verify after `last`, at positions pos+1..; () for a
        plain step).

        The free sources propose first and the policy chooses; a costly source runs when chosen, or
        every costly one when the choice probes (unverified, to measure its acceptance and cost)."""
        made = {n: s.propose(last, pos, self.limit) for n, s in self.sources.items() if s.free}
        choice = self.policy.pick(made, room)
        for n, s in self.sources.items():
            if not s.free and (n == choice.source or choice.probe):
                made[n] = s.propose(last, pos, self.limit)
        self.choice, self.made = choice, made
        return choice, made[choice.source].tokens[: choice.k] if choice.k else ()

    def dists(self):
        """The distributions the proposals just returned were drawn from (Proposal.dists), or
        None."""
        return self.made[self.choice.source].dists if self.choice.k else None

    def commit(self, tokens: list[int], seconds: float) -> None:
        """The tokens the target committed this step, and its pass's wall time (`seconds`)."""
        for source in self.sources.values():
            source.commit(tokens)
        self.policy.learn(self.choice, self.made, seconds)


def _conditional(survival: list[float]) -> list[float]:
    """c(j) = S(j) / S(j-1) (0 once S reaches 0)."""
    out, prev = [], 1.0
    for s in survival:
        out.append(min(s / prev, 1.0) if prev > 0 else 0.0)
        prev = s
    return out
