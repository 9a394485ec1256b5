"""The release's cost model and the per-request break-even: the one formula, when a request stops drafting and
probes again, that only K changes (greedy text identical with and without it), and how it is counted."""

from __future__ import annotations

import pytest


from specbuild.speculation.cost import (
    FIRST_PAUSE_TOKENS,
    MAX_PAUSE_TOKENS,
    PAUSE_GROWTH,
    BreakEvenGate,
    CostModel,
    expected_speedup,
    leviathan_tokens_per_step,
)
from specbuild.speculation.round_costs import RoundCosts
from specbuild.speculation.stats import METRICS

DEMO = CostModel(draft_cost=0.18, verify_cost={1: 1.15, 2: 1.18, 4: 1.23}, acceptance=0.49, measured=True)


def test_verification_cost_of_a_k_not_measured_is_the_nearest_measured_above_else_the_largest_else_one():
    assert DEMO.verify(2) == 1.18 and DEMO.verify(3) == 1.23 and DEMO.verify(8) == 1.23
    assert CostModel(draft_cost=0.1).verify(5) == 1.0


def test_verifying_more_tokens_never_costs_less_whatever_a_mix_of_measurements_says():
    """tune measures V(1) through the server over the V(K) measured in process: V(2) = 1.0 below V(1) = 1.11 would
    make K=2 look cheaper and push the break-even down."""
    mixed = CostModel(draft_cost=0.13, verify_cost={1: 1.11, 2: 1.0, 3: 1.0, 6: 1.3})
    assert [mixed.verify(k) for k in (1, 2, 3, 4, 6, 8)] == [1.11, 1.11, 1.11, 1.3, 1.3, 1.3]
    assert mixed.break_even_acceptance(8) == pytest.approx(0.13 + 1.11 - 1, abs=1e-5)
    assert "V(2)=1.11" in mixed.describe(8)


def test_a_fixed_k_request_is_judged_at_the_ks_it_drafts_an_adaptive_one_at_every_k():
    from specbuild.speculation.drafting import DraftHealth, draft_sources
    from specbuild.speculation.request import TokenRequest
    from specbuild.speculation.stats import SpeculationStats

    def gate(**request):
        drafts = draft_sources(TokenRequest([1, 2, 3], 8, break_even=DEMO, **request), lambda *_: None,
                               max_draft_len=4, stats=SpeculationStats(), health=DraftHealth())
        return drafts.gate.max_k

    assert gate(num_draft_tokens=1) == 1 and gate(num_draft_tokens=8) == 4
    assert gate(num_draft_tokens=1, adaptive_draft=True) == 4


def test_a_round_drafts_at_most_the_best_k_at_the_requests_own_acceptance():
    """A draft that agrees less is worth fewer tokens a round: K follows the request's acceptance, within its own."""
    from specbuild.speculation.drafting import Draft, DraftHealth, Drafts, draft_sources
    from specbuild.speculation.request import TokenRequest
    from specbuild.speculation.stats import SpeculationStats

    def drafts():
        return draft_sources(TokenRequest([1, 2, 3], 64, num_draft_tokens=4, break_even=DEMO), lambda *_: None,
                             max_draft_len=4, stats=SpeculationStats(), health=DraftHealth())

    agreeing, rejected = drafts(), drafts()
    assert agreeing.round_length == DEMO.best(0.49, 4)[0] == 2  # the prior: the release's measured acceptance
    for _ in range(20):
        agreeing.update(Draft([7] * agreeing.round_length, None, agreeing.sources[-1]), agreeing.round_length)
    assert agreeing.round_length == 4
    rejected.update(Draft([7, 7], None, rejected.sources[-1]), 0)
    assert rejected.gate.drafting and rejected.round_length == 1  # still pays, but at one token a round
    assert Drafts(rejected.sources, 4, 4).round_length == 4  # without a break-even: the request's K, always


def test_speedup_is_the_one_formula_at_leviathans_tokens_per_step():
    assert DEMO.speedup(0.49, 2) == expected_speedup(leviathan_tokens_per_step(0.49, 2), 2, 0.18, 1.18)
    assert DEMO.speedup(0.0, 0) == 1.0  # K=0 is the target alone


def test_break_even_acceptance_at_k1_is_c_plus_v1_minus_1():
    """Below the break-even the best K is 1, where (1 + a) / (c + V(1)) = 1 gives a = c + V(1) - 1."""
    assert DEMO.break_even_acceptance(8) == pytest.approx(0.18 + 1.15 - 1, abs=1e-5)
    assert DEMO.best(0.9, 8)[0] > 1  # a good draft drafts more than one token
    assert CostModel(draft_cost=1.0, verify_cost={1: 1.2}).break_even_acceptance(4) is None  # can never pay


def test_a_request_whose_drafts_are_rejected_stops_drafting_for_a_growing_stretch_and_probes_between():
    gate = BreakEvenGate(DEMO, max_k=4)
    assert gate.drafting  # the release's measured acceptance (0.49) pays
    rounds = 0
    while gate.drafting:
        gate.observe(4, 0)
        rounds += 1
    assert rounds > 1  # one rejected round does not outweigh the prior
    assert gate.paused_tokens == FIRST_PAUSE_TOKENS
    gate.idle(FIRST_PAUSE_TOKENS - 1)
    assert not gate.drafting
    gate.idle(1)
    assert gate.drafting  # the probe
    gate.observe(4, 0)
    assert gate.paused_tokens == FIRST_PAUSE_TOKENS * PAUSE_GROWTH
    for _ in range(20):
        gate.idle(gate.paused_tokens)
        gate.observe(4, 0)
    assert gate.paused_tokens == MAX_PAUSE_TOKENS


def test_a_request_whose_drafts_are_accepted_keeps_drafting_and_one_that_recovers_drafts_again():
    gate = BreakEvenGate(DEMO, max_k=4)
    for _ in range(50):
        gate.observe(4, 4)
    assert gate.drafting
    bad = BreakEvenGate(DEMO, max_k=4)
    while bad.drafting:
        bad.observe(4, 0)
    bad.idle(bad.paused_tokens)
    for _ in range(10):
        bad.observe(4, 4)
    assert bad.drafting


def test_without_a_measured_acceptance_the_prior_sits_at_the_break_even_so_the_request_decides():
    cost = CostModel(draft_cost=0.18, verify_cost={1: 1.15})
    gate = BreakEvenGate(cost, max_k=4)
    assert gate.drafting and gate.acceptance == pytest.approx(cost.break_even_acceptance(4), abs=1e-5)
    gate.observe(1, 0)
    assert not gate.drafting


def test_a_release_whose_measured_acceptance_does_not_pay_starts_without_drafts():
    assert not BreakEvenGate(CostModel(draft_cost=0.18, verify_cost={1: 1.15}, acceptance=0.1), max_k=4).drafting


def test_its_counters_are_one_prometheus_name_each():
    names = {metric.key: metric.name for metric in METRICS}
    assert names["break_even_requests"] == "specbuild_break_even_requests_total"
    assert names["break_even_rounds"] == "specbuild_break_even_rounds_total"


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_text_is_the_same_with_and_without_the_break_even_and_it_switched_drafting_off(tiny, stream):
    """An unrelated draft: its tokens are rejected, the break-even stops drafting, and the text stays the target's;
    the loop told the speculator's round costs what its rounds cost."""
    from specbuild.runtimes.torch.engine import TorchEngine
    from specbuild.runtimes.torch.inprocess import InProcessSpeculator
    from specbuild.speculation.request import TokenRequest

    speculator = InProcessSpeculator(TorchEngine(tiny.target, max_draft_len=4), TorchEngine(tiny.unrelated))
    measuring = InProcessSpeculator(speculator.target, speculator.draft)
    # Here the break-even decides at the release's costs: at this host's measured ones the decision would follow
    # its load (the unrelated draft agrees about 0.1-0.15, near where c and V(1) of a busy host put the break-even).
    speculator.costs = RoundCosts(exclusive=lambda: False)
    alone = InProcessSpeculator(speculator.target, None)
    chunk = 1 if stream else None
    for prompt in ([1, 5, 9], [3, 3, 7, 2], [11, 4]):
        expected = alone.generate(TokenRequest(prompt, 60, num_draft_tokens=0)).tokens
        plain = speculator.generate(TokenRequest(prompt, 60, num_draft_tokens=4, target_only_chunk=chunk))
        gated = speculator.generate(TokenRequest(prompt, 60, num_draft_tokens=4, target_only_chunk=chunk,
                                                      break_even=DEMO))
        assert plain.tokens == expected and gated.tokens == expected
        assert gated.stats.break_even_requests == 1 and gated.stats.break_even_rounds > 0
        assert gated.stats.drafted_tokens < plain.stats.drafted_tokens
        assert plain.stats.break_even_rounds == 0
        if not stream:  # a stretch is one target call of its tokens
            assert gated.stats.rounds < plain.stats.rounds
        measured = measuring.generate(TokenRequest(prompt, 60, num_draft_tokens=4, target_only_chunk=chunk,
                                                        break_even=DEMO))
        assert measured.tokens == expected  # whatever this host's costs decide
    costs = measuring.costs  # what the rounds after each request's first cost, for the break-even (round_costs.py)
    # the draft step only from rounds that follow a drafted round (few here: the break-even stops this draft early)
    assert costs.alone_token.ready and costs.verification and costs.draft_token.samples > 0


@pytest.mark.slow
@pytest.mark.e2e
def test_served_requests_are_counted_where_the_break_even_switched_drafting_off_and_not_where_they_turned_it_off(
        tiny_pair, tmp_path):
    """A release whose measured cost model says its draft cannot pay (c = 0.9, acceptance 0.1): through the server,
    a request leaves drafting to the break-even and is counted by both counters; one that sends break_even=false
    drafts every round and is counted by neither; the text is the same."""
    from specbuild import compiler
    from specbuild.bench.sweep import read_counters
    from specbuild.serve.client import SpecbuildClient
    from specbuild.serve.server import TritonServer
    from specbuild.spec import load_spec

    spec = load_spec(None, {
        "name": "break-even", "runtime": "torch", "target.checkpoint": str(tiny_pair.target_dir),
        "draft.checkpoint": str(tiny_pair.draft_dir), "limits.max_input_len": 64, "limits.max_seq_len": 128,
        "speculation.num_draft_tokens": 2, "speculation.max_draft_len": 4, "speculation.draft_cost": 0.9,
        "speculation.verify_cost": {1: 1.1, 2: 1.2}, "speculation.measured_acceptance": 0.1,
        **{f"outputs.{folder}": str(tmp_path / folder) for folder in ("build_dir", "engines_dir", "repository_dir")},
    }, base_dir=tmp_path)
    release = compiler.run(spec, json_mode=True)
    with TritonServer(release.repository, startup_timeout=300) as server:
        client = SpecbuildClient(server.grpc_url, timeout=300)
        texts, deltas = [], []
        for break_even in (None, False):
            before = read_counters(server.metrics_url)
            generation = client.generate("def add(a, b):", 24, num_draft_tokens=2, stream=True, break_even=break_even)
            deltas.append(read_counters(server.metrics_url) - before)
            texts.append(generation.text)
    gated, ungated = deltas
    assert texts[0] == texts[1]
    assert gated.break_even_requests == 1 and gated.break_even_rounds > 0
    assert ungated.break_even_requests == 0 and ungated.break_even_rounds == 0
    assert gated.drafted_tokens < ungated.drafted_tokens
