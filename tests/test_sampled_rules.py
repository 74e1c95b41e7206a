"""The two rules that verify sampled DFlash2 drafts (runtime/lattice.py RULES): both keep the
target's distribution, two wrong rules do not (tier 1, numpy only: a toy Markov target and a toy
lattice whose q differs from p and misses part of p's support)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from dflash_edge.runtime.lattice import RULES, Rule, accept_sampled, sampled_walk
from dflash_edge.runtime.sampling import SamplingParams, draw, token_probs, uniform

V, KC, R, LAST, FIRST = 8, 4, 3, 2, 10  # vocab, candidates, drafts per step, prompt end, position
SEEDS = 3000
TV_BOUND = 0.09  # 64 cells, 3000 draws: sampling noise alone gives ~0.05


def _toy():
    """Target logits [V, V] (row: the previous token) and per previous token a lattice: candidates
    [R, Kc] and scores [R, Kc, Kc] (row r's q depends on the candidate taken at r-1)."""
    rng = np.random.default_rng(7)
    target = rng.normal(size=(V, V)) * 1.5  # [V prev, V next]
    cand = np.stack([np.stack([rng.permutation(V)[:KC] for _ in range(R)]) for _ in range(V)])
    scores = rng.normal(size=(V, R, KC, KC)) * 2.0  # [V prev, R, Kc, Kc]
    return target, cand, scores


TARGET, CAND, SCORES = _toy()
PARAMS = SamplingParams(temperature=1.0)


def _p(prev: int) -> np.ndarray:
    return token_probs(TARGET[prev], PARAMS)  # [V]


def _first_two(rule: Rule, seed: int) -> tuple[tuple[int, int], int]:
    """The first two tokens decoded after LAST (verify steps of R sampled drafts under `rule`),
    and how many drafts the first step accepted."""
    params, out, last, pos, first_accepted = SamplingParams(1.0, seed=seed), [], LAST, FIRST, None
    while len(out) < 2:
        drafts, qs = sampled_walk(CAND[last], SCORES[last], params, pos, rule.walk_stream)
        block = [last, *drafts.tolist()]

        def probs(i, block=block):
            return _p(block[i])

        accepted, token = accept_sampled(rule, probs, drafts, (CAND[last], qs), params, pos)
        first_accepted = accepted if first_accepted is None else first_accepted
        out += block[1 : 1 + accepted] + [token]
        last, pos = out[-1], pos + accepted + 1
    return (out[0], out[1]), first_accepted


def _fit(rule: Rule) -> tuple[float, float, float]:
    """(chi-square p-value, total variation, first-draft acceptance rate) of the first two tokens
    over SEEDS seeds against the exact joint p(t1 | LAST) p(t2 | t1)."""
    joint = _p(LAST)[:, None] * np.stack([_p(t) for t in range(V)])  # [V t1, V t2]
    counts, accepted = np.zeros((V, V)), 0
    for seed in range(SEEDS):
        (t1, t2), a = _first_two(rule, seed)
        counts[t1, t2] += 1
        accepted += a > 0
    keep = joint.ravel() > 0
    observed, expected = counts.ravel()[keep], joint.ravel()[keep] * SEEDS
    assert counts.ravel()[~keep].sum() == 0  # nothing outside the target's support
    tv = 0.5 * np.abs(observed - expected).sum() / SEEDS
    return chisquare(observed, expected).pvalue, tv, accepted / SEEDS


def _always_accept(p, draft, dist, params, position):
    return draft


def _redraw_from_p(p, draft, dist, params, position):
    """min(1, p/q) acceptance, but a rejected draft is replaced by a draw from p, not the
    residual."""
    cand, q_row = dist
    q = np.zeros_like(p)
    q[cand] = q_row
    if uniform(params.seed, position, 2) * q[draft] < p[draft]:
        return draft
    return draw(p, uniform(params.seed, position))


@pytest.mark.parametrize("name", sorted(RULES))
def test_both_rules_keep_the_targets_distribution(name):
    pvalue, tv, _ = _fit(RULES[name])
    assert pvalue > 1e-3 and tv < TV_BOUND


@pytest.mark.parametrize("wrong", [_always_accept, _redraw_from_p])
def test_a_wrong_rule_fails_the_distribution_check(wrong):
    """The check above catches a rule that is not lossless (so it can fail)."""
    pvalue, tv, _ = _fit(Rule(1, wrong))
    assert pvalue < 1e-6 and tv >= TV_BOUND


def test_rejection_accepts_sum_min_p_q_and_the_coupling_no_more():
    """First draft's acceptance: the rejection rule's is sum_x min(p(x), q(x)), the most any rule
    keeping p can reach; the coupling's is not above it."""
    q = np.zeros(V)
    q[CAND[LAST, 0]] = np.exp(SCORES[LAST, 0, 0]) / np.exp(SCORES[LAST, 0, 0]).sum()
    best = np.minimum(_p(LAST), q).sum()
    sigma = np.sqrt(best * (1 - best) / SEEDS)
    rejection, coupling = (_fit(RULES[n])[2] for n in ("rejection", "coupling"))
    assert abs(rejection - best) < 4 * sigma
    assert coupling < best + 4 * sigma


def test_a_deterministic_draft_is_verified_by_the_coupling_under_either_rule():
    """No q (a greedy drafter's or lookup's draft): both rules place the target's own draw, so a
    seed gives plain sampling's tokens."""
    p = _p(LAST)
    for seed in range(50):
        params = SamplingParams(1.0, seed=seed)
        want = draw(p, uniform(seed, FIRST))
        for rule in RULES.values():
            got = accept_sampled(rule, lambda i: p, np.array([3]), None, params, FIRST)
            assert got == ((1, draw(p, uniform(seed, FIRST + 1))) if want == 3 else (0, want))
