"""`use_draft="auto"`: draft only while drafting pays, measured on this device as generation runs.

A draft+verify step costs `spec_s` and commits tau tokens on average; a plain decode step costs
`decode_s` and commits one. Drafting pays while tau * decode_s >= spec_s. Both step times and tau
are running averages of the current generation (so they follow context length, thermal state and
how predictable the text is). While drafting does not pay, plain steps run and a draft step probes
now and then (after 1, 2, 4, ... up to `max_backoff` plain steps) in case the text became predictable.
Either kind of step commits the target's own tokens, so the output is the same whichever runs.

>>> p = AdaptiveDrafting()
>>> p.draft_next()                       # nothing measured yet: draft
True
>>> p.spec_done(committed=1, seconds=0.09); p.draft_next()   # then one plain step, for its cost
False
>>> p.decode_done(seconds=0.05); p.pays()                    # 1 token per 90 ms < 1 per 50 ms
False
"""
from __future__ import annotations


class AdaptiveDrafting:
    def __init__(self, smoothing: float = 0.3, max_backoff: int = 32):
        self.smoothing, self.max_backoff = smoothing, max_backoff
        self.tau: float | None = None            # tokens committed per draft+verify step
        self.spec_s: float | None = None         # seconds per draft+verify step
        self.decode_s: float | None = None       # seconds per plain step
        self.backoff, self.until_probe = 1, 0
        self.spec_steps = self.plain_steps = 0

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def pays(self) -> bool:
        """Expected tokens per second of drafting >= those of plain decoding (both measured)."""
        return self.tau * self.decode_s >= self.spec_s

    def draft_next(self) -> bool:
        if self.spec_s is None:
            return True
        if self.decode_s is None:
            return False
        return self.pays() or self.until_probe <= 0

    def spec_done(self, committed: int, seconds: float) -> None:
        self.spec_steps += 1
        self.tau, self.spec_s = self._avg(self.tau, committed), self._avg(self.spec_s, seconds)
        if self.decode_s is not None and not self.pays():
            self.until_probe = self.backoff
            self.backoff = min(2 * self.backoff, self.max_backoff)
        else:
            self.backoff = 1

    def decode_done(self, seconds: float) -> None:
        self.plain_steps += 1
        self.decode_s = self._avg(self.decode_s, seconds)
        self.until_probe -= 1
