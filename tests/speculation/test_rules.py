"""The speculative core is exact: every verification rule outputs tokens distributed as the target's p.

Three kinds of proof:
* analytic: the one-step (and, for k=2, the two-token) output distribution of each rule, computed by
  enumerating every draft path with the module's own pieces, equals the target's distribution to 1e-6; block
  verification's whole round (every draft block, every stopping point, every correction) likewise, for k = 1..3;
* Monte Carlo through the real ``verify_*`` functions, and end to end through ``InProcessSpeculator`` on a
  tiny model pair, judged by chi-square goodness of fit;
* property-based (hypothesis) invariants of the rules, and worked examples of the sampling transforms.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from specbuild.speculation.rules import (
    GREEDY,
    SamplingParams,
    acceptance_probability,
    block_stop_probabilities,
    block_weights,
    expected_accepted,
    explicit_sampling,
    make_generator,
    probabilities,
    residual_distribution,
    round_seed,
    sample,
    verify,
    verify_block,
    verify_greedy,
    verify_rejection,
    verify_token_match,
)

DETERMINISTIC = settings(derandomize=True, deadline=None, max_examples=150)
# Chi-square tests reject a correct sampler with probability ALPHA each (false-positive rate); with fixed
# seeds every run is the same draw, so a failure means a real discrepancy or, at most 1e-3 a priori, bad luck.
ALPHA = 1e-3


def dist(*weights: float) -> torch.Tensor:
    t = torch.tensor(weights, dtype=torch.float64)
    return t / t.sum()


def random_dist(vocab: int, generator: torch.Generator, params: SamplingParams = SamplingParams()) -> torch.Tensor:
    return probabilities(3.0 * torch.randn(vocab, generator=generator, dtype=torch.float64), params)


# -- the analytic output distributions, built from the module's pieces -----------------------------------
def rejection_step(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Distribution of the first output token of a rejection round: sum over every draft token x ~ q."""
    out = torch.zeros_like(p)
    residual = residual_distribution(p, q)
    for x in range(len(q)):
        if q[x] == 0:
            continue  # the draft never proposes x
        accept = acceptance_probability(p, q, x)
        out[x] += q[x] * accept
        out += q[x] * (1.0 - accept) * residual
    return out


def token_match_step(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """First output token of a token-matching round: the target's own sample y ~ p, whatever x ~ q was."""
    out = torch.zeros_like(p)
    for x, y in itertools.product(range(len(q)), range(len(p))):
        out[y] += q[x] * p[y]  # y == x: x accepted; y != x: y emitted at the mismatch
    return out


def two_token_joint(rule: str, p1, p2, q1, q2) -> torch.Tensor:
    """Joint distribution of the first two output tokens with k=2, enumerating every draft path (d1, d2).

    ``p2[a]``/``q2[a]`` are the target's/draft's distributions after token ``a``. A rejection at the first
    position emits one token, and the second comes from the next round (drafting from ``q2[y]``).
    """
    vocab = len(p1)
    step = rejection_step if rule == "rejection" else token_match_step
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    next_round = torch.stack([step(p2[a], q2[a]) for a in range(vocab)])
    for d1, d2 in itertools.product(range(vocab), repeat=2):
        weight = q1[d1] * q2[d1][d2]
        if weight == 0:
            continue
        if rule == "rejection":
            accept1 = acceptance_probability(p1, q1, d1)
            first_if_rejected = residual_distribution(p1, q1)
            accept2 = acceptance_probability(p2[d1], q2[d1], d2)
            second_if_rejected = residual_distribution(p2[d1], q2[d1])
            joint += weight * (1 - accept1) * first_if_rejected[:, None] * next_round
            joint[d1, d2] += weight * accept1 * accept2
            joint[d1] += weight * accept1 * (1 - accept2) * second_if_rejected
        else:
            for y1 in range(vocab):
                if y1 != d1:
                    joint[y1] += weight * p1[y1] * next_round[y1]
            # the target drew d1 (accepted) then samples its own second token, equal to d2 or not
            joint[d1] += weight * p1[d1] * p2[d1]
    return joint


def edge_case_pairs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    p, q = random_dist(8, g), random_dist(8, g)
    q_blind = q.clone()
    q_blind[p.argsort(descending=True)[:3]] = 0.0  # the draft cannot propose the target's 3 likeliest tokens
    logits_p, logits_q = 2 * torch.randn(8, generator=g), 2 * torch.randn(8, generator=g)
    return {
        "random": (p, q),
        "q zero where p allows": (p, q_blind / q_blind.sum()),
        "p equals q": (p, p.clone()),
        "one-hot p": (dist(0, 0, 1, 0, 0, 0, 0, 0), q),
        "one-hot q": (p, dist(0, 0, 0, 0, 0, 1, 0, 0)),
        "one-hot p and q disagree": (dist(1, 0, 0, 0), dist(0, 0, 0, 1)),
        "disjoint supports": (dist(1, 2, 0, 0), dist(0, 0, 3, 1)),
        "top-k truncated": tuple(probabilities(t, SamplingParams(top_k=3)) for t in (logits_p, logits_q)),
        "top-p truncated": tuple(probabilities(t, SamplingParams(top_p=0.6)) for t in (logits_p, logits_q)),
        "temperature 0.5": tuple(probabilities(t, SamplingParams(temperature=0.5)) for t in (logits_p, logits_q)),
        "temperature 3, top-k 5, top-p 0.9": tuple(
            probabilities(t, SamplingParams(temperature=3.0, top_k=5, top_p=0.9)) for t in (logits_p, logits_q)
        ),
        "greedy target (one-hot by argmax)": (probabilities(logits_p, GREEDY), q),
    }


EDGE_CASES = edge_case_pairs()


@pytest.mark.parametrize("case", list(EDGE_CASES))
@pytest.mark.parametrize("step", [rejection_step, token_match_step], ids=["rejection", "token-match"])
def test_one_step_output_distribution_is_exactly_p(case, step):
    p, q = EDGE_CASES[case]
    torch.testing.assert_close(step(p, q), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", ["random", "one-hot p", "top-k truncated", "greedy target (one-hot by argmax)"])
@pytest.mark.parametrize("token", [0, 2, 5])
def test_a_deterministic_draft_verified_by_token_matching_is_rejection_sampling(case, token):
    """Prompt lookup proposes a fixed token x (q is a point mass) and is verified by token matching, with no
    draft logits: emitted tokens and acceptance are distributed exactly as rejection sampling with that q."""
    p, _ = EDGE_CASES[case]
    point_mass = torch.zeros_like(p)
    point_mass[token] = 1.0
    rejection = torch.zeros_like(p)  # rejection sampling when x is drafted: x w.p. min(1, p(x)), else the residual
    rejection[token] += acceptance_probability(p, point_mass, token)
    rejection += (1.0 - acceptance_probability(p, point_mass, token)) * residual_distribution(p, point_mass)
    matching = p.clone()  # token matching: the target's own y ~ p; y == x is the acceptance
    torch.testing.assert_close(matching, rejection, atol=1e-12, rtol=0)
    assert acceptance_probability(p, point_mass, token) == pytest.approx(float(p[token]))


def test_analysis_detects_a_wrong_rule():
    """The enumeration is a real check: emitting the drafted token unconditionally gives q, not p."""
    p, q = EDGE_CASES["random"]
    assert (rejection_step(p, q) - p).abs().max() < 1e-6
    assert (q - p).abs().max() > 1e-2


@pytest.mark.parametrize("rule", ["rejection", "token-match"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=4, top_p=0.8)], ids=["plain", "truncated"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_token_joint_for_k2_is_exactly_the_targets(rule, params, seed):
    vocab = 6
    g = torch.Generator().manual_seed(seed)
    p1, q1 = random_dist(vocab, g, params), random_dist(vocab, g, params)
    p2 = torch.stack([random_dist(vocab, g, params) for _ in range(vocab)])
    q2 = torch.stack([random_dist(vocab, g, params) for _ in range(vocab)])
    q2[0] = p2[0]  # one context where draft and target agree exactly
    blind = q1.clone()
    blind[p1.argmax()] = 0.0  # the draft cannot propose the target's likeliest first token
    if blind.sum() > 0:
        q1 = blind / blind.sum()
    torch.testing.assert_close(two_token_joint(rule, p1, p2, q1, q2), p1[:, None] * p2, atol=1e-6, rtol=0)


# -- block verification: the whole round, enumerated ----------------------------------------------------
Tables = dict[tuple[int, ...], torch.Tensor]


def prefix_tables(vocab: int, k: int, seed: int, params: SamplingParams) -> tuple[Tables, Tables]:
    """Target ``p[prefix]`` for every prefix of up to k tokens and draft ``q[prefix]`` up to k - 1, each context
    its own distribution; the draft is blind to the target's likeliest first token and agrees with the target
    exactly after the prefix ``(0,)``."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [prefix for n in range(k + 1) for prefix in itertools.product(range(vocab), repeat=n)]
    p = {prefix: random_dist(vocab, g, params) for prefix in prefixes}
    q = {prefix: random_dist(vocab, g, params) for prefix in prefixes if len(prefix) < k}
    blind = q[()].clone()
    blind[p[()].argmax()] = 0.0
    if blind.sum() > 0:
        q[()] = blind / blind.sum()
    if (0,) in q:
        q[(0,)] = p[(0,)].clone()
    return p, q


def block_round(p: Tables, q: Tables, k: int, stops=block_stop_probabilities) -> tuple[dict, float]:
    """One round of block verification, exactly: the distribution of what it emits (accepted prefix plus the
    correction, a tuple of 1..k+1 tokens) over every draft block x ~ q and stopping point tau, and the expected
    accepted length. ``stops`` computes h_1..h_k from the weights (swapped out to show the check has power)."""
    vocab = len(p[()])
    emitted: dict[tuple[int, ...], float] = defaultdict(float)
    expected_accepted = 0.0
    for drafts in itertools.product(range(vocab), repeat=k):
        chance = math.prod(float(q[drafts[:i]][token]) for i, token in enumerate(drafts))
        if chance == 0.0:
            continue
        q_rows = torch.stack([q[drafts[:i]] for i in range(k)])
        p_rows = torch.stack([p[drafts[:i]] for i in range(k + 1)])
        weights = block_weights(list(drafts), q_rows, p_rows)
        h = stops(weights, q_rows, p_rows)
        for tau in range(k + 1):  # tau: the largest i with eta_i < h_i, 0 if none
            stopped = (h[tau - 1] if tau else 1.0) * math.prod(1.0 - h[j] for j in range(tau, k))
            correction = p_rows[k] if tau == k else residual_distribution(p_rows[tau], q_rows[tau], weights[tau])
            expected_accepted += chance * stopped * tau
            for token, chance_of_token in enumerate(correction.tolist()):
                emitted[drafts[:tau] + (token,)] += chance * stopped * chance_of_token
    return emitted, expected_accepted


def continued_by_target(emitted: dict, p: Tables, length: int) -> dict[tuple[int, ...], float]:
    """The distribution of ``length`` tokens when the target samples what follows each emitted block."""
    vocab = len(p[()])
    joint = {}
    for sequence in itertools.product(range(vocab), repeat=length):
        joint[sequence] = sum(chance * math.prod(float(p[sequence[:j]][sequence[j]]) for j in range(n, length))
                              for n in range(1, length + 1) if (chance := emitted.get(sequence[:n], 0.0)))
    return joint


def target_joint(p: Tables, length: int) -> dict[tuple[int, ...], float]:
    vocab = len(p[()])
    return {sequence: math.prod(float(p[sequence[:j]][sequence[j]]) for j in range(length))
            for sequence in itertools.product(range(vocab), repeat=length)}


def expected_accepted_over_drafts(p: Tables, q: Tables, k: int, mode: str) -> float:
    """A rule's expected accepted length (:func:`expected_accepted`, per drafted block) over every block x ~ q."""
    vocab = len(p[()])
    total = 0.0
    for drafts in itertools.product(range(vocab), repeat=k):
        chance = math.prod(float(q[drafts[:i]][token]) for i, token in enumerate(drafts))
        if chance:
            total += chance * expected_accepted(list(drafts), torch.stack([q[drafts[:i]] for i in range(k)]),
                                                torch.stack([p[drafts[:i]] for i in range(k + 1)]), mode)
    return total


BLOCK_CASES = [pytest.param(vocab, k, params, seed, id=f"V{vocab}-K{k}-{name}-{seed}")
               for vocab, k in ((3, 1), (3, 2), (3, 3), (4, 2), (4, 3))
               for name, params in (("plain", SamplingParams()), ("sharp", SamplingParams(temperature=0.5)),
                                    ("top-p", SamplingParams(temperature=0.7, top_p=0.9)))
               for seed in (0, 1)]


@pytest.mark.parametrize(("vocab", "k", "params", "seed"), BLOCK_CASES)
def test_block_verification_emits_exactly_the_targets_joint_distribution(vocab, k, params, seed):
    """Every draft block, stopping point and correction enumerated: the emitted block, continued by the target,
    is distributed over all k + 1 positions exactly as the target's own k + 1 tokens; and block verification
    accepts at least as many tokens in expectation as token-by-token rejection on the same p and q (the same for
    k = 1, where the two rules are one)."""
    p, q = prefix_tables(vocab, k, seed, params)
    emitted, block_accepted = block_round(p, q, k)
    assert sum(emitted.values()) == pytest.approx(1.0, abs=1e-12)
    got, want = continued_by_target(emitted, p, k + 1), target_joint(p, k + 1)
    assert max(abs(got[sequence] - want[sequence]) for sequence in want) < 1e-12
    token_accepted = expected_accepted_over_drafts(p, q, k, "token")
    assert block_accepted >= token_accepted - 1e-12
    assert expected_accepted_over_drafts(p, q, k, "block") == pytest.approx(block_accepted, abs=1e-12)
    if k == 1:
        assert block_accepted == pytest.approx(token_accepted, abs=1e-12)


def test_block_verification_accepts_more_than_token_rejection_in_a_worked_case():
    """The draft always proposes token 0 first (the target: 1/2), then 1 or 2 evenly where the target is sure of 1.
    Token by token accepts x_1 with 1/2, then x_2 = 1 surely and x_2 = 2 never: 1/2 + 1/4 = 3/4 tokens. The block
    (0, 1) is drafted with chance 1/2, the target's own chance of it, so block verification accepts it whenever it
    is drafted (w_2 = min(1, 1/2 * 1 / (1/2)) = 1) and (0, 2) never: 1 token."""
    p = {(): dist(1, 1, 0), (0,): dist(0, 1, 0), (1,): dist(1, 1, 1), (2,): dist(1, 1, 1)}
    p |= {prefix: dist(1, 1, 1) for prefix in itertools.product(range(3), repeat=2)}
    q = {(): dist(1, 0, 0), (0,): dist(0, 1, 1), (1,): dist(1, 1, 1), (2,): dist(1, 1, 1)}
    emitted, block_accepted = block_round(p, q, 2)
    got, want = continued_by_target(emitted, p, 3), target_joint(p, 3)
    assert max(abs(got[sequence] - want[sequence]) for sequence in want) < 1e-12
    assert expected_accepted_over_drafts(p, q, 2, "token") == pytest.approx(0.5 * (1 + 0.5))
    assert block_accepted == pytest.approx(1.0, abs=1e-12)


def test_block_enumeration_detects_a_wrong_stop_rule():
    """The enumeration is a real check: stopping where each weight says (h_i = w_i, a plausible mistake) skews
    the emitted distribution."""
    p, q = prefix_tables(3, 2, 0, SamplingParams())
    emitted, _ = block_round(p, q, 2, stops=lambda weights, q_rows, p_rows: weights[1:])
    got, want = continued_by_target(emitted, p, 3), target_joint(p, 3)
    assert max(abs(got[sequence] - want[sequence]) for sequence in want) > 1e-3


def sub_vocabulary_dist(ids: list[int], vocab: int, generator: torch.Generator, params: SamplingParams) -> torch.Tensor:
    """A sub-vocabulary draft's distribution as the engine makes it: its head's logits over ``ids`` scattered back
    to the whole vocabulary (-inf elsewhere), then the sampler's transforms."""
    from specbuild.runtimes.torch.engine import scatter_logits

    head = 3.0 * torch.randn(1, len(ids), generator=generator, dtype=torch.float64)
    return probabilities(scatter_logits(head, torch.tensor(ids), vocab)[0], params)


@pytest.mark.parametrize("rule", ["rejection", "token-match"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=4, top_p=0.8)],
                         ids=["plain", "truncated"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_sub_vocabulary_draft_keeps_the_targets_distribution(rule, params, seed):
    """A draft whose head covers 4 of 6 ids (the target's likeliest first token outside them in one case): its
    distribution is zero outside its ids, and both rules still emit exactly the target's p, one token and two."""
    vocab, ids = 6, [4, 1, 3, 0]
    g = torch.Generator().manual_seed(seed)
    p1 = random_dist(vocab, g, params)
    p2 = torch.stack([random_dist(vocab, g, params) for _ in range(vocab)])
    if seed == 0:  # the target's likeliest token is one the draft can never propose
        ids = [token for token in range(vocab) if token != int(p1.argmax())][:4]
    q1 = sub_vocabulary_dist(ids, vocab, g, params)
    q2 = torch.stack([sub_vocabulary_dist(ids, vocab, g, params) for _ in range(vocab)])
    outside = [token for token in range(vocab) if token not in ids]
    assert q1[outside].abs().max() == 0 and q2[:, outside].abs().max() == 0
    step = rejection_step if rule == "rejection" else token_match_step
    torch.testing.assert_close(step(p1, q1), p1, atol=1e-6, rtol=0)
    torch.testing.assert_close(two_token_joint(rule, p1, p2, q1, q2), p1[:, None] * p2, atol=1e-6, rtol=0)


# -- worked examples -------------------------------------------------------------------------------------
LOG_1234 = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))


@pytest.mark.parametrize(
    ("logits", "params", "expected"),
    [
        (LOG_1234, SamplingParams(), [0.1, 0.2, 0.3, 0.4]),
        (2 * LOG_1234, SamplingParams(temperature=2.0), [0.1, 0.2, 0.3, 0.4]),
        (LOG_1234, SamplingParams(temperature=0.5), [1 / 30, 4 / 30, 9 / 30, 16 / 30]),
        (LOG_1234, SamplingParams(top_k=2), [0, 0, 3 / 7, 4 / 7]),
        (LOG_1234, SamplingParams(top_k=4), [0.1, 0.2, 0.3, 0.4]),
        (LOG_1234, SamplingParams(top_k=9), [0.1, 0.2, 0.3, 0.4]),
        (LOG_1234, SamplingParams(top_p=0.65), [0, 0, 3 / 7, 4 / 7]),  # 0.4 < 0.65, 0.4 + 0.3 >= 0.65
        (LOG_1234, SamplingParams(top_p=0.75), [0, 2 / 9, 3 / 9, 4 / 9]),
        (LOG_1234, SamplingParams(top_p=0.35), [0, 0, 0, 1]),  # the likeliest token is always kept
        (LOG_1234, SamplingParams(top_k=3, top_p=0.5), [0, 0, 3 / 7, 4 / 7]),  # top-k first: [2,3,4]/9
        (LOG_1234, SamplingParams(temperature=0.0), [0, 0, 0, 1]),
        (LOG_1234, SamplingParams(temperature=5.0, top_k=1), [0, 0, 0, 1]),
        (torch.tensor([3.0, 1.0, 3.0]), GREEDY, [1, 0, 0]),  # ties go to the lowest id
    ],
)
def test_probabilities_worked_examples(logits, params, expected):
    got = probabilities(logits, params)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def test_probabilities_works_row_by_row_on_batches():
    logits = torch.stack([LOG_1234, LOG_1234.flip(0)])
    got = probabilities(logits, SamplingParams(top_k=2))
    torch.testing.assert_close(got[0], torch.tensor([0, 0, 3 / 7, 4 / 7], dtype=torch.float64))
    torch.testing.assert_close(got[1], torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64))


def test_greedy_worked_examples():
    # argmax per position: 2, 0, 1, 3
    logits = torch.tensor([[0, 1, 5, 0], [9, 1, 1, 1], [0, 4, 0, 0], [0, 0, 0, 2.0]])
    assert verify_greedy([2, 0, 1], logits).tokens == [2, 0, 1, 3]  # all accepted + bonus
    assert verify_greedy([2, 0, 1], logits).accepted == 3
    assert verify_greedy([2, 3, 1], logits).tokens == [2, 0]  # mismatch at position 1: target's 0
    assert verify_greedy([1, 0, 1], logits).tokens == [2]
    assert verify_greedy([], logits[:1]).tokens == [2]


def test_rejection_worked_examples():
    g = make_generator(0)
    p, q = dist(1, 1, 2), dist(1, 1, 2)
    # p == q: always accepted; the bonus comes from the last row
    out = verify_rejection([2, 0], torch.stack([q, q]), torch.stack([p, p, dist(0, 0, 1)]), g)
    assert out.tokens == [2, 0, 2] and out.accepted == 2
    # a token the target forbids is always rejected and replaced from the residual p - q
    out = verify_rejection([0], dist(1, 1, 0)[None], torch.stack([dist(0, 1, 1), p]), g)
    assert out.accepted == 0 and out.tokens in ([1], [2])
    assert verify_rejection([0], dist(1, 0, 0)[None], torch.stack([dist(0, 0, 1), p]), g).tokens == [2]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, GREEDY),
        ({"temperature": 0.7}, SamplingParams(temperature=0.7, top_k=1)),  # top_k = top_p = 0: greedy, any temperature
        ({"top_k": 0, "top_p": 0.0, "temperature": 2.0}, SamplingParams(temperature=2.0, top_k=1)),
        ({"top_k": 1, "top_p": -1.0}, GREEDY),  # top_p <= 0 is unset
        ({"temperature": 0.0, "top_p": 0.9}, SamplingParams(temperature=0.0, top_p=0.9)),  # greedy by temperature
        ({"top_k": 5}, SamplingParams(temperature=1.0, top_k=5, top_p=1.0)),  # top-k alone: no nucleus limit
        ({"top_p": 0.9, "temperature": None}, SamplingParams(temperature=1.0, top_p=0.9)),
        ({"temperature": 1.5, "top_k": 3, "top_p": 0.5}, SamplingParams(1.5, 3, 0.5)),
        ({"repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.25},
         SamplingParams(top_k=1, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=-0.25)),
    ],
)
def test_sampling_params_follow_the_backend_s_rule(given, expected):
    """TensorRT-LLM: top_k == 0 and top_p == 0 (or absent) mean greedy whatever the temperature (samplingTopK
    Kernels.h regularizeTopKTopP); a top_p of 0 or less is unset (the backend's utils.cc)."""
    got = SamplingParams.from_backend(**given)
    assert got == expected
    assert got.is_greedy == (expected.temperature == 0.0 or expected.top_k == 1)
    engine_inputs = {"runtime_top_k": "top_k", "runtime_top_p": "top_p"}
    sent = {engine_inputs.get(name, name): value for name, value in got.backend_values().items()}
    # the engine's inputs say the same (greedy as top_k 1)
    assert SamplingParams.from_backend(**sent) == (replace(got, top_k=1, top_p=1.0) if got.is_greedy else got)


def test_explicit_sampling_makes_a_temperature_alone_sample():
    assert explicit_sampling(0.8) == {"temperature": 0.8, "top_k": None, "top_p": 1.0}
    assert not SamplingParams.from_backend(**explicit_sampling(0.8)).is_greedy
    assert SamplingParams.from_backend(**explicit_sampling(0.0)).is_greedy
    assert SamplingParams.from_backend(**explicit_sampling(None)).is_greedy
    assert explicit_sampling(0.8, top_k=5) == {"temperature": 0.8, "top_k": 5, "top_p": None}


def test_sampling_params_greedy_flags():
    assert GREEDY.is_greedy and SamplingParams(top_k=1).is_greedy and SamplingParams(temperature=0).is_greedy
    assert not SamplingParams().is_greedy and not SamplingParams(temperature=0.01, top_k=2).is_greedy


@pytest.mark.parametrize("bad", [{"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": float("inf")},
                                 {"top_k": -1}, {"top_p": 1.5}, {"top_p": -0.1}, {"repetition_penalty": 0.0},
                                 {"repetition_penalty": float("inf")}, {"presence_penalty": float("nan")},
                                 {"frequency_penalty": float("-inf")}])
def test_sampling_params_reject_bad_values(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_shape_errors():
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=r"\[k\+1, vocab\]"):
        verify_greedy([1, 2], logits)  # needs 3 rows
    with pytest.raises(ValueError, match=r"\[k\+1, vocab\]"):
        verify_token_match([1], torch.zeros(5), None)
    with pytest.raises(ValueError, match="draft probabilities"):
        verify_rejection([1], torch.full((2, 5), 0.2), torch.full((2, 5), 0.2), None)
    with pytest.raises(ValueError, match="draft probabilities"):
        verify_rejection([1], torch.full((1, 4), 0.25), torch.full((2, 5), 0.2), None)
    with pytest.raises(ValueError, match="draft probabilities"):
        verify_block([1, 2], torch.full((1, 5), 0.2), torch.full((3, 5), 0.2), None)


def test_seeds_are_reproducible_and_rounds_independent():
    assert round_seed(None, 3, 1) is None
    seeds = {round_seed(42, r, role) for r in range(50) for role in (0, 1)}
    assert len(seeds) == 100 and all(0 <= s < 2**63 for s in seeds)
    assert round_seed(42, 5, 0) == round_seed(42, 5, 0) != round_seed(43, 5, 0)
    p = dist(1, 2, 3, 4, 5)
    draws = [[sample(p, g) for _ in range(20)] for g in (make_generator(9), make_generator(9))]
    assert draws[0] == draws[1]


# -- property-based invariants ---------------------------------------------------------------------------
@st.composite
def rounds(draw):
    """A verification round: k draft tokens, draft probs [k, V] (zeros allowed) and target probs [k+1, V]."""
    vocab = draw(st.integers(2, 7))
    k = draw(st.integers(0, 5))
    weight = st.one_of(st.just(0.0), st.floats(0.0, 1.0, allow_nan=False))
    def row():
        w = draw(st.lists(weight, min_size=vocab, max_size=vocab).filter(lambda w: sum(w) > 1e-3))
        return dist(*w)
    q = torch.stack([row() for _ in range(k)]) if k else torch.zeros(0, vocab, dtype=torch.float64)
    p = torch.stack([row() for _ in range(k + 1)])
    # drafts come from q (as they would), with a chance of an arbitrary token the draft could not propose
    drafts = [draw(st.sampled_from([t for t in range(vocab) if q[i, t] > 0] or [0])) for i in range(k)]
    if k and draw(st.booleans()):
        drafts[-1] = draw(st.integers(0, vocab - 1))
    return drafts, q, p, draw(st.integers(0, 2**32))


def check_common_invariants(drafts, out, target_probs):
    assert 0 <= out.accepted <= len(drafts)
    assert len(out.tokens) == out.accepted + 1
    assert out.tokens[: out.accepted] == drafts[: out.accepted]
    assert target_probs[out.accepted, out.tokens[-1]] > 0  # the emitted token is one the target allows


@DETERMINISTIC
@given(rounds())
def test_rejection_invariants(case):
    drafts, q, p, seed = case
    out = verify_rejection(drafts, q, p, make_generator(seed))
    check_common_invariants(drafts, out, p)
    for position in range(out.accepted):
        assert q[position, drafts[position]] > 0  # never accepts a token the draft could not propose
    if out.accepted < len(drafts):
        position = out.accepted
        assert acceptance_probability(p[position], q[position], drafts[position]) < 1.0  # sure accepts never fail
        if (p[position] > q[position]).any():
            assert p[position, out.tokens[-1]] > q[position, out.tokens[-1]]  # drawn from the residual's support


@DETERMINISTIC
@given(rounds())
def test_block_invariants(case):
    drafts, q, p, seed = case
    weights = block_weights(drafts, q, p)
    stops = block_stop_probabilities(weights, q, p)
    assert all(0.0 <= h <= 1.0 for h in stops)
    if len(drafts) == 1:  # one token: block verification is token-by-token rejection
        assert stops == [acceptance_probability(p[0], q[0], drafts[0])]
    out = verify_block(drafts, q, p, make_generator(seed))
    check_common_invariants(drafts, out, p)
    assert out == verify_block(drafts, q, p, make_generator(seed))  # a seed gives the same answer
    assert weights[out.accepted] > 0  # never accepts a prefix the target could not produce or the draft propose


@DETERMINISTIC
@given(rounds())
def test_token_match_invariants(case):
    drafts, _, p, seed = case
    out = verify_token_match(drafts, p, make_generator(seed))
    check_common_invariants(drafts, out, p)
    if out.accepted < len(drafts):
        assert out.tokens[-1] != drafts[out.accepted]


@DETERMINISTIC
@given(rounds())
def test_greedy_is_rejection_with_one_hot_target(case):
    drafts, q, p, seed = case
    assume(all(q[i, token] > 0 for i, token in enumerate(drafts)))  # drafts the draft could have proposed
    logits = torch.log(p)
    greedy = verify_greedy(drafts, logits)
    check_common_invariants(drafts, greedy, p)
    assert greedy.tokens == verify_rejection(drafts, q, probabilities(logits, GREEDY), make_generator(seed)).tokens
    assert greedy.tokens == verify_token_match(drafts, probabilities(logits, GREEDY), make_generator(seed)).tokens


@settings(DETERMINISTIC, max_examples=60)
@given(rounds(), st.sampled_from([SamplingParams(), SamplingParams(temperature=0.8, top_k=3, top_p=0.9), GREEDY]))
def test_verify_dispatches_by_request(case, params):
    drafts, q, p, seed = case
    target_logits, draft_logits = torch.log(p), torch.log(q.clamp_min(1e-30))
    for mode, rejection in (("token", verify_rejection), ("block", verify_block)):
        got = verify(drafts, target_logits, params, make_generator(seed), draft_logits, mode)
        if params.is_greedy:
            expected = verify_greedy(drafts, target_logits)
        elif drafts:
            expected = rejection(drafts, probabilities(draft_logits, params), probabilities(target_logits, params),
                                 make_generator(seed))
        else:
            expected = verify_token_match(drafts, probabilities(target_logits, params), make_generator(seed))
        assert got == expected
    assert verify(drafts, target_logits, params, make_generator(seed), draft_logits) == verify(
        drafts, target_logits, params, make_generator(seed), draft_logits, "token")  # token by token by default
    without_logits = verify(drafts, target_logits, params, make_generator(seed))
    if not params.is_greedy:
        assert without_logits == verify_token_match(drafts, probabilities(target_logits, params), make_generator(seed))


@DETERMINISTIC
@given(rounds())
def test_residual_and_acceptance_invariants(case):
    _, _, p_rows, _ = case
    p, q = p_rows[0], p_rows[-1]
    residual = residual_distribution(p, q)
    assert (residual >= 0).all() and abs(float(residual.sum()) - 1.0) < 1e-9
    if (p > q).any():
        assert (residual[p <= q] == 0).all()
    for token in range(len(p)):
        a = acceptance_probability(p, q, token)
        assert 0.0 <= a <= 1.0
        if q[token] == 0:
            assert a == 0.0
        elif p[token] >= q[token]:
            assert a == 1.0


@DETERMINISTIC
@given(
    st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=12),
    st.floats(0.2, 5.0),  # wider ranges underflow float64
    st.integers(0, 14),
    st.floats(0.0, 1.0),
)
def test_probabilities_invariants(logits, temperature, top_k, top_p):
    logits_t = torch.tensor(logits, dtype=torch.float64)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = probabilities(logits_t, params)
    assert (probs >= 0).all() and abs(float(probs.sum()) - 1.0) < 1e-9
    kept = probs > 0
    if params.is_greedy:
        assert int(kept.sum()) == 1 and probs[int(logits_t.argmax())] == 1.0
        return
    scaled = logits_t / temperature
    full = torch.softmax(scaled, dim=-1)
    # what is kept are the likeliest tokens: no dropped token is likelier than a kept one
    if (~kept).any():
        assert full[kept].min() >= full[~kept].max()
    if 0 < top_k < len(logits) and top_p in (0.0, 1.0):
        assert int(kept.sum()) >= top_k
        if int(kept.sum()) > top_k:  # only tokens tied with the k-th likeliest go beyond k (as HF's top-k does)
            assert int((scaled > scaled[kept].min()).sum()) < top_k
    if top_k == 0 and 0 < top_p < 1:
        assert float(full[kept].sum()) >= top_p - 1e-9  # the nucleus reaches top_p ...
        assert float(full[kept].sum() - full[kept].min()) < top_p + 1e-9  # ... and is the smallest that does


# -- Monte Carlo through the real functions --------------------------------------------------------------
def chi_square_pvalue(observed: Counter, expected: dict) -> float:
    """Goodness of fit of counted outcomes to exact probabilities; bins expecting < 5 draws are pooled."""
    total = sum(observed.values())
    assert set(observed) <= {k for k, v in expected.items() if v > 0}, "an outcome the target cannot produce"
    big = [k for k, v in expected.items() if v * total >= 5]
    small = [k for k, v in expected.items() if v * total < 5 and v > 0]
    f_obs = [observed[k] for k in big] + ([sum(observed[k] for k in small)] if small else [])
    f_exp = [expected[k] * total for k in big] + ([sum(expected[k] for k in small) * total] if small else [])
    scale = total / sum(f_exp)
    return float(chisquare(f_obs, [e * scale for e in f_exp]).pvalue)


def synthetic_tables(vocab: int, seed: int):
    """Context-dependent target/draft distributions for three positions: p[a][b] is p(. | a, b)."""
    g = torch.Generator().manual_seed(seed)
    def table(depth):
        return [[random_dist(vocab, g) for _ in range(vocab)] for _ in range(vocab)] if depth == 2 else \
               [random_dist(vocab, g) for _ in range(vocab)]
    p = (random_dist(vocab, g), table(1), table(2))
    q1 = random_dist(vocab, g)
    q1[p[0].argmax()] = 0.0  # the draft is blind to the target's likeliest first token
    q = (q1 / q1.sum(), table(1), table(2))
    return p, q


def lookup(tables, context):
    return tables[len(context)] if not context else (
        tables[1][context[0]] if len(context) == 1 else tables[2][context[0]][context[1]])


def speculate_two_tokens(rule: str, p, q, k: int, generator: torch.Generator) -> tuple[int, int]:
    """Rounds of draft-k-then-verify over the synthetic tables until two tokens are out."""
    out: list[int] = []
    while len(out) < 2:
        drafts, draft_rows = [], []
        for _ in range(k):
            row = lookup(q, out + drafts)
            draft_rows.append(row)
            drafts.append(sample(row, generator))
        target_rows = torch.stack([lookup(p, out + drafts[:i]) for i in range(k + 1)])
        if rule in ("rejection", "block"):
            rejection = verify_block if rule == "block" else verify_rejection
            verdict = rejection(drafts, torch.stack(draft_rows), target_rows, generator)
        else:
            verdict = verify_token_match(drafts, target_rows, generator)
        out.extend(verdict.tokens)
    return out[0], out[1]


@pytest.mark.parametrize("rule", ["rejection", "token-match", "block"])
@pytest.mark.parametrize("k", [1, 2])
def test_monte_carlo_two_tokens_match_target(rule, k):
    vocab, draws = 5, 6000
    p, q = synthetic_tables(vocab, seed=11)
    generator = make_generator(2024)
    counts = Counter(speculate_two_tokens(rule, p, q, k, generator) for _ in range(draws))
    exact = {(a, b): float(p[0][a] * p[1][a][b]) for a in range(vocab) for b in range(vocab)}
    assert chi_square_pvalue(counts, exact) > ALPHA


def test_monte_carlo_detects_a_biased_sampler():
    """Power check: the same test rejects drafts emitted without verification (distributed as q)."""
    vocab, draws = 5, 6000
    p, q = synthetic_tables(vocab, seed=11)
    generator = make_generator(2024)
    counts = Counter()
    for _ in range(draws):
        first = sample(q[0], generator)
        counts[(first, sample(q[1][first], generator))] += 1
    exact = {(a, b): float(p[0][a] * p[1][a][b]) for a in range(vocab) for b in range(vocab)}
    with pytest.raises(AssertionError):
        assert chi_square_pvalue(counts, exact) > ALPHA


# -- end to end on a tiny model pair ---------------------------------------------------------------------
def exact_continuations(model_dir: Path, prompt: list[int], length: int, params: SamplingParams) -> dict:
    """The target's exact distribution over every ``length``-token continuation, by batched enumeration."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    paths = {(): 1.0}
    with torch.inference_mode():
        for _ in range(length):
            prefixes = list(paths)
            ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])
            rows = probabilities(model(input_ids=ids).logits[:, -1].float(), params)
            paths = {prefix + (t,): paths[prefix] * float(rows[i, t])
                     for i, prefix in enumerate(prefixes) for t in range(vocab) if rows[i, t] > 0}
    return paths


END_TO_END_CASES = [pytest.param(k, logits, "draft", "token", id=f"{k}-{'draft-logits' if logits else 'token-match'}")
                    for k in (1, 3) for logits in (True, False)] + [
    pytest.param(3, True, "lookup+draft", "token", id="3-draft-logits-lookup+draft"),
    pytest.param(2, True, "lookup", "token", id="2-draft-logits-lookup-only"),
    pytest.param(3, True, "sub-vocabulary draft", "token", id="3-draft-logits-sub-vocabulary-head"),
    pytest.param(3, True, "draft", "block", id="3-draft-logits-block-verification"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("k", "use_draft_logits", "drafter", "verification"), END_TO_END_CASES)
def test_end_to_end_sampled_continuations_match_target(tiny, k, use_draft_logits, drafter, verification):
    """Sampled 4-token continuations from InProcessSpeculator: the first two tokens (jointly) and the fourth
    (marginally, reached through bonus tokens and later rounds) follow the target's exact distribution.
    With prompt lookup (on a prompt that repeats itself), lookup drafts are verified by token matching, mixed
    with draft-model rounds under rejection sampling, or alone. A draft with a sub-vocabulary head (10 of 16 ids)
    is accepted against its own distribution, zero outside its ids. Block verification likewise."""
    from specbuild.speculation.request import TokenRequest
    from specbuild.runtimes.torch.inprocess import InProcessSpeculator
    from specbuild.speculation.lookup import PromptLookup
    from specbuild.runtimes.torch.engine import TorchEngine

    params = SamplingParams(temperature=0.8, top_k=8)
    prompt, length, draws = [1, 5, 9], 4, 1500
    target = TorchEngine(tiny.target, max_draft_len=8)
    lookup = PromptLookup(max_ngram=2, min_ngram=1) if "lookup" in drafter else None
    if lookup:  # the target's own greedy answer repeats itself: lookup has something to find from round one
        prompt += InProcessSpeculator(target, None).generate(TokenRequest(prompt, 8)).tokens
    draft = (TorchEngine(tiny.sub_vocabulary if "sub-vocabulary" in drafter else tiny.perturbed)
             if "draft" in drafter else None)
    speculator = InProcessSpeculator(target, draft)
    outputs = []
    accepted = lookup_accepted = lookup_drafted = 0
    for seed in range(draws):
        result = speculator.generate(TokenRequest(
            prompt, length, sampling=params, seed=seed, num_draft_tokens=k, use_draft_logits=use_draft_logits,
            prompt_lookup=lookup, verification=verification))
        assert len(result.tokens) == length
        outputs.append(tuple(result.tokens))
        accepted += result.stats.accepted_tokens
        lookup_accepted += result.stats.source("lookup").accepted_tokens
        lookup_drafted += result.stats.source("lookup").drafted_tokens
    assert accepted > draws // 4  # the drafts really contribute tokens
    if lookup:  # lookup drafts were both accepted and rejected
        assert draws // 4 < lookup_accepted < lookup_drafted
    exact = exact_continuations(tiny.target, prompt, length, params)
    first_two, fourth = Counter(), Counter()
    for path, probability in exact.items():
        first_two[path[:2]] += probability
        fourth[path[3]] += probability
    # two tests at ALPHA each: a correct sampler fails this test with probability <= 2e-3
    assert chi_square_pvalue(Counter(o[:2] for o in outputs), first_two) > ALPHA
    assert chi_square_pvalue(Counter(o[3] for o in outputs), fourth) > ALPHA
