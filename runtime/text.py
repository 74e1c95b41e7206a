"""Committed tokens -> text: pieces released only as whole characters, cut at (and never showing) a
stop string.

>>> from types import SimpleNamespace
>>> chars = SimpleNamespace(decode=lambda ids: "".join(map(chr, ids)))  # one token per character
>>> asm = TextAssembler(chars, stop=("!",))
>>> [asm.add(ord(c)) for c in "hi!x"], asm.finish(), asm.text
(['h', 'i', '', ''], '', 'hi')
"""

from __future__ import annotations

from typing import Iterable, Iterator


class TextAssembler:
    """Committed tokens -> text pieces: never half a character, cut at (and never showing) a stop
    string.

    Decodes a short window of tokens (HF's prefix/read offsets) so a piece is only released once it
    decodes to whole characters; with stop strings, the last len(stop)-1 characters wait until safe.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), cut=None):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.cut = cut  # text -> where to end it, or None (fim.text_cut): releases whole lines
        self.was_cut = False
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.prefix = self.read = self.shown = 0
        self.text, self.stopped = "", False

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self.prefix : self.read])
        now = self.tokenizer.decode(self.tokens[self.prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):  # a whole character more
            self._append(now[len(before) :])
            self.prefix, self.read = self.read, len(self.tokens)
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self._append(
                self.tokenizer.decode(self.tokens[self.prefix :])[
                    len(self.tokenizer.decode(self.tokens[self.prefix : self.read])) :
                ]
            )
            self.prefix = self.read = len(self.tokens)
        return self._release(final=True)

    def _append(self, new: str) -> None:
        scan = max(len(self.text) - self.hold, 0)
        self.text += new
        hits = [i for i in (self.text.find(s, scan) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
        elif self.cut is not None and (end := self.cut(self.text)) is not None:
            self.text, self.stopped, self.was_cut = self.text[:end], True, True

    def _release(self, final: bool) -> str:
        end = (
            len(self.text) if final or self.stopped else max(len(self.text) - self.hold, self.shown)
        )
        if self.cut is not None and not (final or self.stopped):  # a cut may fall at a newline
            end = min(end, max(self.text.rfind("\n"), self.shown))
        piece, self.shown = self.text[self.shown : end], end
        return piece


def text_pieces(steps: Iterator[list[int]], text: TextAssembler) -> Iterator[str]:
    """Text pieces of the tokens `steps` commits, one token at a time, so a stop string ends the
    output at its token (`steps` is then closed: generation stops at the current step). Returns the
    tokens kept.

    >>> from types import SimpleNamespace
    >>> asm = TextAssembler(SimpleNamespace(decode=lambda ids: "".join(map(chr, ids))), stop=("c",))
    >>> list(text_pieces(iter([[97, 98], [99, 100]]), asm)), asm.text
    (['a', 'b'], 'ab')
    """
    tokens: list[int] = []
    for committed in steps:
        for token in committed:
            tokens.append(token)
            if piece := text.add(token):
                yield piece
            if text.stopped:
                break
        if text.stopped:
            _close(steps)
            break
    if piece := text.finish():
        yield piece
    return tokens


def _close(steps: Iterable) -> None:
    close = getattr(steps, "close", None)
    if close is not None:
        close()
