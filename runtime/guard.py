"""One generation at a time per `Generator`: its KV cache and step buffers are single-sequence.

Other threads wait their turn (so their tokens are those of sequential runs); a second generation in
the thread that already holds the Generator (two interleaved `stream()`s) cannot wait for itself, so
it is refused with `GeneratorBusyError` until the first finishes or is closed.

>>> guard = GenerationGuard()
>>> hold = guard.acquire()
>>> guard.acquire()                                   # doctest: +ELLIPSIS
Traceback (most recent call last):
...
dflash_edge.runtime.guard.GeneratorBusyError: this thread already has a generation open on this Generator ...
>>> hold.release(); guard.acquire().release()
"""  # noqa: E501

from __future__ import annotations

import threading

from .errors import DflashEdgeError


class GeneratorBusyError(DflashEdgeError, RuntimeError):
    """A second generation started in the thread whose earlier stream on the same Generator is still
    open."""


class Hold:
    """The right to run one generation; `release()` is idempotent (close, exhaustion and GC may all
    call it)."""

    def __init__(self, guard: "GenerationGuard"):
        self._guard, self._done = guard, threading.Lock()

    def release(self) -> None:
        if self._done.acquire(blocking=False):  # first call only
            self._guard._owner = None
            self._guard._lock.release()


class GenerationGuard:
    def __init__(self):
        self._lock = threading.Lock()  # not an RLock: a Hold may be released from another thread
        self._owner: int | None = None

    def acquire(self) -> Hold:
        """Wait for the Generator (other threads), or refuse at once (this thread already holds
        it)."""
        if self._owner == threading.get_ident():
            raise GeneratorBusyError(
                "this thread already has a generation open on this Generator (an unfinished "
                "stream()); one "
                "Generator runs one sequence at a time: finish or close() the first stream, or "
                "load a second "
                "Generator for a second concurrent sequence"
            )
        self._lock.acquire()
        self._owner = threading.get_ident()
        return Hold(self)
