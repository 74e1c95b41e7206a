"""What one generation measured: acceptance, latency, throughput and where the step time went.

`python_overhead` is the share of decode wall time spent outside the graphs' `run` calls
(binding, token selection, bookkeeping): the cost of driving the loop from Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose caches the last sequence left (not re-run)
    new_tokens: int = 0
    finish_reason: str = ""  # "stop" | "length" | "context"
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens committed per verify step
    ttft_s: float = 0.0  # call start -> first token known (tokenize + prefill)
    prefill_s: float = 0.0  # the prompt's chunks through the target (wall), first token included
    decode_s: float = 0.0  # first token -> last token (wall)
    decode_run_s: float = 0.0  # of which inside the graphs' run calls
    target_calls: int = 0  # decode/verify target runs after prefill
    draft_calls: int = 0
    draft_run_s: float = 0.0  # drafter share of decode_run_s
    plain_steps: int = 0  # steps decoded without proposals
    # tokens committed per prompt-lookup step
    lookup_lengths: list[int] = field(default_factory=list)
    verify_lens: list[int] = field(default_factory=list)  # proposals verified per verify step
    probe_steps: int = 0  # draft="auto": steps that also ran the drafter unverified
    plain_s: float = 0.0  # wall time of the plain steps without a probe (the baseline's cost)
    plain_timed_steps: int = 0  # ... and how many there were

    def record_step(self, choice, committed: int, seconds: float = 0.0) -> None:
        """One decode step: `choice` (policy.Choice), the tokens its target pass produced, its wall
        time."""
        if choice.source == "plain":
            self.plain_steps += 1
            if not choice.probe:
                self.plain_s += seconds
                self.plain_timed_steps += 1
        else:
            (self.acceptance_lengths if choice.source == "drafter" else self.lookup_lengths).append(
                committed
            )
            self.verify_lens.append(choice.k)
        self.probe_steps += choice.probe

    @property
    def mean_acceptance_length(self) -> float:
        """Mean tokens committed per verify step (tau); 1.0 for autoregressive decoding."""
        if not self.acceptance_lengths:
            return 1.0 if self.new_tokens else 0.0
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first one, per second of decoding (the first comes from prefill)."""
        return max(self.new_tokens - 1, 0) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def plain_tokens_per_s(self) -> float:
        """Plain decoding's speed measured on this generation's plain steps (1 token each); 0.0
        without any."""
        return self.plain_timed_steps / self.plain_s if self.plain_s > 0 else 0.0

    @property
    def python_overhead(self) -> float:
        """Share of decode time spent outside onnxruntime's run calls."""
        return 1.0 - self.decode_run_s / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def step_ms(self) -> float:
        """Mean wall time per decode iteration (one verify step, or one AR token)."""
        return 1e3 * self.decode_s / self.target_calls if self.target_calls else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            mean_acceptance_length=self.mean_acceptance_length,
            decode_tokens_per_s=self.decode_tokens_per_s,
            python_overhead=self.python_overhead,
            step_ms=self.step_ms,
        )
        return out

    def sources(self) -> str:
        """Which proposal sources drafted and their tokens per step, for humans.

        >>> GenerationStats(acceptance_lengths=[3, 2], lookup_lengths=[4], plain_steps=5).sources()
        'drafter 2.50 tokens/step over 2 steps, prompt lookup 4.00 tokens/step over 1 step, 5 plain steps'
        """  # noqa: E501
        parts = [
            f"{name} {sum(steps) / len(steps):.2f} tokens/step over {_n(len(steps), 'step')}"
            for name, steps in (
                ("drafter", self.acceptance_lengths),
                ("prompt lookup", self.lookup_lengths),
            )
            if steps
        ]
        if not parts:
            return "nothing (every step decoded plainly)"
        return ", ".join(parts + ([_n(self.plain_steps, "plain step")] if self.plain_steps else []))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
