"""Issue 13 (tier 1): verify length k, prompt lookup, the adaptive policy, `tune` and tuned.json,
bench arms."""

import json
import random
import shutil

import numpy as np
import pytest

from dflash_edge.runtime.sampling import SamplingParams

from runtime_cases import (  # the `oracle` fixture: conftest.py
    PROMPTS,
    REPEATING,
    SAMPLERS,
    reference,
)
from tiny import check_two_token_distribution

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def synthetic_tuned(gen, verify_len=0, acceptance=0.0, decode_ms=1.0, verify_ms=1.1, draft_ms=0.5):
    from dflash_edge.runtime.tuning import Tuned, manifest_digest

    drafts = gen.block_size - 1
    return Tuned(
        verify_len=verify_len,
        decode_ms=decode_ms,
        draft_ms=draft_ms,
        verify_ms={k: verify_ms for k in range(1, drafts + 1)},
        acceptance=[acceptance] * drafts,
        manifest_sha256=manifest_digest(gen.bundle.manifest),
    )


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path):
    """A private copy of the block-8 tiny bundle (tuned.json is written into it)."""
    return shutil.copytree(tiny_bundle("qwen3", 8).path, tmp_path / "bundle")


# ---- verify length k
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 7])
def test_verify_len_bounds_each_step_and_stays_lossless(tiny_bundle, oracle, k):
    tb = tiny_bundle("qwen3", 8)
    want = reference(tb, PROMPTS[1], 40, stop=())
    oracle(tb.generator, PROMPTS[1] + want.token_ids, 1.0)
    got = tb.generator.generate_ids(
        PROMPTS[1], 40, draft="drafter", verify_len=k, stop_token_ids=()
    )
    assert got.token_ids == want.token_ids
    steps = got.stats.acceptance_lengths
    assert (
        all(a == k + 1 for a in steps[:-1]) and 1 <= steps[-1] <= k + 1
    )  # T = k + 1: k drafts + bonus


@pytest.mark.parametrize("sampling", SAMPLERS[:2])
def test_verify_len_sampled_same_tokens_as_plain(tiny_bundle, oracle, sampling):
    tb = tiny_bundle("llama", 8)
    plain = tb.generator.generate_ids(PROMPTS[1], 40, sampling, draft="none", stop_token_ids=())
    oracle(tb.generator, PROMPTS[1] + plain.token_ids, 0.9)
    for k in (2, 5):
        got = tb.generator.generate_ids(
            PROMPTS[1], 40, sampling, draft="drafter", verify_len=k, stop_token_ids=()
        )
        assert got.token_ids == plain.token_ids and max(got.stats.acceptance_lengths) <= k + 1


@pytest.mark.parametrize(
    "bad, named",
    [
        (0, r"outside 1\.\.7.*block size 8"),
        (8, r"outside 1\.\.7.*block size 8"),
        (99, r"outside 1\.\.7"),
        (-1, r"outside 1\.\.7"),
        (2.5, r"expected an integer in \[1, 7\] \(block size 8\).*got float"),
        (True, r"expected an integer in \[1, 7\].*got bool"),
    ],
)
def test_verify_len_out_of_range_is_named(tiny_bundle, bad, named):
    from dflash_edge.runtime.validate import VerifyLengthError

    with pytest.raises(VerifyLengthError, match=named):
        tiny_bundle("qwen3", 8).generator.generate_ids(PROMPTS[0], 4, verify_len=bad)


def test_verify_len_flag_errors_in_the_cli(tiny_bundle, capsys):
    from dflash_edge.cli import main

    path = str(tiny_bundle("qwen3", 8).path)
    assert main(["run", path, "--prompt", "t5", "--verify-len", "9"]) == 2
    assert "outside 1..7" in capsys.readouterr().err
    assert main(["bench", path, "--verify-len", "0", "--limit", "1"]) == 2
    assert "outside 1..7" in capsys.readouterr().err


# ---- prompt lookup
# --------------------------------------------------------------------------------------
def brute_lookup(h, limit, max_match=32):
    """The earlier occurrence of the last token whose preceding tokens agree longest with h's suffix
    (ties: the latest), continued periodically past the end; for a new last token, the best
    occurrence of the suffix before it (agreeing for 2 or more), one source token skipped.
    (proposal, matched)."""

    def best(n):
        best_end, most = 0, 0
        for end in range(1, n):  # h[end - 1] is an occurrence, h[end] follows
            m = 0
            while m < min(end, max_match) and h[end - 1 - m] == h[n - 1 - m]:
                m += 1
            if m and m >= most:
                best_end, most = end, m
        return best_end, most

    start, matched = best(len(h))
    if not matched and len(h) > 2 and h[-1] not in h[:-1]:
        end, agree = best(len(h) - 1)
        start, matched = end + 1, int(agree >= 2)
    if not matched:
        return [], 0
    ext = h + [None] * limit
    for i in range(len(h), len(ext)):
        ext[i] = ext[i - (len(h) - start)]
    return ext[start : start + limit], matched


def test_lookup_matches_a_brute_force_search():
    from dflash_edge.runtime.lookup import PromptLookup

    rng = random.Random(0)
    for trial in range(600):
        h = [rng.randrange((3, 6, 12)[trial % 3]) for _ in range(rng.randrange(1, 40))]
        lk = PromptLookup(h[:5], max_match=6)
        for i in range(5, len(h)):
            lk.extend([h[i]])
        assert lk.history == h and (lk.propose(6), lk.matched) == brute_lookup(h, 6, max_match=6)


def test_lookup_picks_the_occurrence_that_agrees_longest():
    from dflash_edge.runtime.lookup import PromptLookup

    quoted = [10, 11, 12, 13, 14, 15, 16]  # the prompt quotes a text ...
    noise = [20, 12, 30, 21, 12, 31]  # ... and "12" occurs later, in other contexts
    lk = PromptLookup(quoted + noise + [10, 11, 12])  # the answer starts copying the quote
    assert lk.propose(4) == [13, 14, 15, 16] and lk.matched == 3  # not 31 (after the latest "12")
    lk.extend([13, 40])  # the copy breaks: "40" is new, so it replaced "14"
    assert lk.propose(2) == [15, 16] and lk.matched == 1
    lk.extend([12])  # "40 12" is new: every "12" agrees for 1 token,
    assert lk.propose(2) == [13, 40] and lk.matched == 1  # and the latest (the answer's own) wins
    lk.extend([41, 42])  # two new tokens: no guess
    assert lk.propose(2) == [] and lk.matched == 0


def test_prompt_lookup_greedy_equals_plain(tiny_bundle):
    for variant in ("llama", "qwen3"):
        gen = tiny_bundle(variant, 8).generator
        for prompt in (REPEATING, PROMPTS[3]):
            plain = gen.generate_ids(prompt, 60, draft="none", stop_token_ids=())
            auto = gen.generate_ids(prompt, 60, stop_token_ids=())
            assert auto.token_ids == plain.token_ids
    s = auto.stats
    assert (
        s.lookup_lengths
        and s.target_calls == len(s.acceptance_lengths) + len(s.lookup_lengths) + s.plain_steps
    )


@pytest.fixture
def always_lookup(monkeypatch):
    """Known step times, over a prompt that holds every token: a lookup proposal every step."""

    def install(gen):
        monkeypatch.setattr(
            gen, "tuned", synthetic_tuned(gen)
        )  # no plain step needed to measure decode
        return random.Random(1).sample(range(96), 96) + PROMPTS[0]

    return install


@pytest.mark.parametrize("sampling", SAMPLERS)
def test_prompt_lookup_sampled_same_tokens_as_plain(tiny_bundle, always_lookup, sampling):
    gen = tiny_bundle("llama", 8).generator
    prompt = always_lookup(gen)
    plain = gen.generate_ids(prompt, 24, sampling, draft="none", stop_token_ids=())
    auto = gen.generate_ids(prompt, 24, sampling, stop_token_ids=())
    assert auto.token_ids == plain.token_ids and len(auto.stats.lookup_lengths) >= 5


def test_prompt_lookup_sampling_distribution_matches_target(tiny_bundle, always_lookup):
    """The 2nd token comes from verifying a lookup proposal."""
    tb = tiny_bundle("qwen3", 4)
    gen = tb.generator
    prompt = always_lookup(gen)
    lookups = []

    def sample_pair(seed):
        res = gen.generate_ids(
            prompt, 3, SamplingParams(1.0, top_k=5, seed=seed), stop_token_ids=()
        )
        lookups.append(len(res.stats.lookup_lengths))
        return res.token_ids[:2]

    check_two_token_distribution(tb.target, prompt, sample_pair, n=800)
    assert sum(lookups) >= 0.9 * len(lookups)  # nearly every 2nd token went through lookup


# ---- the adaptive policy
# ----------------------------------------------------------------------------------
class ScriptedDrafter:
    """Stands in for draft_model.DraftModel: drafts what the test sets in `next`; a pass takes
    `seconds`."""

    def __init__(self, seconds: float):
        self.now, self.seconds, self.next = 0.0, seconds, []

    def draft(self, last_token, ctx_end):
        self.now += self.seconds
        return np.array(self.next)

    def clock(self) -> float:
        return self.now


class ScriptedLookup:
    """Stands in for lookup.PromptLookup: proposes `next`, with agreement `matched`."""

    def __init__(self):
        self.next, self.matched, self.max_match = [], 0, 32

    def propose(self, limit):
        return self.next[:limit]

    def extend(self, tokens):
        pass


def scripted(block_size=16, draft_s=0.015, tuned=None, verify_len=None):
    """An adaptive policy over a scripted drafter and prompt lookup: (Proposer, drafter, lookup)."""
    from dflash_edge.runtime.policy import AdaptivePolicy
    from dflash_edge.runtime.proposals import DrafterProposals, LookupProposals, Proposer

    drafter = ScriptedDrafter(draft_s)
    lookup = LookupProposals([0], block_size - 1)
    lookup.lookup = ScriptedLookup()
    sources = [lookup, DrafterProposals(drafter, block_size - 1, tuned, clock=drafter.clock)]
    policy = AdaptivePolicy(block_size, sources, tuned, verify_len)
    return Proposer(sources, policy, block_size - 1), drafter, lookup.lookup


def drive(proposer, steps, truth_of, spec_s=lambda k: 0.05 + 0.003 * k, decode_s=0.05):
    """Run `steps` steps of the loop's propose -> verify -> commit with target tokens
    `truth_of(i, history)` and the given step times; the choices in order."""
    history, chosen = [0], []
    for i in range(steps):
        truth = truth_of(i, history)
        choice, proposals = proposer.propose(history[-1], len(history) - 1, room=1000)
        ok = next((j for j, d in enumerate(proposals) if d != truth[j]), len(proposals))
        history += truth[: ok + 1]
        proposer.commit(truth[: ok + 1], spec_s(choice.k) if choice.k else decode_s)
        chosen.append(choice)
    return chosen


def simulate(
    accept, steps, block_size=16, spec_s=lambda k: 0.05 + 0.003 * k, decode_s=0.05, draft_s=0.015
):
    """Drive an adaptive policy with a drafter whose draft j is right with probability accept(step)
    (given j-1 right) and no lookup proposal; (drafter k per step, 0 when plain; the policy)."""
    proposer, drafter, _ = scripted(block_size, draft_s)
    rng = np.random.default_rng(0)

    def truth_of(i, history):
        truth = [int(rng.integers(1, 1000)) for _ in range(block_size)]
        drafter.next = [t if rng.random() < accept(i) else -1 for t in truth[: block_size - 1]]
        return truth

    chosen = drive(proposer, steps, truth_of, spec_s, decode_s)
    return [c.k if c.source == "drafter" else 0 for c in chosen], proposer.policy


def test_adaptive_policy_switches_k_with_acceptance():
    ks, _ = simulate(lambda i: 0.95 if i < 150 else 0.5 if i < 300 else 0.0, 450)
    good, middling, useless = ks[100:150], ks[250:300], ks[400:450]
    assert np.median(good) >= 10  # long k while drafts are right
    assert 2 <= np.median(middling) <= 6  # short k when half are (best: 3-4)
    assert sum(k > 0 for k in useless) == 0  # plain decoding when none are


def test_adaptive_policy_follows_step_costs():
    cheap, _ = simulate(lambda i: 0.6, 200, spec_s=lambda k: 0.051)
    dear, _ = simulate(lambda i: 0.6, 200, spec_s=lambda k: 0.05 + 0.008 * k)
    assert (
        np.median(cheap[100:]) >= 6 and 2 <= np.median(dear[100:]) <= 5
    )  # dearer verifies: shorter k (best 3)


def drive_lookup(
    proposer, lookup, steps, match, right, spec_s=lambda k: 0.05 + 0.003 * k, decode_s=0.05
):
    """Drive `proposer` with a lookup proposing kmax tokens of agreement `match(i)` whose first
    `right(i)` are right (the drafter drafts nothing); the step's (source, k, probe) per step."""
    kmax = proposer.limit

    def truth_of(i, history):
        truth = list(range(len(history), len(history) + kmax + 1))  # the target's tokens
        lookup.next, lookup.matched = truth[: right(i)] + [-1] * (kmax - right(i)), match(i)
        return truth

    return [(c.source, c.k, c.probe) for c in drive(proposer, steps, truth_of, spec_s, decode_s)]


def test_policy_verifies_a_long_copy_whole_and_stops_verifying_failing_lookups():
    copy = drive_lookup(*scripted()[::2], 40, match=lambda i: 32, right=lambda i: 15)
    assert (
        all(src == "lookup" for src, _, _ in copy[1:])
        and [k for _, k, _ in copy[-10:]] == [15] * 10
    )
    failing = drive_lookup(*scripted()[::2], 200, match=lambda i: 1, right=lambda i: 0)
    assert sum(src == "lookup" for src, _, _ in failing[50:]) <= 5  # counted, then left plain
    assert not any(probe for src, _, probe in copy)  # no drafter probe beside a good lookup


def test_policy_shares_what_long_agreements_taught_across_match_lengths():
    from dflash_edge.runtime.policy import Choice

    (fresh, _, fresh_lookup), (taught, _, taught_lookup) = scripted(), scripted()
    fresh.propose(0, 0, room=1000)
    fresh.commit([1], 0.05)  # a plain step: decode measured
    drive_lookup(
        taught, taught_lookup, 30, match=lambda i: 1 + 15 * (i % 2), right=lambda i: 15
    )  # copies that ran on
    for lookup in (fresh_lookup, taught_lookup):
        lookup.next, lookup.matched = list(range(100, 115)), 3  # a match length never seen
    before, after = fresh.propose(1, 1, room=1000)[0], taught.propose(1, 1, room=1000)[0]
    assert before.source == "lookup" and before.k < 15 and after == Choice("lookup", 15)


def test_adaptive_policy_is_seeded_by_tuned_and_capped_by_verify_len(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    good = synthetic_tuned(gen, verify_len=7, acceptance=1.0)
    assert scripted(8, tuned=good)[0].propose(0, 0, room=100)[0].k == 7  # from the first step
    assert scripted(8, tuned=good, verify_len=3)[0].propose(0, 0, room=100)[0].k == 3
    assert scripted(8, tuned=good)[0].propose(0, 0, room=3)[0].k == 2  # within the budget
    assert scripted(8, tuned=synthetic_tuned(gen))[0].propose(0, 0, room=100)[0].source == "plain"


def test_policy_rescales_tuned_times_measured_at_another_load(tiny_bundle):
    from dflash_edge.runtime.policy import Choice

    gen = tiny_bundle("qwen3", 8).generator
    busy = synthetic_tuned(
        gen, decode_ms=100.0, verify_ms=140.0, draft_ms=40.0
    )  # tuned on a busy machine
    policy = scripted(8, tuned=busy)[0].policy
    policy.learn(Choice("plain"), {}, seconds=0.020)  # now it is 5x faster
    assert policy.decode_s == 0.020 and policy.cost["drafter"] == pytest.approx(0.008)
    policy.learn(Choice("lookup", 5), {}, seconds=0.028)  # verify / decode as tuned: 1.4
    assert policy.scale == pytest.approx(1.0)  # not "verifies are free"
    assert policy.verify_s(5) == pytest.approx(0.028)


@pytest.fixture
def scripted_step_times(monkeypatch):
    """The adaptive policy fed `simulate`'s synthetic step times instead of those measured on this
    machine: a target pass verifying k proposals 50 + 3k ms (plain decoding 50 ms), a drafter pass
    15 ms. Yields the steps' choices in order."""
    from dflash_edge.runtime.policy import AdaptivePolicy

    measured, chosen = AdaptivePolicy.learn, []

    def learn(self, choice, made, seconds):
        chosen.append(choice)
        for proposal in made.values():
            proposal.seconds = 0.015 if proposal.seconds else 0.0
        measured(self, choice, made, 0.05 + 0.003 * choice.k)

    monkeypatch.setattr(AdaptivePolicy, "learn", learn)
    return chosen


def test_auto_uses_long_k_with_an_oracle_drafter(tiny_bundle, oracle, scripted_step_times):
    tb = tiny_bundle("qwen3", 8)
    want = reference(tb, PROMPTS[0], 60, stop=())
    oracle(tb.generator, PROMPTS[0] + want.token_ids, 1.0)
    got = tb.generator.generate_ids(PROMPTS[0], 60, stop_token_ids=())
    assert got.token_ids == want.token_ids
    ks = [c.k for c in scripted_step_times if c.source == "drafter"]
    assert got.stats.acceptance_lengths == [k + 1 for k in ks]  # every draft right: k + the bonus
    assert ks == sorted(ks) and ks[-1] == 7 and ks.count(7) >= 2  # k grows to the full block, stays
    assert sum(got.stats.acceptance_lengths) >= 45  # the drafter commits most of the 60


def test_adaptive_policy_probes_a_useless_drafter_rarely():
    ks, policy = simulate(lambda i: 0.0, 400)
    probes = sum(c.probe for c in policy.chosen)
    assert sum(ks) == 0 and 3 <= probes <= 15  # backs off to one probe in 64 steps


# ---- tune and tuned.json
# -----------------------------------------------------------------------------------
class StepClock:
    """Seconds that pass only while the models run: a target pass of T tokens 50 + 3T ms, a drafter
    pass 15 ms."""

    def __init__(self, monkeypatch, gen):
        self.now = 0.0
        forward, draft = gen.target.forward, gen.drafter.draft

        def timed_forward(size, start, rows=None):
            self.now += 0.050 + 0.003 * size
            return forward(size, start, rows)

        def timed_draft(last_token, ctx_end):
            self.now += 0.015
            return draft(last_token, ctx_end)

        monkeypatch.setattr(gen.target, "forward", timed_forward)
        monkeypatch.setattr(gen.drafter, "draft", timed_draft)  # before an oracle wraps the drafter

    def __call__(self) -> float:
        return self.now


def test_tune_picks_plain_for_a_useless_drafter_and_long_k_for_an_oracle(
    bundle_copy, oracle, monkeypatch
):
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.calibrate import Watch, tune
    from dflash_edge.runtime.tuning import read_tuned, write_tuned

    gen = Generator.load(bundle_copy)
    clock = StepClock(monkeypatch, gen)
    useless = tune(
        gen, ["t5 t6 t7"], budget_s=2, max_new_tokens=40, context=64, watch=Watch(clock=clock)
    )
    assert useless.decode_ms == 53.0 and useless.draft_ms == 15.0  # the scripted step times
    assert useless.verify_ms == {k: 53.0 + 3 * k for k in range(1, 8)}  # T = k + 1 tokens
    assert useless.verify_len == 0 and max(useless.acceptance) < 0.2
    assert (
        useless.expected_tokens_per_s
        == {  # (1 + S(1) + .. + S(k)) tokens per draft + verify(k)
            k: round(1e3 * (1 + sum(useless.acceptance[:k])) / (15.0 + 53.0 + 3 * k), 3)
            for k in range(1, 8)
        }
        | {0: 18.868}
    )
    plain = gen.generate("t5 t6 t7", max_new_tokens=40, draft="none")
    oracle(gen, gen.encode("t5 t6 t7") + plain.token_ids, 1.0)
    good = tune(
        gen, ["t5 t6 t7"], budget_s=2, max_new_tokens=40, context=64, watch=Watch(clock=clock)
    )
    assert good.acceptance == [1.0] * 7 and good.verify_len == 7  # the whole block, at 8 / 89 ms
    assert good.expected_tokens_per_s[7] == 89.888 and good.expected_tokens_per_s[0] == 18.868
    write_tuned(gen.bundle, good)
    assert read_tuned(gen.bundle) == good
    assert Generator.load(bundle_copy).tuned == good  # run, bench, Generator use it


def test_tune_cli_writes_tuned_json_and_bad_prompts_are_named(bundle_copy, tmp_path, capsys):
    from dflash_edge.cli import main

    prompts = tmp_path / "calib.jsonl"
    prompts.write_text(json.dumps({"prompt": "t5 t6 t7"}) + "\n")
    assert (
        main(
            [
                "tune",
                str(bundle_copy),
                "--prompts",
                str(prompts),
                "--budget-s",
                "1",
                "--max-new-tokens",
                "16",
                "--context",
                "32",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    tuned = json.loads((bundle_copy / "tuned.json").read_text())
    assert out["verify_len"] == tuned["verify_len"] and tuned["format"] == "dflash-edge-tuned"
    assert not list(bundle_copy.glob(".tuned.*"))  # no temp file left behind
    prompts.write_text('{"prompt": "t5"}\n{"prompt": oops}\n')
    assert main(["tune", str(bundle_copy), "--prompts", str(prompts), "--budget-s", "1"]) == 2
    assert "calib.jsonl:2 is not valid JSON" in capsys.readouterr().err
    prompts.write_text("")
    assert main(["tune", str(bundle_copy), "--prompts", str(prompts), "--budget-s", "1"]) == 2
    assert "no calibration prompts" in capsys.readouterr().err
    assert main(["tune", str(bundle_copy), "--budget-s", "0"]) == 2
    assert "--budget-s 0" in capsys.readouterr().err


def write_tuned_json(bundle_dir, gen, **changes):
    data = synthetic_tuned(gen, verify_len=3, acceptance=0.5).to_json()
    data.update(changes)
    (bundle_dir / "tuned.json").write_text(json.dumps(data) if isinstance(data, dict) else data)
    return data


@pytest.mark.parametrize(
    "change, message",
    [
        ({"verify_len": 8}, r"verify_len 8 is outside 0\.\.7"),
        ({"verify_len": "3"}, r"verify_len '3' is outside"),
        ({"decode_ms": -1.0}, r"decode_ms -1.0 .* positive finite"),
        ({"draft_ms": float("nan")}, r"positive finite"),
        ({"acceptance": [1.5] * 7}, r"acceptance must list 7 shares in \[0, 1\]"),
        ({"acceptance": [0.5] * 3}, r"acceptance must list 7 shares"),
        ({"verify_ms": {"9": 1.0}}, r"verify_ms needs positive times keyed by k in 1\.\.7"),
        ({"verify_ms": {"x": 1.0}}, r"malformed field"),
        ({"format": "something-else"}, r"not a version-1 'dflash-edge-tuned' file"),
        (
            {"manifest_sha256": "0" * 64},
            r"measured on another bundle or on this bundle before it changed",
        ),
    ],
)
def test_bad_tuned_file_is_named(bundle_copy, tiny_bundle, change, message):
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.tuning import TunedFileError

    write_tuned_json(bundle_copy, tiny_bundle("qwen3", 8).generator, **change)
    with pytest.raises(TunedFileError, match=message) as err:
        Generator.load(bundle_copy)
    assert "dflash-edge tune" in str(err.value)  # the fix


def test_tuned_file_from_another_or_a_changed_bundle(bundle_copy, tiny_bundle, tmp_path, capsys):
    from dflash_edge.cli import main
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import write_manifest
    from dflash_edge.runtime.tuning import TunedFileError

    other = tiny_bundle("llama", 8).generator  # same block size, other bundle
    write_tuned_json(bundle_copy, other)
    with pytest.raises(TunedFileError, match="another bundle"):
        Generator.load(bundle_copy)
    write_tuned_json(bundle_copy, tiny_bundle("qwen3", 8).generator)
    assert Generator.load(bundle_copy).tuned.verify_len == 3  # the right bundle: accepted
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["max_context"] = 64  # the bundle changed since
    write_manifest(bundle_copy, manifest)  # (re-checksummed: a legitimate change)
    assert main(["run", str(bundle_copy), "--prompt", "t5"]) == 2
    assert "before it changed" in capsys.readouterr().err
    (bundle_copy / "tuned.json").write_text("{not json")
    with pytest.raises(TunedFileError, match="unreadable"):
        Generator.load(bundle_copy)


# ---- bench arms and the shipped quoting prompts
# --------------------------------------------------------------
def test_bench_reports_arms_per_category(tiny_bundle, tmp_path, capsys):
    from dflash_edge.cli import main

    prompts = tmp_path / "p.jsonl"
    rows = [
        {
            "id": f"a{i}",
            "category": "rep" if i % 2 else "plain",
            "prompt": " ".join(f"t{5 + (i + j) % 4}" for j in range(12)),
        }
        for i in range(4)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "bench.json"

    def bench(*flags) -> int:
        return main(["bench", str(tiny_bundle("qwen3", 8).path), "--prompts", str(prompts), *flags])

    assert bench("--max-new-tokens", "24", "--json", str(out)) == 0
    report = json.loads(out.read_text())
    assert report["lossless"] and report["arms"] == ["plain", "always", "default"]
    assert set(report["by_category"]) == {"rep", "plain"}
    for cat in report["by_category"].values():
        assert cat["prompts"] == 2 and cat["lossless"]
        for key in (
            "plain_tokens_per_s",
            "always_tokens_per_s",
            "default_tokens_per_s",
            "speedup",
            "always_speedup",
            "drafter_steps",
            "lookup_steps",
            "plain_steps",
            "verify_len_mean",
        ):
            assert key in cat, key
        assert cat["steps"] == cat["drafter_steps"] + cat["lookup_steps"] + cat["plain_steps"] > 0
    for row in report["rows"]:
        assert row["speedup"] == row["default_speedup"] and row["always_tokens_per_s"] > 0
    capsys.readouterr()
    assert bench("--repeats", "0") == 2
    assert "--repeats 0" in capsys.readouterr().err


def test_shipped_quoting_prompts():
    from dflash_edge.data import read_prompts as load_prompts

    rows = load_prompts("quote")
    assert (
        len(rows) >= 8
        and len({r["category"] for r in rows}) >= 4
        and len({r["id"] for r in rows}) == len(rows)
    )
    for r in rows:  # each quotes a block of input for the answer to reuse
        quoted = r["prompt"].split("\n", 1)[1]
        assert len(quoted.split()) >= 8, r["id"]
