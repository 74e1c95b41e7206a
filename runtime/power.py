"""Energy per token for `bench --power`: meter each generate call of each arm, or say why not.

`MeteredGenerator` wraps a Generator: every `generate(..., draft=X)` call is bracketed by meter
reads and charged to arm X's name (ARM_NAMES). Joules cover the whole call (prefill included) and
whatever else the meter's scope sees; they are measurements, never estimates. A meter that fails
mid-run nulls its fields with the reason; the bench itself carries on.

>>> gen = MeteredGenerator(  # doctest: +SKIP
...     Generator.load("bundle/"), meter=None, reason="disabled")
>>> gen.energy_report()["plain"]  # doctest: +SKIP
{'energy_j_per_token': None, 'avg_power_w': None, 'reason': 'disabled'}
"""

from __future__ import annotations

import time

from ..devices import meters
from ..devices.errors import MeterError
from .validate import GenerationOptions

# draft -> arm (bench: plain, default, always)
ARM_NAMES = {
    "none": "plain",
    "auto": "speculative",
    "drafter": "always",
}


def open_power_meter(enabled: bool):
    """(meter, None) when one reads, else (None, why not)."""
    if not enabled:
        return None, "disabled by --no-power"

    try:
        return meters.open_meter(), None
    except MeterError as err:
        return None, str(err)


class MeteredGenerator:
    """A Generator whose generate calls are metered per arm (their `draft` option); everything else
    passes through."""

    def __init__(self, gen, meter, reason: str | None = None, clock=time.perf_counter):
        # clock: seconds, monotonic
        self.gen, self.meter, self.reason, self.clock = (
            gen,
            meter,
            reason,
            clock,
        )
        self.arms: dict[str, dict] = {}

    def __getattr__(self, name):
        return getattr(self.gen, name)

    # Generator.generate's own
    def generate(self, prompt, options: GenerationOptions | None = None, **fields):
        draft = fields.get("draft", (options or GenerationOptions()).draft)
        if options is not None:
            fields["options"] = options
        arm = self.arms.setdefault(
            ARM_NAMES.get(draft, str(draft)),
            {"energy_j": 0.0, "seconds": 0.0, "tokens": 0, "calls": 0},
        )
        e0 = self._read()
        t0 = self.clock()
        res = self.gen.generate(prompt, **fields)
        seconds = self.clock() - t0
        e1 = self._read() if e0 is not None else None
        if e1 is not None:
            arm["energy_j"] += e1 - e0
            arm["seconds"] += seconds
            arm["tokens"] += res.stats.new_tokens
            arm["calls"] += 1
        return res

    def reset(self) -> None:
        """Forget what was metered so far (the bench's warm-up calls)."""
        self.arms.clear()

    def _read(self) -> float | None:
        if self.meter is None:
            return None
        try:
            return self.meter.read_j()
        except MeterError as err:
            self.reason = f"meter {self.meter.name} stopped reading mid-run: {err}"
            self.meter.close()
            self.meter = None
            return None

    def energy_report(self) -> dict:
        """Per arm (plain, speculative, + any other draft mode seen): energy_j_per_token and
        avg_power_w, null with `reason` when no meter read to the end."""
        out = {
            "meter": getattr(self.meter, "name", None),
            "scope": getattr(self.meter, "scope", None),
            "reason": self.reason,
            "covers": "whole generate calls (prefill + decode)",
        }
        for name in ["plain", "speculative"] + sorted(set(self.arms) - {"plain", "speculative"}):
            arm = self.arms.get(name)
            if self.meter is None or not arm or not arm["tokens"] or not arm["seconds"]:
                out[name] = {
                    "energy_j_per_token": None,
                    "avg_power_w": None,
                    "reason": self.reason or "no metered calls in this arm",
                }
                continue
            out[name] = {
                "energy_j_per_token": round(arm["energy_j"] / arm["tokens"], 5),
                "avg_power_w": round(arm["energy_j"] / arm["seconds"], 3),
                "energy_j": round(arm["energy_j"], 3),
                "seconds": round(arm["seconds"], 3),
                "tokens": arm["tokens"],
                "calls": arm["calls"],
            }
        return out

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
