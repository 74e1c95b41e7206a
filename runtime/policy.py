"""Policies: each step, which proposal source to verify and how many of its tokens (k = 0: a plain
decode).

A policy answers `pick(offers, room) -> Choice` and `learn(choice, made, seconds)` (`Policy`);
proposals.py's `Proposer` calls them. `FixedPolicy` makes the same choice every step
(`draft="none"`, `"drafter"`, `"lookup"`); `AdaptivePolicy` is the default (`draft="auto"`): per
step, what is measured to pay.

The adaptive policy knows its sources only by their protocol (proposals.ProposalSource): for each,
the tokens a step verifying k of its proposals commits on average, E(k) (the source's own acceptance
model), and what a proposal costs (measured here, seeded by the source). It maximises expected
tokens per second:

    plain:   1 / decode          a source:   E(k) / (cost + verify(k)),   E(k) = 1 + S(1) + ... +
    S(k)

A source whose cost is unknown (the drafter without tuned.json) and every costly source while none
pays is *probed*: it proposes, unverified, beside a plain step, so its acceptance and cost get
measured. Probes back off 1, 2, 4 .. `max_backoff` steps while they do not pay (from
TUNED_OFF_BACKOFF when tune chose "do not draft"), and are skipped while a free source is worth
verifying. Step times are running averages; verify(k) = decode * (1 + (ratio(k) - 1) * scale),
ratio(k) from the tuned file (tuning.py) or a prior, `scale` fitted to the measured verify times.
Whatever runs, every committed token is the target's own: greedy, and sampled with deterministic
drafts, the output does not depend on the choice; sampled DFlash2 drafts under the rejection rule
keep the target's distribution, but the tokens follow which steps drafted (lattice.py).

>>> from .proposals import LookupProposals
>>> lookup = LookupProposals([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], limit=7)
>>> p = AdaptivePolicy(block_size=8, sources=[lookup])
>>> p.pick({"lookup": lookup.propose(4, 12, 7)}, room=100)       # nothing measured yet: plain
Choice(source='plain', k=0, probe=False)
>>> p.learn(Choice("plain"), {}, seconds=0.05)
>>> p.pick({"lookup": lookup.propose(4, 12, 7)}, room=100)       # a long copy: verify some of it
Choice(source='lookup', k=3, probe=False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

TUNED_OFF_BACKOFF = 16  # steps before the first probe when `tune` chose "do not draft"
# Without tuned.json a verify of k proposals costs 1 + VERIFY_ROW_PRIOR * k decodes until measured.
# Low-bit targets on a CPU measure 0.09-0.18 per row (int4: verify(15) = 3.7 decodes), fp32 ~0.04;
# a prior too cheap verifies failing proposals before the measured times take over.
VERIFY_ROW_PRIOR = 0.12
# Probes that do not pay take at most this share of the decode time: a probe costing a decode waits
# 1 / PROBE_SHARE steps, up to max_backoff (back-off alone spent ~7% of a chat reply on probes).
PROBE_SHARE = 0.015


@dataclass(frozen=True)
class Choice:
    source: str  # "plain" or a proposal source's name (proposals.py)
    k: int = 0  # proposals verified (0 for plain)
    probe: bool = False  # also run the costly sources, unverified, to measure them


class Policy(Protocol):
    def pick(self, offers: dict, room: int) -> Choice:
        """The step to run, given the free sources' proposals (name -> proposals.Proposal) and the
        tokens the output may still take."""

    def learn(self, choice: Choice, made: dict, seconds: float) -> None:
        """What the step ran: every proposal made (name -> Proposal, with its pass's time) and the
        target pass's wall time."""


class FixedPolicy:
    """The same choice every step: plain decoding, or a source's first k proposals (a free source's
    only when it has some: a plain step when it has none).

    >>> FixedPolicy("drafter", 7).pick({}, room=100)
    Choice(source='drafter', k=7, probe=False)
    """

    def __init__(self, source: str, k: int = 0):
        self.choice = Choice(source, k if source != "plain" else 0)

    def pick(self, offers: dict, room: int) -> Choice:
        offer = offers.get(self.choice.source)
        if offer is None:
            return self.choice
        k = min(self.choice.k, len(offer.tokens), room - 1)
        return Choice(self.choice.source, k) if k > 0 else Choice("plain")

    def learn(self, choice: Choice, made: dict, seconds: float) -> None:
        pass


def make_policy(
    draft: str, block_size: int, sources=(), tuned=None, verify_len: int | None = None
) -> Policy:
    """The policy of a `draft` mode (validate.DRAFT_MODES) over `sources` (proposals.make_sources);
    `verify_len` fixes k (with "auto": caps it).

    >>> make_policy("none", 8).pick({}, room=100)
    Choice(source='plain', k=0, probe=False)
    """
    if draft == "auto":
        return AdaptivePolicy(block_size, sources, tuned, verify_len)
    if draft == "none":
        return FixedPolicy("plain")
    return FixedPolicy(draft, verify_len or block_size - 1)


class AdaptivePolicy:
    """Chooses each step's source and verify length from the sources' acceptance and measured step
    times."""

    def __init__(
        self,
        block_size: int,
        sources=(),
        tuned=None,
        verify_len: int | None = None,
        max_backoff: int = 64,
        smoothing: float = 0.2,
    ):
        self.kmax = block_size - 1
        self.fixed_k = verify_len  # an explicit verify length caps k
        self.smoothing, self.max_backoff = smoothing, max_backoff
        self.sources = {s.name: s for s in sources}
        self.cost = {s.name: s.cost_s for s in sources}  # seconds per proposal (None: unknown)
        self.measured: set[str] = set()  # costs measured in this generation
        ks = np.arange(block_size)  # [B]: ratio[k] = verify(k) / decode
        if tuned:
            measured = {k: v / tuned.decode_ms for k, v in tuned.verify_ms.items()}
            known = sorted(measured)
            self.ratio = np.interp(ks, [0, *known], [1.0, *(measured[k] for k in known)])
            self.ratio = np.maximum(self.ratio, 1.0 + 0.01 * ks)  # every row costs: `scale` fits
            self.decode_s = tuned.decode_ms / 1e3
        else:
            self.ratio = 1.0 + VERIFY_ROW_PRIOR * ks  # until measured (`scale`)
            self.decode_s = None
        self.scale = 1.0  # measured / modelled extra verify time
        self.extra: list[float | None] = [None, None]  # their running averages
        self.decode_measured = False  # in this generation (not only tuned)
        # A tuned "do not draft" says the drafter did not pay on the calibration prompts: probe it
        # rarely from the start (a probe costs a draft pass) instead of after 1, 2, 4, .. steps.
        self.backoff = self.until_probe = TUNED_OFF_BACKOFF if tuned and not tuned.verify_len else 1
        self.since_probe = 0  # steps since a costly source last ran
        self.chosen: list[Choice] = []

    # ---- the decision ------------------------------------------------------------------------
    def verify_s(self, k: np.ndarray | int):
        """Modelled target step time for k proposals: decode plus the (scaled) extra cost of k more
        rows."""
        return self.decode_s * (1.0 + (self.ratio[k] - 1.0) * self.scale)

    def pick(self, offers: dict, room: int) -> Choice:
        """The step with the most expected tokens per second (a free source's proposal is in
        `offers`; a costly one's is unknown until it runs, so its acceptance model answers for
        it)."""
        if self.decode_s is None:  # nothing measured yet: a plain step
            return self._note(Choice("plain"))
        best, rate = Choice("plain"), 1.0 / self.decode_s
        kmax = min(self.kmax, room - 1, self.fixed_k or self.kmax)
        for name, source in self.sources.items():
            offer, cost = offers.get(name), self.cost[name]
            limit = kmax if offer is None else min(kmax, len(offer.tokens))
            if limit < 1 or cost is None:
                continue
            ks = np.arange(1, limit + 1)  # [limit]
            rates = source.expected(offer, limit)[ks] / (cost + self.verify_s(ks))
            i = int(np.argmax(rates))
            if rates[i] > rate:
                best, rate = Choice(name, int(ks[i])), float(rates[i])
        costly = [n for n, s in self.sources.items() if not s.free]
        self.since_probe += 1
        if best.source in costly:
            self.backoff = self.until_probe = 1
            self.since_probe = 0
        elif best.source == "plain" and kmax >= 1 and costly:  # not beside a free source that pays
            self.until_probe -= 1
            if self.until_probe <= 0 and self.since_probe > self._probe_spacing(costly):
                best = Choice(best.source, best.k, probe=True)  # run the costly sources unverified
                self.until_probe, self.since_probe = self.backoff, 0
                self.backoff = min(2 * self.backoff, self.max_backoff)
        return self._note(best)

    def _probe_spacing(self, costly: list[str]) -> int:
        """Steps from one probe to the next that keep probes at PROBE_SHARE of the decode time (0
        while a cost is unknown: the first probe measures it)."""
        costs = [self.cost[n] for n in costly]
        if PROBE_SHARE <= 0 or None in costs:
            return 0
        return min(int(sum(costs) / self.decode_s / PROBE_SHARE), self.max_backoff)

    def _note(self, choice: Choice) -> Choice:
        self.chosen.append(choice)
        return choice

    # ---- what the step measured --------------------------------------------------------------
    def learn(self, choice: Choice, made: dict, seconds: float) -> None:
        """Time of the target pass (`seconds`) and of each proposal that ran a model pass."""
        for name, proposal in made.items():
            if proposal.seconds:
                self.cost[name] = _avg(self.cost[name], proposal.seconds, self.smoothing)
                self.measured.add(name)
        if choice.source == "plain" and not self.decode_measured and self.decode_s:
            # the tuned times came from another moment (load, clocks): this generation's first
            # decode replaces them, tuned costs scaled alike, ratios kept (else verifies look free)
            for name, cost in self.cost.items():
                if name not in self.measured and cost:
                    self.cost[name] = cost * seconds / self.decode_s
            self.decode_s, self.decode_measured = seconds, True
        elif choice.source == "plain":
            self.decode_s = _avg(self.decode_s, seconds, self.smoothing)
            self.decode_measured = True
            if self.extra[0] is not None:  # drift back towards the model, so a verify cost once
                self.extra[0] += 0.05 * (self.extra[1] - self.extra[0])  # measured high: re-tried
                self.scale = self.extra[0] / self.extra[1]
        elif self.decode_measured:  # scale = running sums of measured / modelled extra time
            measured = max(seconds / self.decode_s - 1.0, 0.0)  # (short verifies weigh little)
            self.extra = [
                _avg(self.extra[0], measured, self.smoothing),
                _avg(self.extra[1], self.ratio[choice.k] - 1.0, self.smoothing),
            ]
            self.scale = self.extra[0] / self.extra[1]


def _avg(old: float | None, new: float, smoothing: float) -> float:
    """Running average; a sample above 3x the average counts as 3x (one stall on a busy machine must
    not decide the next dozen steps)."""
    if old is None or not math.isfinite(old):
        return new
    return old + smoothing * ((min(new, 3.0 * old) if old > 0 else new) - old)
