"""Issue 24 item 5: one step for every proposal source, one options object with one set of defaults
(tier 1)."""

import dataclasses
import inspect

import pytest

from dflash_edge.runtime.policy import AdaptivePolicy, Choice, FixedPolicy, make_policy
from dflash_edge.runtime.proposals import LookupProposals
from dflash_edge.runtime.sampling import SamplingParams
from dflash_edge.runtime.validate import DRAFT_MODES, GenerationOptions, InvalidArgumentError

from runtime_cases import REPEATING

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_k=12, seed=4)]
)
def test_every_draft_mode_commits_the_plain_tokens(tiny_bundle, sampling):
    gen = tiny_bundle("qwen3", 8).generator
    plain = gen.generate_ids(REPEATING, 40, sampling, draft="none", stop_token_ids=())
    assert plain.stats.plain_steps == plain.stats.target_calls and not plain.stats.verify_lens
    for draft in DRAFT_MODES:
        got = gen.generate_ids(REPEATING, 40, sampling, draft=draft, stop_token_ids=())
        s = got.stats
        assert got.token_ids == plain.token_ids, draft
        assert (
            s.target_calls == len(s.acceptance_lengths) + len(s.lookup_lengths) + s.plain_steps
        ), draft
    lookup = gen.generate_ids(REPEATING, 40, sampling, draft="lookup", stop_token_ids=())
    assert (
        lookup.stats.lookup_lengths
        and not lookup.stats.acceptance_lengths
        and not lookup.stats.draft_calls
    )


def test_fixed_policies_and_the_lookup_source():
    assert make_policy("none", 8).pick({}, room=9) == Choice("plain")
    assert make_policy("drafter", 8, verify_len=3).pick({}, room=9) == Choice("drafter", 3)
    assert isinstance(make_policy("auto", 8), AdaptivePolicy)
    src = LookupProposals([1, 2, 3, 4, 1, 2], limit=7)
    offers = {"lookup": src.propose(2, 5, 7)}
    assert offers["lookup"].tokens[:2] == [3, 4] and offers["lookup"].first == 6
    assert FixedPolicy("lookup", 7).pick(offers, room=100) == Choice("lookup", 7)
    assert FixedPolicy("lookup", 7).pick(offers, room=3) == Choice(
        "lookup", 2
    )  # never past the budget
    src.commit([9, 10])  # two new tokens: no proposal
    assert FixedPolicy("lookup", 7).pick({"lookup": src.propose(10, 7, 7)}, room=100) == Choice(
        "plain"
    )


def test_options_have_one_set_of_defaults(tiny_bundle):
    """generate / stream / generate_ids take GenerationOptions or its fields; no second set of
    defaults."""
    from dflash_edge.runtime import Generator

    for method in (Generator.generate, Generator.stream):
        assert [p for p in inspect.signature(method).parameters] == [
            "self",
            "prompt",
            "options",
            "fields",
        ]
    defaults = GenerationOptions()
    assert (defaults.max_new_tokens, defaults.temperature, defaults.draft, defaults.verify_len) == (
        128,
        0.0,
        "auto",
        None,
    )
    gen = tiny_bundle("qwen3", 8).generator
    opts = GenerationOptions(max_new_tokens=12, temperature=0.9, seed=5, draft="drafter")
    by_object = gen.generate("t5 t6 t7", opts)
    by_fields = gen.generate(
        "t5 t6 t7", **{f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    )
    assert by_object.token_ids == by_fields.token_ids and len(by_object.token_ids) == 12
    assert (
        gen.generate("t5 t6 t7", opts, draft="none").token_ids == by_object.token_ids
    )  # a field overrides
    assert by_object.stats.prefill_s > 0 and by_object.stats.ttft_s >= by_object.stats.prefill_s


@pytest.mark.parametrize(
    "fields, argument",
    [
        ({"use_draft": True}, "use_draft"),
        ({"draft": True}, "draft"),
        ({"draft": "always"}, "draft"),
        ({"verify_len": 0}, "verify_len"),
        ({"verify_len": 8}, "verify_len"),
    ],
)
def test_bad_options_are_named(tiny_bundle, fields, argument):
    gen = tiny_bundle("qwen3", 8).generator
    for call in (lambda: gen.generate("t5", **fields), lambda: gen.generate_ids([5], 4, **fields)):
        with pytest.raises(InvalidArgumentError) as err:
            call()
        assert err.value.argument == argument and str(err.value).startswith(f"{argument}=")


def test_server_requests_build_the_same_options():
    from dflash_edge.serve.protocol import parse_request

    job = parse_request(
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 9,
            "seed": 1,
            "draft": "lookup",
        },
        chat=True,
    )
    assert (
        job.options
        == GenerationOptions(max_new_tokens=9, temperature=1.0, seed=1, draft="lookup").checked()
    )
    with pytest.raises(InvalidArgumentError, match="max_tokens=0") as err:
        parse_request({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}, chat=True)
    assert err.value.argument == "max_tokens"
