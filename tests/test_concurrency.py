"""The thread rule (issue 16): one Generator serialises threads (same tokens as sequential runs) and
refuses a second open stream in the same thread with a named error, released when the first finishes
or closes (tier 1)."""

import gc
import threading

import pytest

from dflash_edge.runtime.guard import GeneratorBusyError

PROMPTS = ["t5 t6 t7", "t9 t1 t33 t42 t8 t8", "t70", "t12 t13 t14 t15 t16 t17 t18 t19 t20 t21"]
KWARGS = [
    {},
    {"temperature": 0.9, "seed": 4},
    {"draft": "none"},
    {"temperature": 1.2, "top_p": 0.8, "seed": 9},
]


def test_threads_get_the_tokens_of_sequential_runs(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    jobs = [(p, kw) for p in PROMPTS for kw in KWARGS]
    expected = [gen.generate(p, max_new_tokens=24, **kw).token_ids for p, kw in jobs]
    got, errors = [None] * len(jobs), []

    def worker(offset):
        try:
            for i in range(offset, len(jobs), 4):
                p, kw = jobs[i]
                if i % 2:  # half through stream(), half through generate()
                    s = gen.stream(p, max_new_tokens=24, **kw)
                    "".join(s)
                    got[i] = s.result.token_ids
                else:
                    got[i] = gen.generate(p, max_new_tokens=24, **kw).token_ids
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and got == expected


def test_two_streams_in_one_thread_refuse_the_second(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    alone = gen.generate(PROMPTS[1], max_new_tokens=20).token_ids
    first = gen.stream(PROMPTS[1], max_new_tokens=20)
    pieces = iter(first)
    next(pieces)
    with pytest.raises(
        GeneratorBusyError, match="already has a generation open.*close\\(\\) the first stream"
    ):
        gen.stream(PROMPTS[0], max_new_tokens=5)
    with pytest.raises(GeneratorBusyError):
        gen.generate(PROMPTS[0], max_new_tokens=5)
    with pytest.raises(GeneratorBusyError):
        gen.generate_ids([5, 6], 5)
    for _ in pieces:  # the first stream is untouched by the refusals
        pass
    assert first.result.token_ids == alone
    assert gen.generate(PROMPTS[0], max_new_tokens=5).token_ids  # released once exhausted


@pytest.mark.parametrize("how", ["close", "with", "drop-unstarted", "break"])
def test_closing_or_dropping_a_stream_releases_the_generator(tiny_bundle, how):
    gen = tiny_bundle("qwen3", 8).generator
    expected = gen.generate(PROMPTS[2], max_new_tokens=6).token_ids
    if how == "close":
        s = gen.stream(PROMPTS[1], max_new_tokens=30)
        next(iter(s))
        s.close()
    elif how == "with":
        with gen.stream(PROMPTS[1], max_new_tokens=30) as s:
            next(iter(s))
    elif how == "drop-unstarted":
        gen.stream(PROMPTS[1], max_new_tokens=30)  # never iterated, never kept
        gc.collect()
    else:
        for _ in gen.stream(PROMPTS[1], max_new_tokens=30):
            break
        gc.collect()
    assert gen.generate(PROMPTS[2], max_new_tokens=6).token_ids == expected


class SignallingLock:
    """A Lock whose `waiting` event is set when an acquire finds it held and has to wait."""

    def __init__(self):
        self.lock, self.waiting = threading.Lock(), threading.Event()

    def acquire(self, blocking=True, timeout=-1):
        if self.lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        self.waiting.set()
        return self.lock.acquire(True, timeout)

    def release(self):
        self.lock.release()


def test_another_thread_waits_for_an_open_stream(tiny_bundle, monkeypatch):
    gen = tiny_bundle("qwen3", 8).generator
    expected = gen.generate(PROMPTS[0], max_new_tokens=10).token_ids
    lock = SignallingLock()
    monkeypatch.setattr(gen._guard, "_lock", lock)
    s = gen.stream(PROMPTS[3], max_new_tokens=10)
    out = {}
    t = threading.Thread(
        target=lambda: out.update(ids=gen.generate(PROMPTS[0], max_new_tokens=10).token_ids)
    )
    t.start()
    assert lock.waiting.wait(timeout=30)  # the thread reached the guard and waits there ...
    assert t.is_alive() and "ids" not in out  # ... not interleaving with the open stream
    "".join(s)
    t.join(timeout=60)
    assert out["ids"] == expected
