"""Policies: each step, which proposal source to verify and how many of its tokens (k = 0: a plain decode).

A policy answers `pick(offers, room) -> Choice` and `learn(choice, made, seconds, history)` (`Policy`), and names
the proposal sources it uses (proposals.py). `FixedPolicy` makes the same choice every step (`draft="none"`,
`"drafter"`, `"lookup"`); `AdaptivePolicy` is the default (`draft="auto"`): per step, what is measured to pay.

Each step the loop asks `choose` what to run: a plain decode, the drafter's first k drafts, or the first
k tokens of a prompt-lookup proposal (lookup.py). The choice maximises expected tokens per second:

    plain:    1 / decode                        drafter:  E_d(k) / (draft + verify(k))
    lookup:   E_l(k) / verify(k)                E(k) = 1 + S(1) + ... + S(k),  S(j) = c(1) * ... * c(j)

c(j), the chance that proposal token j is right when the ones before it were, is counted from what the
target actually commits (`observe` + `commit`): a proposal is checked against the committed tokens even
beyond the k that were verified, and even when it was not verified at all (a drafter *probe*: draft, then
decode plainly; probes back off 1, 2, 4 .. `max_backoff` steps while drafting does not pay, from
TUNED_OFF_BACKOFF when tune chose "do not draft", and are skipped while a lookup is worth verifying).
The drafter's c(j) is counted per position j; the lookup's per agreement length a = m + j - 1 (m: how
many tokens before the proposal agree with its source, see lookup.py), because a copy that has agreed
for long tends to go on: one table serves every match length.
Step times are running averages; verify(k) = decode * (1 + (ratio(k) - 1) * scale),
ratio(k) from the tuned file (tuning.py) or a linear prior, `scale` fitted to the measured verify times.
Whatever runs, every committed token is the target's own, so the output does not depend on the choice.

>>> p = AdaptivePolicy(block_size=8)
>>> p.choose(lookup_len=0, room=100)      # nothing measured yet: a plain step, for its cost
Choice(source='plain', k=0, probe=False)
>>> p.step_done(Choice("plain", 0), seconds=0.05); p.choose(0, 100).probe    # then probe the drafter
True
>>> p.choose(lookup_len=7, room=100, lookup_match=20)     # a long copy: verify all of it
Choice(source='lookup', k=7, probe=False)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np


TUNED_OFF_BACKOFF = 16      # steps before the first drafter probe when `tune` chose "do not draft"


@dataclass(frozen=True)
class Choice:
    source: str          # "plain" | "drafter" | "lookup"
    k: int = 0           # proposals verified (0 for plain)
    probe: bool = False  # also run the drafter, unverified, to measure its acceptance


class Policy(Protocol):
    sources: tuple[str, ...]            # the proposal sources it chooses among (proposals.py names)

    def pick(self, offers: dict, room: int) -> Choice:
        """The step to run, given the free sources' proposals (name -> proposals.Proposal) and the tokens the
        output may still take."""

    def learn(self, choice: Choice, made: dict, seconds: float, history: list[int]) -> None:
        """What the step ran: every proposal made (name -> Proposal), the target pass's wall time, and the
        committed token ids by absolute position (`history`, grown by this step's tokens)."""


class FixedPolicy:
    """The same choice every step: plain decoding, the drafter's first k drafts, or a prompt lookup's first k
    tokens whenever it finds one (a plain step when it does not).

    >>> FixedPolicy("drafter", 7).pick({}, room=100)
    Choice(source='drafter', k=7, probe=False)
    """

    def __init__(self, source: str, k: int = 0):
        self.choice = Choice(source, k if source != "plain" else 0)
        self.sources = ("plain",) if source == "plain" else ("plain", source)

    def pick(self, offers: dict, room: int) -> Choice:
        if self.choice.source != "lookup":
            return self.choice
        k = min(self.choice.k, len(offers["lookup"].tokens), room - 1)
        return Choice("lookup", k) if k > 0 else Choice("plain")

    def learn(self, choice: Choice, made: dict, seconds: float, history: list[int]) -> None:
        pass


def make_policy(draft: str, block_size: int, tuned=None, verify_len: int | None = None) -> Policy:
    """The policy of a `draft` mode (validate.DRAFT_MODES); `verify_len` fixes k (with "auto": caps the drafter's).

    >>> make_policy("none", 8).pick({}, room=100)
    Choice(source='plain', k=0, probe=False)
    """
    if draft == "auto":
        return AdaptivePolicy(block_size, tuned, verify_len)
    if draft == "none":
        return FixedPolicy("plain")
    return FixedPolicy(draft, verify_len or block_size - 1)


class Acceptance:
    """Per-position conditional acceptance c(j) of one source: counts decayed per proposal, plus a prior.

    Decaying every position at each proposal (not only those observed) lets positions that are no
    longer reached fall back to the prior instead of keeping an old, better, estimate.
    """

    def __init__(self, size: int, prior: list[float], weight: float, decay: float):
        self.prior, self.weight, self.decay = np.asarray(prior, float), weight, decay   # [size]
        self.hits, self.trials = np.zeros(size), np.zeros(size)                        # [size], j-1 at index

    def new_proposal(self) -> None:
        self.hits *= self.decay
        self.trials *= self.decay

    def record(self, j: int, hit: bool) -> None:
        self.hits[j - 1] += hit
        self.trials[j - 1] += 1

    def expected(self) -> np.ndarray:
        """E(k) for k = 0..size: 1 + cumulative sums of S(j)."""
        c = (self.hits + self.weight * self.prior) / (self.trials + self.weight)
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(c))])


class CopyAcceptance:
    """Prompt lookup's c(a): the chance its next token is right after `a` agreeing tokens (the match plus the
    proposal tokens accepted so far), from decayed counts and the prior a / (a + 3).

    The prior (0.25 after one agreeing token, 0.73 after 8, 0.91 after 32) is below what quoting answers
    show (0.26, 0.49, 0.59, 0.79 for a = 1..4, ~0.9 beyond: docs/BENCHMARKS.md, session 8), so a text that
    does not quote pays for few failed verifies before the counts take over.

    >>> CopyAcceptance(8).expected(match=1, kmax=2).round(2).tolist()     # E(0..2) after a 1-token match
    [1.0, 1.25, 1.35]
    """

    def __init__(self, size: int, weight: float = 2.0, decay: float = 0.98):
        a = np.arange(1, size + 1)                                  # [size]: agreement 1..size, a-1 at index
        self.prior, self.weight, self.decay = a / (a + 3.0), weight, decay
        self.hits, self.trials = np.zeros(size), np.zeros(size)     # [size]

    def new_proposal(self) -> None:
        self.hits *= self.decay
        self.trials *= self.decay

    def record(self, a: int, hit: bool) -> None:
        i = min(max(a, 1), len(self.hits)) - 1                      # agreements past the table share its last row
        self.hits[i] += hit
        self.trials[i] += 1

    def expected(self, match: int, kmax: int) -> np.ndarray:
        """E(k) for k = 0..kmax of a proposal whose source agrees with the last `match` tokens."""
        c = (self.hits + self.weight * self.prior) / (self.trials + self.weight)          # [size]
        idx = np.minimum(np.arange(match, match + kmax), len(c)) - 1                      # [kmax]: a = match + j - 1
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(c[idx]))])


class AdaptivePolicy:
    """Chooses each step's source and verify length from measured acceptance and step times."""

    sources = ("plain", "lookup", "drafter")

    def __init__(self, block_size: int, tuned=None, verify_len: int | None = None, max_backoff: int = 64,
                 smoothing: float = 0.2):
        self.kmax = block_size - 1
        self.fixed_k = verify_len                                   # an explicit verify length caps the drafter
        self.smoothing, self.max_backoff = smoothing, max_backoff
        ks = np.arange(block_size)                                  # [B]: ratio[k] = verify(k) / decode
        if tuned:
            measured = {k: v / tuned.decode_ms for k, v in tuned.verify_ms.items()}
            self.ratio = np.interp(ks, [0, *sorted(measured)], [1.0, *(measured[k] for k in sorted(measured))])
            self.ratio = np.maximum(self.ratio, 1.0 + 0.01 * ks)    # each row costs something: keeps `scale` fitted
            drafter_prior = _conditional(tuned.acceptance)
            self.decode_s, self.draft_s = tuned.decode_ms / 1e3, tuned.draft_ms / 1e3
        else:
            self.ratio = 1.0 + 0.04 * ks                            # ~1.6 at block 16 on a 2-core CPU (fp32)
            drafter_prior = [0.3] * self.kmax
            self.decode_s = self.draft_s = None
        self.scale = 1.0                                            # measured / modelled extra verify time
        self.extra: list[float | None] = [None, None]              # their running averages
        self.decode_measured = self.draft_measured = False          # in this generation (not only tuned)
        self.drafter = Acceptance(self.kmax, drafter_prior, weight=8.0 if tuned else 2.0, decay=0.98)
        self.copy = CopyAcceptance(self.kmax + 33)                  # lookup.py counts agreement up to 32
        self.pending: dict[str, tuple[int, list[int], int, int]] = {}   # source -> (first position, tokens,
        #                                                              checked, agreement before the first)
        # A tuned "do not draft" says the drafter did not pay on the calibration prompts: probe it rarely
        # from the start (a probe costs a draft pass, ~half a decode) instead of after 1, 2, 4, .. steps.
        self.backoff = self.until_probe = TUNED_OFF_BACKOFF if tuned and not tuned.verify_len else 1
        self.chosen: list[Choice] = []

    # ---- the Policy interface (the loop's two calls) -------------------------------------------------------
    def pick(self, offers: dict, room: int) -> Choice:
        lookup = offers["lookup"]
        return self.choose(len(lookup.tokens), room, lookup_match=lookup.agreement)

    def learn(self, choice: Choice, made: dict, seconds: float, history: list[int]) -> None:
        for proposal in made.values():                  # the lookup's, then the drafter's (made when run)
            self.observe(proposal.source, proposal.first, proposal.tokens, proposal.agreement)
        self.step_done(choice, seconds, sum(p.seconds for p in made.values()))
        self.commit(history)

    # ---- the decision -----------------------------------------------------------------------------------
    def verify_s(self, k: np.ndarray | int):
        """Modelled target step time for k proposals: decode plus the (scaled) extra cost of k more rows."""
        return self.decode_s * (1.0 + (self.ratio[k] - 1.0) * self.scale)

    def choose(self, lookup_len: int, room: int, lookup_match: int = 1) -> Choice:
        """The step to run, given the lookup proposal's length and agreement (lookup.py's `matched`) and the
        tokens the output may still take."""
        if self.decode_s is None:
            return self._note(Choice("plain"))
        best, rate = Choice("plain"), 1.0 / self.decode_s
        kmax = min(self.kmax, room - 1)
        for source, limit, extra in (("lookup", min(lookup_len, kmax), 0.0),
                                     ("drafter", min(self.fixed_k or kmax, kmax), self.draft_s)):
            if limit < 1 or extra is None:
                continue
            ks = np.arange(1, limit + 1) if source == "lookup" or not self.fixed_k else np.array([limit])
            expected = self.copy.expected(lookup_match, limit) if source == "lookup" else self.drafter.expected()
            rates = expected[ks] / (extra + self.verify_s(ks))
            i = int(np.argmax(rates))
            if rates[i] > rate:
                best, rate = Choice(source, int(ks[i])), float(rates[i])
        if best.source == "drafter":
            self.backoff = self.until_probe = 1
        elif best.source == "plain" and kmax >= 1:                  # a lookup worth verifying: no probe beside it
            self.until_probe -= 1
            if self.until_probe <= 0:                               # run the drafter unverified, to measure it
                best = Choice(best.source, best.k, probe=True)
                self.until_probe, self.backoff = self.backoff, min(2 * self.backoff, self.max_backoff)
        return self._note(best)

    def _note(self, choice: Choice) -> Choice:
        self.chosen.append(choice)
        return choice

    # ---- what the step measured ---------------------------------------------------------------------------
    def step_done(self, choice: Choice, seconds: float, draft_seconds: float = 0.0) -> None:
        """Time of the target pass (`seconds`) and of the drafter run, if any."""
        if draft_seconds:
            self.draft_s = _avg(self.draft_s, draft_seconds, self.smoothing)
            self.draft_measured = True
        if choice.source == "plain" and not self.decode_measured and self.decode_s:
            # the tuned times came from another moment (load, clocks): this generation's first decode replaces
            # them, the tuned draft time scaled alike, ratios kept (a stale decode would make verifies look free)
            self.draft_s *= 1.0 if self.draft_measured else seconds / self.decode_s
            self.decode_s, self.decode_measured = seconds, True
        elif choice.source == "plain":
            self.decode_s = _avg(self.decode_s, seconds, self.smoothing)
            self.decode_measured = True
            if self.extra[0] is not None:           # drift back towards the model, so a verify cost once
                self.extra[0] += 0.05 * (self.extra[1] - self.extra[0])    # measured high gets re-tried
                self.scale = self.extra[0] / self.extra[1]
        elif self.decode_measured:                  # scale = running sums of measured / modelled extra time
            measured = max(seconds / self.decode_s - 1.0, 0.0)     # (short verifies, little extra, weigh little)
            self.extra = [_avg(self.extra[0], measured, self.smoothing),
                          _avg(self.extra[1], self.ratio[choice.k] - 1.0, self.smoothing)]
            self.scale = self.extra[0] / self.extra[1]

    def observe(self, source: str, first_position: int, tokens: list[int], match: int = 0) -> None:
        """A proposal ("drafter" or "lookup", the latter with its agreement `match`) for positions
        first_position.. (checked against the committed tokens as they come)."""
        if len(tokens):
            tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)     # ids, not a reused view
            self.pending[source] = (first_position, tokens, 0, match)
            (self.copy if source == "lookup" else self.drafter).new_proposal()

    def commit(self, history: list[int]) -> None:
        """Score pending proposals against `history` (token ids by absolute position) as far as it goes."""
        for source, (first, tokens, j, match) in list(self.pending.items()):
            stats = self.copy if source == "lookup" else self.drafter
            while j < len(tokens) and first + j < len(history):
                hit = tokens[j] == history[first + j]
                stats.record(match + j if source == "lookup" else j + 1, hit)
                j = j + 1 if hit else len(tokens)
            if j == len(tokens):
                del self.pending[source]
            else:
                self.pending[source] = (first, tokens, j, match)


def _conditional(survival: list[float]) -> list[float]:
    """c(j) = S(j) / S(j-1) (0 once S reaches 0)."""
    out, prev = [], 1.0
    for s in survival:
        out.append(min(s / prev, 1.0) if prev > 0 else 0.0)
        prev = s
    return out


def _avg(old: float | None, new: float, smoothing: float) -> float:
    """Running average; a sample above 3x the average counts as 3x (one stall on a busy machine must not
    decide the next dozen steps)."""
    if old is None or not math.isfinite(old):
        return new
    return old + smoothing * ((min(new, 3.0 * old) if old > 0 else new) - old)
