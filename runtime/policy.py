"""The default `use_draft="auto"` policy: per step, plain decode or verify k proposals from one source.

Each step the loop asks `choose` what to run: a plain decode, the drafter's first k drafts, or the first
k tokens of a prompt-lookup proposal (lookup.py). The choice maximises expected tokens per second:

    plain:    1 / decode                        drafter:  E_d(k) / (draft + verify(k))
    lookup:   E_l(k) / verify(k)                E(k) = 1 + S(1) + ... + S(k),  S(j) = c(1) * ... * c(j)

c(j), the chance that proposal token j is right when the ones before it were, is counted per source
and position from what the target actually commits (`observe` + `commit`): a proposal is checked
against the committed tokens even beyond the k that were verified, and even when it was not verified at
all (a drafter *probe*: draft, then decode plainly; probes back off 1, 2, 4 .. `max_backoff` steps while
drafting does not pay). Step times are running averages; verify(k) = decode * (1 + (ratio(k) - 1) * scale),
ratio(k) from the tuned file (tuning.py) or a linear prior, `scale` fitted to the measured verify times.
Whatever runs, every committed token is the target's own, so the output does not depend on the choice.

>>> p = AdaptivePolicy(block_size=8)
>>> p.choose(lookup_len=0, room=100)      # nothing measured yet: a plain step, for its cost
Choice(source='plain', k=0, probe=False)
>>> p.step_done(Choice("plain", 0), seconds=0.05); p.choose(0, 100).probe    # then probe the drafter
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


TUNED_OFF_BACKOFF = 16      # steps before the first drafter probe when `tune` chose "do not draft"


@dataclass(frozen=True)
class Choice:
    source: str          # "plain" | "drafter" | "lookup"
    k: int = 0           # proposals verified (0 for plain)
    probe: bool = False  # also run the drafter, unverified, to measure its acceptance


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


class AdaptivePolicy:
    """Chooses each step's source and verify length from measured acceptance and step times."""

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
        self.decode_measured = False                                # in this generation (not only tuned)
        self.acc = {"drafter": Acceptance(self.kmax, drafter_prior, weight=8.0 if tuned else 2.0, decay=0.98)}
        self.pending: dict[str, tuple[int, list[int], int]] = {}    # source -> (first position, tokens, checked)
        # A tuned "do not draft" says the drafter did not pay on the calibration prompts: probe it rarely
        # from the start (a probe costs a draft pass, ~half a decode) instead of after 1, 2, 4, .. steps.
        self.backoff = self.until_probe = TUNED_OFF_BACKOFF if tuned and not tuned.verify_len else 1
        self.chosen: list[Choice] = []

    # ---- the decision -----------------------------------------------------------------------------------
    def verify_s(self, k: np.ndarray | int):
        """Modelled target step time for k proposals: decode plus the (scaled) extra cost of k more rows."""
        return self.decode_s * (1.0 + (self.ratio[k] - 1.0) * self.scale)

    def stats_of(self, source: str) -> Acceptance:
        """A source's acceptance; lookups are counted apart per matched n-gram length ("lookup4", ...)."""
        if source not in self.acc:
            self.acc[source] = Acceptance(self.kmax, [0.6] * self.kmax, weight=2.0, decay=0.9)
        return self.acc[source]

    def choose(self, lookup_len: int, room: int, lookup_source: str = "lookup") -> Choice:
        """The step to run, given the lookup proposal's length (and key) and the tokens the output may still take."""
        if self.decode_s is None:
            return self._note(Choice("plain"))
        best, rate = Choice("plain"), 1.0 / self.decode_s
        kmax = min(self.kmax, room - 1)
        for source, limit, extra in (("lookup", min(lookup_len, kmax), 0.0),
                                     ("drafter", min(self.fixed_k or kmax, kmax), self.draft_s)):
            if limit < 1 or extra is None:
                continue
            ks = np.arange(1, limit + 1) if source == "lookup" or not self.fixed_k else np.array([limit])
            acc = self.stats_of(lookup_source if source == "lookup" else source)
            rates = acc.expected()[ks] / (extra + self.verify_s(ks))
            i = int(np.argmax(rates))
            if rates[i] > rate:
                best, rate = Choice(source, int(ks[i])), float(rates[i])
        if best.source == "drafter":
            self.backoff = self.until_probe = 1
        elif kmax >= 1:
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
        if choice.source == "plain":
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

    def observe(self, source: str, first_position: int, tokens: list[int]) -> None:
        """A proposal for positions first_position.. (checked against the committed tokens as they come)."""
        if len(tokens):
            self.pending[source] = (first_position, list(tokens), 0)
            self.stats_of(source).new_proposal()

    def commit(self, history: list[int]) -> None:
        """Score pending proposals against `history` (token ids by absolute position) as far as it goes."""
        for source, (first, tokens, j) in list(self.pending.items()):
            while j < len(tokens) and first + j < len(history):
                hit = tokens[j] == history[first + j]
                self.stats_of(source).record(j + 1, hit)
                j = j + 1 if hit else len(tokens)
            if j == len(tokens):
                del self.pending[source]
            else:
                self.pending[source] = (first, tokens, j)


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
