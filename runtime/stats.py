"""What one generation measured: acceptance, latency, throughput and where the step time went.

`python_overhead` is the share of decode wall time spent outside the graphs' `run` calls
(binding, token selection, bookkeeping): the cost of driving the loop from Python.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    finish_reason: str = ""                    # "stop" | "length" | "context"
    acceptance_lengths: list[int] = field(default_factory=list)   # tokens committed per verify step
    ttft_s: float = 0.0                        # call start -> first token known (tokenize + prefill)
    prefill_s: float = 0.0                     # the prompt's chunks through the target (wall), first token included
    decode_s: float = 0.0                      # first token -> last token (wall)
    decode_run_s: float = 0.0                  # of which inside the graphs' run calls
    target_calls: int = 0                      # decode/verify target runs after prefill
    draft_calls: int = 0
    draft_run_s: float = 0.0                   # drafter share of decode_run_s
    plain_steps: int = 0                       # steps decoded without proposals
    lookup_lengths: list[int] = field(default_factory=list)      # tokens committed per prompt-lookup step
    verify_lens: list[int] = field(default_factory=list)         # proposals verified per verify step
    probe_steps: int = 0                       # draft="auto": steps that also ran the drafter unverified

    def record_step(self, choice, committed: int) -> None:
        """One decode step: `choice` (policy.Choice) and the tokens its target pass produced."""
        if choice.source == "plain":
            self.plain_steps += 1
        else:
            (self.acceptance_lengths if choice.source == "drafter" else self.lookup_lengths).append(committed)
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
    def python_overhead(self) -> float:
        """Share of decode time spent outside onnxruntime's run calls."""
        return 1.0 - self.decode_run_s / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def step_ms(self) -> float:
        """Mean wall time per decode iteration (one verify step, or one AR token)."""
        return 1e3 * self.decode_s / self.target_calls if self.target_calls else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(mean_acceptance_length=self.mean_acceptance_length, decode_tokens_per_s=self.decode_tokens_per_s,
                   python_overhead=self.python_overhead, step_ms=self.step_ms)
        return out

    def summary(self) -> str:
        """One line for humans (the CLI prints it to stderr)."""
        line = (f"{self.new_tokens} tokens, {self.decode_tokens_per_s:.1f} tok/s decode, "
                f"TTFT {self.ttft_s * 1e3:.0f} ms (prompt {self.prompt_tokens} tokens, prefill "
                f"{self.prefill_s * 1e3:.0f} ms)")
        if self.acceptance_lengths:
            line += (f", mean acceptance length {self.mean_acceptance_length:.2f} over "
                     f"{len(self.acceptance_lengths)} steps")
        if self.lookup_lengths:
            line += (f", prompt lookup {sum(self.lookup_lengths) / len(self.lookup_lengths):.2f} tokens/step over "
                     f"{len(self.lookup_lengths)} steps")
        if self.plain_steps and (self.acceptance_lengths or self.lookup_lengths):
            line += f" (+{self.plain_steps} steps without drafting)"
        return f"{line}, python overhead {self.python_overhead:.1%}; finish: {self.finish_reason}"
