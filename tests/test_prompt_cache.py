"""The runtime keeps its last sequence: a request that repeats the last one's start prefills only
what is new, and decodes exactly what a cold run decodes (tier 1)."""

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = [1 + (7 * i) % 50 for i in range(40)]
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 3}


def _cold(gen, ids, **opts):
    return gen.generate_ids(ids, 12, stop_token_ids=(), cache_prompt=False, **opts)


def _warm(gen, ids, **opts):
    return gen.generate_ids(ids, 12, stop_token_ids=(), **opts)


@pytest.fixture(scope="module")
def gen(tiny_bundle):
    return tiny_bundle("qwen3", 8).generator


@pytest.mark.parametrize("draft", ["none", "drafter", "lookup", "auto"])
@pytest.mark.parametrize("sampled", [False, True])
def test_a_conversation_reuses_its_prefix_and_decodes_as_cold(gen, draft, sampled):
    """Three turns, each the last prompt + its answer + a follow-up: every turn reuses what the last
    one left and gives the cold run's tokens (greedy and seeded sampling)."""
    opts = {"draft": draft, **(SAMPLED if sampled else {})}
    ids = list(BASE)
    gen.generate_ids([3], 1, stop_token_ids=(), cache_prompt=False)  # another sequence first
    for turn in range(3):
        warm = _warm(gen, ids, **opts)
        if turn:
            assert warm.stats.cached_tokens >= len(ids) - 8 - 1
        assert warm.token_ids == _cold(gen, ids, **opts).token_ids
        ids = ids + warm.token_ids + [5, 9 + turn, 11]


def test_an_edited_prompt_reuses_only_the_common_prefix(gen):
    first = _warm(gen, BASE)
    assert first.stats.cached_tokens == 0 or first.stats.cached_tokens < len(BASE)
    edited = BASE[:25] + [44, 45] + BASE[27:]
    warm = _warm(gen, edited)
    assert warm.stats.cached_tokens == 25
    assert warm.token_ids == _cold(gen, edited).token_ids
    # a prompt that is a prefix of what is cached: all but its last token are reused
    short = BASE[:30]
    _warm(gen, BASE)
    warm = _warm(gen, short)
    assert warm.stats.cached_tokens == 29
    assert warm.token_ids == _cold(gen, short).token_ids


def test_cache_prompt_false_reuses_nothing_and_is_checked(gen):
    from dflash_edge.runtime.validate import InvalidArgumentError

    _warm(gen, BASE)
    assert _cold(gen, BASE).stats.cached_tokens == 0
    with pytest.raises(InvalidArgumentError, match="cache_prompt"):
        gen.generate_ids(BASE, 4, cache_prompt="yes")


def test_a_stream_closed_mid_decode_leaves_a_state_the_next_request_can_trust(gen):
    """The client goes away after a few pieces: what was committed stays reusable, and the next
    request (sharing the prompt) decodes as a cold run."""
    text = "the cat sat on the mat and the dog sat on the log " * 3
    prompt = gen.encode(text, chat=False)
    stream = gen.stream(text, max_new_tokens=40, chat=False, draft="drafter")
    for _, _piece in zip(range(3), stream):
        pass
    stream.close()
    follow = prompt + [17, 18, 19]
    warm = _warm(gen, follow, draft="drafter")
    assert warm.stats.cached_tokens >= len(prompt) - 1
    assert warm.token_ids == _cold(gen, follow, draft="drafter").token_ids


def test_a_failure_inside_a_step_forgets_the_kept_state(gen, monkeypatch):
    """A graph run that fails mid-prefill leaves half-written caches: the next request reuses
    nothing and decodes as a cold run."""
    _warm(gen, BASE)
    runner, calls = gen.target.runner, {"n": 0}
    real = runner.run

    def failing(binding):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: the graph run failed")
        return real(binding)

    longer = BASE + list(range(20, 60))
    monkeypatch.setattr(runner, "run", failing)
    with pytest.raises(RuntimeError, match="injected"):
        _warm(gen, longer)
    monkeypatch.setattr(runner, "run", real)
    warm = _warm(gen, longer)
    assert warm.stats.cached_tokens == 0
    assert warm.token_ids == _cold(gen, longer).token_ids


def test_a_failure_mid_decode_forgets_the_kept_state(gen, monkeypatch):
    runner, calls = gen.target.runner, {"n": 0}
    real = runner.run

    def failing(binding):
        calls["n"] += 1
        if calls["n"] == 4:  # prefill ran; a decode step fails
            raise RuntimeError("injected: a decode step failed")
        return real(binding)

    monkeypatch.setattr(runner, "run", failing)
    with pytest.raises(RuntimeError, match="injected"):
        gen.generate_ids(BASE, 12, stop_token_ids=(), cache_prompt=False, draft="none")
    monkeypatch.setattr(runner, "run", real)
    warm = _warm(gen, BASE + [7], draft="none")
    assert warm.stats.cached_tokens == 0


def prefill_equals_one_full_step(target, ids, chunk):
    """Prefill in chunks of `chunk` (the last one shorter) with logits on its last row only, then
    the same ids as one step with logits on every row: the last token's logits agree, and the
    next token decodes alike from both caches."""
    import numpy as np

    step, row = target.prefill(ids, chunk)
    assert step["logits"].shape[1] == 1  # the LM head ran on the last row only
    chunked = np.array(step["logits"][0, row])
    after = np.array(target.run([ids[-1] % 7 + 1])["logits"][0, 0])
    target.reset()
    full = target.run(ids)
    assert full["logits"].shape[1] == len(ids)
    np.testing.assert_allclose(chunked, full["logits"][0, -1], atol=2e-4, rtol=1e-4)
    target.commit(len(ids))
    np.testing.assert_allclose(
        after, target.run([ids[-1] % 7 + 1])["logits"][0, 0], atol=2e-4, rtol=1e-4
    )
    target.reset()


@pytest.mark.parametrize("graph", ["target", "target_fused"])
def test_prefill_chunks_compute_the_last_row_as_one_full_step(tiny_bundle, graph):
    from dflash_edge.runtime.generator import Generator

    gen = Generator.load(tiny_bundle("qwen3", 8).path, target_graph=graph)
    prefill_equals_one_full_step(gen.target, BASE, 16)  # 40 = 16 + 16 + 8


OTHER = [2 + (11 * i) % 47 for i in range(36)]


@pytest.fixture
def kept(gen):
    """`gen` keeping other sequences in RAM for the test (then the live one only, as loaded)."""
    gen.keep_prompts(64)
    yield gen
    gen.keep_prompts(0)


@pytest.mark.parametrize("draft", ["drafter", "auto"])
@pytest.mark.parametrize("sampled", [False, True])
def test_alternating_conversations_each_resume_their_own_prefix(kept, draft, sampled):
    """Two conversations, turn by turn in alternation: each turn resumes its own conversation from
    the prompt cache and decodes as a cold run."""
    opts = {"draft": draft, **(SAMPLED if sampled else {})}
    talks = [list(BASE), list(OTHER)]
    for turn in range(3):
        for i, ids in enumerate(talks):
            warm = _warm(kept, ids, **opts)
            if turn:
                assert warm.stats.cached_tokens >= len(ids) - 4 - 8
            assert warm.token_ids == _cold(kept, ids, **opts).token_ids
            talks[i] = ids + warm.token_ids + [5, 9 + turn, 11]
            # the cold run replaced the live sequence: the next warm call restores its own
            _warm(kept, talks[i][:-3], **opts)
    assert 1 <= len(kept.prompt_cache.entries) <= 2


def test_the_prompt_cache_is_bounded_in_bytes_least_recently_used_out(kept):
    _warm(kept, BASE)
    _warm(kept, OTHER)  # BASE goes to the cache
    one = kept.prompt_cache.entries[0].nbytes
    assert one > 0 and kept.prompt_cache.nbytes == one
    kept.keep_prompts(1.5 * one / 1e6)  # room for one sequence (an emptied cache)
    third = [3 + (13 * i) % 43 for i in range(38)]
    for ids in (BASE, OTHER, third):
        _warm(kept, ids)
    assert [len(e.ids) for e in kept.prompt_cache.entries] == [len(OTHER) + 11]
    assert _warm(kept, OTHER).stats.cached_tokens == len(OTHER) - 1  # its last token runs
    assert _warm(kept, BASE).stats.cached_tokens == 0  # BASE was dropped: nothing reused
    kept.keep_prompts(0.5 * one / 1e6)  # no sequence fits: dropped, never kept half
    _warm(kept, BASE)
    _warm(kept, third)
    assert kept.prompt_cache.entries == [] and _warm(kept, BASE).stats.cached_tokens == 0


def test_a_failed_restore_reuses_nothing(kept, monkeypatch):
    _warm(kept, BASE)
    _warm(kept, OTHER)
    real = kept.target.restore

    def broken(saved):
        real(saved)
        raise RuntimeError("restore failed")

    monkeypatch.setattr(kept.target, "restore", broken)
    with pytest.raises(RuntimeError, match="restore failed"):
        _warm(kept, BASE + [7])
    monkeypatch.undo()
    warm = _warm(kept, BASE + [7])
    assert warm.stats.cached_tokens == 0 and warm.token_ids == _cold(kept, BASE + [7]).token_ids


def test_cache_ram_is_checked(gen):
    from dflash_edge.runtime.validate import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="cache_ram_mb"):
        gen.keep_prompts(-1)
