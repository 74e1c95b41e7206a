"""Prompt-lookup proposals: a draft source that costs no model pass.

When the last tokens of prompt + output occurred earlier, propose the tokens that followed that
earlier occurrence. Of all earlier occurrences of the last token, the one whose preceding tokens
agree with the current suffix for longest wins (the latest among equals): a longer agreement says
the text is being copied from there. `matched` is that agreement's length (capped), which the policy
uses to predict how far the copy will go on. When the last token never occurred (the answer changed
a word of the text it copies), the tokens before it are matched instead and the proposal skips the
one source token it replaced, with `matched` 1: a guess. Answers that quote their input (rewrite,
fix, convert, extract) repeat long stretches of the prompt, so these proposals are often right. They
are verified by the same target pass as the drafter's, so the output is still the target's own.

>>> lk = PromptLookup([1, 2, 3, 4, 5, 9, 1, 2, 3])
>>> lk.propose(3), lk.matched          # "1 2 3" occurred before, followed by 4 5 9
([4, 5, 9], 3)
>>> lk.extend([7]); lk.propose(3)       # "7" is new: it replaced the "4"
[5, 9, 1]
>>> lk.extend([6]); lk.propose(3)       # "7 6" is new: nothing to propose
[]
>>> PromptLookup([5, 1, 8, 2, 1, 9, 5, 1]).propose(2)   # "5 1" beats the later "2 1": its 8 follows
[8, 2]
>>> PromptLookup([4, 4, 4]).propose(3)  # a repeating text continues with its period
[4, 4, 4]
>>> PromptLookup([1, 2, 3, 4, 5, 1, 2, 8]).propose(2)  # "8" replaced "3": go on after it
[4, 5]

`references`: other token runs to copy from that are not in the history (files the prompt could not
hold); indexed before the history, each after a separator no token equals, so no match spans two.

>>> PromptLookup([7, 1, 2], references=[[1, 2, 3, 4]]).propose(2)
[3, 4]
"""

from __future__ import annotations

SEPARATOR = -1  # between reference runs and the history: equal to no token id


class PromptLookup:
    """An index of a growing token history: token -> ends of its earlier occurrences (each with a
    next token)."""

    def __init__(
        self,
        history: list[int],
        max_match: int = 32,
        candidates: int = 64,
        references: tuple[list[int], ...] = (),
    ):
        self.history: list[int] = [t for ref in references for t in (SEPARATOR, *ref)]
        self.history += [SEPARATOR] if references else []
        self.max_match = max_match  # agreement counted up to this many tokens
        self.candidates = candidates  # the latest occurrences compared (bounds the per-step cost)
        self.ends: dict[int, list[int]] = {}
        self.indexed = 0  # occurrences ending before this are indexed
        self.matched = 0  # agreement length of the last proposal (0: none)
        self.extend(history)

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens; index every occurrence that now has a token after it."""
        self.history += tokens
        h = self.history
        for end in range(max(self.indexed, 1), len(h)):  # end < len(h): a continuation exists
            self.ends.setdefault(h[end - 1], []).append(end)
        self.indexed = max(self.indexed, len(h))

    def best_occurrence(self, n: int) -> tuple[int, int]:
        """(end, agreement) of the earlier occurrence of the suffix of history[:n] that agrees
        longest, among those followed by a token before n; (0, 0) if none."""
        h = self.history
        best_end, best = 0, 0
        ends = self.ends.get(h[n - 1], ())
        ends = (
            ends[-self.candidates - 1 : -1] if ends and ends[-1] == n else ends[-self.candidates :]
        )
        for end in reversed(ends):  # newest first: ties keep the latest
            m = best + 1  # only a longer agreement can win: test that much at C speed first
            if m > min(end, self.max_match) or h[end - m : end] != h[n - m : n]:
                continue
            while m < min(end, self.max_match) and h[end - m - 1] == h[n - m - 1]:
                m += 1
            best_end, best = end, m
            if best == self.max_match:
                break
        return best_end, best

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the best earlier occurrence of the suffix
        (`best_occurrence`)."""
        h, n = self.history, len(self.history)
        end, self.matched = self.best_occurrence(n) if n else (0, 0)
        if not self.matched and n > 2 and h[-1] not in self.ends:  # a new token: it replaced one
            end, agree = self.best_occurrence(n - 1)
            end, self.matched = end + 1, 1 if agree >= 2 and end + 1 < n else 0
        if not self.matched:
            return []
        out, period = h[end : end + limit], n - end
        while len(out) < limit:  # the occurrence runs into the suffix: the text repeats
            out.append(out[len(out) - period])  # with this period, so continue it
        return out
