"""Committed tokens and the stop decision, shared by the runtime loop and the torch reference
loop."""

from __future__ import annotations


class Emitter:
    """Collects committed tokens; stops at a stop id, the token budget or the context end.

    >>> e = Emitter(max_new_tokens=3, stop_ids=frozenset({2}), room=100)
    >>> e.push([5, 2, 7]), e.reason
    ([5, 2], 'stop')
    """

    def __init__(self, max_new_tokens: int, stop_ids: frozenset[int], room: int):
        self.stop_ids, self.budget = stop_ids, min(max_new_tokens, room)
        self.context_limited = room < max_new_tokens
        self.tokens: list[int] = []
        self.reason = ""

    def push(self, tokens: list[int]) -> list[int]:
        """Append tokens up to the first stop / budget end; returns those appended."""
        kept = []
        for t in tokens:
            kept.append(t)
            if t in self.stop_ids:
                self.reason = "stop"
            elif len(self.tokens) + len(kept) >= self.budget:
                self.reason = "context" if self.context_limited else "length"
            if self.reason:
                break
        self.tokens += kept
        return kept
