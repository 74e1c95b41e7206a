"""One generation at a time per loaded bundle; the rest wait in a bounded queue; beyond it,
ServerBusy (429).

A single worker thread runs the jobs in arrival order (the Generator's caches are single-sequence),
and hands each job's events to the event loop: ("started", None), ("piece", text) ..., then ("done",
result) or ("error", exception). A ticket cancelled by its client (a closed stream) stops its
generation at the next text piece, which frees the Generator for the next job; a job whose client
left while it waited gives its queue slot back at once and never starts.

>>> sched = Scheduler(gen, max_queue=8)  # doctest: +SKIP
>>> # on the event loop; ServerBusy when full:
>>> ticket = sched.submit(job.prompt, job.options)  # doctest: +SKIP
>>> async for kind, value in ticket: ...  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..runtime.errors import DflashEdgeError


class ServerBusy(DflashEdgeError):
    """The queue is full; `retry_after` (seconds) estimates when a slot frees up."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Ticket:
    """One admitted job's event channel (worker thread -> event loop) and its cancel flag."""

    def __init__(self, loop: asyncio.AbstractEventLoop, scheduler: "Scheduler"):
        self.loop, self.events, self.scheduler = loop, asyncio.Queue(), scheduler
        self.cancelled = threading.Event()
        self.state = "waiting"  # -> "running" -> "finished", or "dropped" (left waiting)

    def put(self, kind: str, value=None) -> None:  # worker thread
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop has closed (server shutting down)
            self.cancelled.set()

    def cancel(self) -> None:
        """The client is gone or done: stop at the next piece; a job still waiting gives its queue
        slot back now."""
        self.cancelled.set()
        self.scheduler.drop_if_waiting(self)

    def __aiter__(self):
        return self

    async def __anext__(self):
        kind, value = await self.events.get()
        if kind == "end":
            raise StopAsyncIteration
        return kind, value


class Scheduler:
    def __init__(self, generator, max_queue: int):
        self.generator, self.max_queue = generator, max_queue
        # jobs admitted and not finished; one of them running?
        self.admitted, self.running = (
            0,
            False,
        )
        self.mean_s = 1.0  # running mean of a job's seconds (for Retry-After)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dflash-generate")

    @property
    def waiting(self) -> int:
        return self.admitted - self.running

    def submit(self, prompt, options) -> Ticket:
        """Admit `prompt` with `options` (checked GenerationOptions) or raise ServerBusy; call on
        the event loop."""
        with self._lock:
            if self.admitted >= 1 + self.max_queue:
                # counted from `admitted`, not `waiting`: between two jobs `running` is briefly
                # False while the
                # worker picks up the next, and `waiting` then counts that job too (said "5 waiting"
                # at --max-queue 4)
                wait = max(1, math.ceil(self.mean_s * self.admitted))
                raise ServerBusy(
                    f"the server is busy: 1 generation running and {self.admitted - 1} waiting "
                    f"(--max-queue {self.max_queue}); retry in about {wait} s",
                    wait,
                )
            self.admitted += 1
        loop = asyncio.get_running_loop()
        ticket = Ticket(loop, self)
        loop.run_in_executor(self._worker, self._run, prompt, options, ticket)
        return ticket

    def drop_if_waiting(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.state == "waiting":
                ticket.state, self.admitted = "dropped", self.admitted - 1

    def _run(self, prompt, options, ticket: Ticket) -> None:  # worker thread, one job at a time
        with self._lock:
            if ticket.state == "dropped":  # its client left while it waited
                ticket.put("end")
                return
            ticket.state, self.running = "running", True
        t0, stream = time.perf_counter(), None
        try:
            stream = self.generator.stream(prompt, options)
            ticket.put("started")
            for piece in stream:
                if ticket.cancelled.is_set():
                    break  # the client left: free the Generator now
                ticket.put("piece", piece)
            else:
                ticket.put("done", stream.result)
        except Exception as err:  # noqa: BLE001 (reported to the client, not swallowed)
            ticket.put("error", err)
        finally:
            if stream is not None:
                stream.close()
            self.mean_s = 0.8 * self.mean_s + 0.2 * (time.perf_counter() - t0)
            with self._lock:
                self.admitted, self.running, ticket.state = self.admitted - 1, False, "finished"
            ticket.put("end")

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
