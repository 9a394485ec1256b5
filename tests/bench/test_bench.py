"""specbuild bench: the math on synthetic traces (fast), the prompt set, the reports, and one tiny bench
against a real Triton server on the tiny pair (slow). No test asserts on timing of a real run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specbuild.bench.figures import (BY_SOURCE, COUNTER_NAMES, PER_POSITION, Cell, Counters, RequestTrace, chunk_tokens, compare,
                                     drift_warnings, match_baseline, percentiles, served_efficiency, summarize)
from specbuild.bench.sweep import BenchPlan, is_loopback, rotated
from specbuild.errors import UsageError
from specbuild.speculation.cost import expected_speedup, leviathan_tokens_per_step, per_token_acceptance
from specbuild.bench.prompts import BUNDLED, CATEGORIES, interleave, load_prompts, parse_jsonl
from locations import REPO_ROOT


# --- prompts ---------------------------------------------------------------------------------------------
def test_bundled_prompts_cover_every_category_with_varied_lengths():
    prompts = load_prompts()
    assert len(prompts) >= 80
    assert {p.category for p in prompts} == set(CATEGORIES)
    lengths = sorted(len(p.prompt) for p in prompts)
    assert lengths[0] < 60 and lengths[-1] > 500
    assert len({p.prompt for p in prompts}) == len(prompts)


def test_limit_takes_prompts_round_robin_across_categories():
    first = load_prompts(limit=5)
    assert [p.category for p in first] == list(dict.fromkeys(p.category for p in load_prompts()))[:5]
    assert len({p.category for p in first}) == 5


def test_user_jsonl_and_its_errors(tmp_path: Path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"category": "x", "prompt": "a"}\n\n{"prompt": "b", "extra": 1}\n', encoding="utf-8")
    assert [(p.category, p.prompt) for p in load_prompts(good)] == [("x", "a"), ("custom", "b")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"category": "x"}\n', encoding="utf-8")
    with pytest.raises(UsageError, match="line 2"):
        load_prompts(bad)
    with pytest.raises(UsageError, match="line 1"):
        parse_jsonl("not json", "f")
    with pytest.raises(UsageError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(UsageError, match="no prompts in the categories"):
        load_prompts(categories=["poetry"])


def test_interleave_keeps_order_within_a_category():
    prompts = parse_jsonl("\n".join(json.dumps({"category": c, "prompt": p})
                                    for c, p in [("a", "1"), ("a", "2"), ("b", "3")]), "t")
    assert [p.prompt for p in interleave(prompts)] == ["1", "3", "2"]


# --- per-request figures ---------------------------------------------------------------------------------
def trace(times, tokens, **kwargs) -> RequestTrace:
    return RequestTrace(0, "chat", tuple(times), tuple(tokens), total_time=kwargs.pop("total", times[-1]), **kwargs)


def test_chunk_tokens_from_running_counts():
    assert chunk_tokens([1, 3, None, 6, 6]) == [1, 2, 0, 3, 0]


def test_ttft_tpot_and_inter_token_latencies():
    # first token at 0.5 s, then 2 tokens at 0.9 s, an empty final response, 1 token at 1.0 s
    t = trace([0.5, 0.9, 0.95, 1.0], [1, 2, 0, 1])
    assert t.output_tokens == 4 and t.rounds == 3
    assert t.ttft == 0.5
    assert t.tpot == pytest.approx((1.0 - 0.5) / 3)
    assert t.inter_token_latencies() == pytest.approx([0.2, 0.2, 0.1])
    # tokens of the first response beyond the first one came with it
    assert trace([0.4, 0.6], [3, 1]).inter_token_latencies() == pytest.approx([0.0, 0.0, 0.2])
    assert trace([0.3], [1]).tpot is None
    assert trace([0.3], [0]).ttft is None


def test_percentiles_ignore_missing_values():
    values = [None] + [float(v) for v in range(1, 101)]
    result = percentiles(values)
    assert result["p50"] == pytest.approx(50.5)
    assert result["p99"] == pytest.approx(99.01)
    assert percentiles([None]) == {"p50": None, "p95": None, "p99": None}


# --- analytic model --------------------------------------------------------------------------------------
def test_leviathan_tokens_per_step():
    assert leviathan_tokens_per_step(0.0, 4) == 1.0
    assert leviathan_tokens_per_step(1.0, 4) == 5.0
    assert leviathan_tokens_per_step(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)


@pytest.mark.parametrize("a,k", [(0.1, 1), (0.5, 2), (0.73, 4), (0.95, 8)])
def test_per_token_acceptance_inverts_the_formula(a, k):
    assert per_token_acceptance(leviathan_tokens_per_step(a, k), k) == pytest.approx(a, abs=1e-6)


def test_expected_speedup_textbook_and_with_verification_cost():
    mal = leviathan_tokens_per_step(0.8, 4)
    assert expected_speedup(mal, 4, 0.05) == pytest.approx(mal / 1.2)
    # verification costing 1.5 target steps eats into the gain
    assert expected_speedup(mal, 4, 0.05, 1.5) == pytest.approx(mal / 1.7)
    assert expected_speedup(1.0, 0, 0.3) == 1.0


# --- counters --------------------------------------------------------------------------------------------
def samples(accepted_per_position, **scalars):
    names = {"rounds": "specbuild_spec_decode_rounds_total", "drafts": "specbuild_spec_decode_num_drafts_total",
             "drafted_tokens": "specbuild_spec_decode_num_draft_tokens_total",
             "accepted_tokens": "specbuild_spec_decode_num_accepted_tokens_total",
             "draft_seconds": "specbuild_draft_seconds_total", "target_seconds": "specbuild_target_seconds_total",
             "output_tokens": "specbuild_output_tokens_total"}
    by_source = {"lookup_drafts": "specbuild_spec_decode_source_drafts_total",
                 "lookup_drafted_tokens": "specbuild_spec_decode_source_draft_tokens_total",
                 "lookup_accepted_tokens": "specbuild_spec_decode_source_accepted_tokens_total"}
    result = [(names[key], {"model": "orchestrator"}, value) for key, value in scalars.items() if key in names]
    result += [(by_source[key], {"model": "orchestrator", "source": "lookup"}, value)
               for key, value in scalars.items() if key in by_source]
    result += [("specbuild_spec_decode_num_accepted_tokens_per_pos_total",
                {"model": "orchestrator", "position": str(i)}, v) for i, v in enumerate(accepted_per_position)]
    result.append(("nv_inference_count", {"model": "target"}, 99.0))  # Triton's own metrics are ignored
    return result


def test_bench_reads_the_counters_the_orchestrator_writes():
    """One table of names (speculation.stats): every counter bench reads is one the orchestrator exports, by key."""
    from specbuild.speculation.stats import CAPTURE_METRICS, METRICS, REQUEST_METRICS, SourceStats, SpeculationStats

    exported = {metric.name for metric in METRICS}
    assert set(COUNTER_NAMES.values()) | set(PER_POSITION.values()) | set(BY_SOURCE.values()) <= exported
    stats_fields = set(vars(SpeculationStats()))
    assert set(COUNTER_NAMES) - {metric.key for metric in REQUEST_METRICS + CAPTURE_METRICS} <= stats_fields
    assert set(PER_POSITION) <= stats_fields and set(BY_SOURCE) == set(vars(SourceStats()))
    assert {"requests", "output_tokens", "errors", "cancelled", "timed_out"} <= set(COUNTER_NAMES)  # by key


def test_counters_parse_prometheus_text_and_subtract():
    from prometheus_client.parser import text_string_to_metric_families

    text = ('# HELP specbuild_draft_seconds_total Time\n# TYPE specbuild_draft_seconds_total counter\n'
            'specbuild_draft_seconds_total{model="orchestrator"} 1.5\n'
            '# TYPE specbuild_spec_decode_num_accepted_tokens_per_pos_total counter\n'
            'specbuild_spec_decode_num_accepted_tokens_per_pos_total{model="orchestrator",position="1"} 3\n'
            'specbuild_spec_decode_num_accepted_tokens_per_pos_total{model="orchestrator",position="0"} 7\n')
    parsed = Counters.from_samples((s.name, s.labels, s.value)
                                   for family in text_string_to_metric_families(text) for s in family.samples)
    assert parsed.draft_seconds == 1.5
    assert parsed.accepted_per_position == (7.0, 3.0)
    before = Counters.from_samples(samples([2, 0, 0], rounds=10, accepted_tokens=2, lookup_drafts=1))
    after = Counters.from_samples(samples([5, 3, 0], rounds=25, accepted_tokens=8, lookup_drafts=4,
                                          lookup_accepted_tokens=3))
    delta = after - before
    assert delta.rounds == 15 and delta.accepted_tokens == 6
    assert delta.source("lookup") == {"drafts": 3, "accepted_tokens": 3, "drafted_tokens": 0}
    assert delta.source("model") == {"drafts": 0, "accepted_tokens": 0, "drafted_tokens": 0}
    assert delta.accepted_per_position == (3.0, 3.0)  # trailing zeros dropped
    flat = delta.as_dict()  # the form JSON reports (the soak's) keep
    assert flat["rounds"] == 15 and flat["accepted_per_position"] == [3.0, 3.0]
    assert flat["by_source"]["lookup"]["drafts"] == 3 and json.loads(json.dumps(flat)) == flat


# --- cells -----------------------------------------------------------------------------------------------
STEP = 0.05  # target seconds per token at K=0


def synthetic_cell(k: int, tokens_per_second: float, counters: Counters | None, concurrency: int = 1,
                   lookup: bool = False, sampling: str = "greedy") -> Cell:
    """A cell of 4 requests producing 100 tokens in all over 100 / tokens_per_second seconds."""
    wall = 100 / tokens_per_second
    traces = [trace([0.1 * (j + 1) for j in range(25)], [1] * 25, total=wall / 4) for _ in range(4)]
    return summarize(k, concurrency, False, traces, wall, counters, lookup=lookup, sampling=sampling)


def test_summarize_from_counters():
    counters = Counters.of(rounds=40, drafts=40, drafted_tokens=160, accepted_tokens=60, draft_seconds=0.8,
                        target_seconds=3.0, accepted_per_position=(30.0, 18.0, 9.0, 3.0))
    cell = synthetic_cell(4, 25.0, counters)
    assert cell.source == "metrics"
    assert cell.output_tokens == 100 and cell.tokens_per_second == pytest.approx(25.0)
    assert cell.acceptance_rate == pytest.approx(60 / 160)
    assert cell.mean_acceptance_length == pytest.approx(1 + 60 / 40)
    assert cell.acceptance_per_position == pytest.approx([0.75, 0.45, 0.225, 0.075])
    assert cell.draft_tokens_per_round == 4
    assert cell.draft_seconds_per_token == pytest.approx(0.005)
    assert cell.target_seconds_per_round == pytest.approx(0.075)
    assert cell.engine_share == pytest.approx(3.8 / 4.0)
    assert len(cell.latencies["e2e"]) == 4
    assert cell.sources == {}  # no source counted by name (a server older than the per-source counters)


def test_summarize_reports_prompt_lookups_share_and_acceptance():
    # 40 rounds: 10 drafted by lookup (25 tokens, 15 accepted), 20 by the draft model, 10 by neither
    counters = Counters.of(rounds=40, drafts=30, drafted_tokens=85, accepted_tokens=40, draft_seconds=0.6,
                           target_seconds=3.0,
                           sources={"lookup": {"drafts": 10, "drafted_tokens": 25, "accepted_tokens": 15},
                                    "model": {"drafts": 20, "drafted_tokens": 60, "accepted_tokens": 25}})
    cell = synthetic_cell(3, 25.0, counters, lookup=True)
    assert cell.label == "K=3+lookup" and cell.key == (3, False, True, 1, "greedy")
    assert cell.sources["lookup"] == {"share": pytest.approx(10 / 40), "acceptance": pytest.approx(15 / 25)}
    assert cell.sources["model"] == {"share": pytest.approx(20 / 40), "acceptance": pytest.approx(25 / 60)}
    assert cell.acceptance_rate == pytest.approx(40 / 85)  # the totals count both draft sources
    assert cell.mean_acceptance_length == pytest.approx(1 + 40 / 30)
    base = synthetic_cell(0, 20.0, Counters.of(rounds=100, target_seconds=5.0))
    assert compare([base, cell])[1].speedup == pytest.approx(25 / 20)  # lookup cells compare with plain K=0


def test_summarize_without_counters_uses_per_request_outputs():
    traces = [trace([0.1, 0.2, 0.3], [1, 3, 2], drafted=8, accepted=4),
              trace([0.1, 0.2], [2, 2], drafted=4, accepted=2), RequestTrace(1, "code", (), (), 0.1, error="boom")]
    cell = summarize(2, 1, False, traces + [RequestTrace(2, "code", (), (), 0.1, error="boom")], 1.0)
    assert cell.source == "requests" and cell.requests == 2 and cell.errors == 2
    assert cell.error_messages == ["boom"]  # each message once: the gate quotes them
    assert cell.acceptance_rate == pytest.approx(6 / 12)
    assert cell.mean_acceptance_length == pytest.approx(10 / 5)  # tokens per streamed round


def test_compare_speedup_expectation_and_efficiency():
    base = synthetic_cell(0, 20.0, Counters.of(rounds=100, target_seconds=100 * STEP))
    # K=4: MAL 2.5, draft 0.1 target steps per token, verification 1.5 target steps
    spec = synthetic_cell(4, 30.0, Counters.of(rounds=40, drafts=40, drafted_tokens=160, accepted_tokens=60,
                                            draft_seconds=160 * 0.1 * STEP, target_seconds=40 * 1.5 * STEP))
    other = synthetic_cell(4, 50.0, None, concurrency=8)  # no K=0 at concurrency 8: nothing to compare
    cells = compare([base, spec, other])
    assert cells[0].speedup == 1.0 and cells[0].expected_speedup is None
    result = cells[1]
    assert result.speedup == pytest.approx(1.5)
    assert result.cost_ratio == pytest.approx(0.1)
    assert result.verify_cost == pytest.approx(1.5)
    assert result.expected_speedup == pytest.approx(2.5 / (4 * 0.1 + 1.5))
    assert result.expected_speedup_textbook == pytest.approx(2.5 / 1.4)
    assert result.efficiency == pytest.approx(1.5 / (2.5 / 1.9))
    assert leviathan_tokens_per_step(result.per_token_acceptance, 4) == pytest.approx(2.5)
    assert cells[2].speedup is None
    assert spec.speedup is None  # the inputs are not modified


def test_expectation_counts_rounds_that_draft_nothing():
    """Lookup-only: 20 of 100 rounds drafted (2 tokens, 1.5 accepted each), 80 rounds make one token alone.
    Tokens per round 1 + 30/100; cost per round: 80 one-token steps and 20 verifications of 1.25 steps."""
    base = synthetic_cell(0, 20.0, Counters.of(rounds=100, target_seconds=100 * STEP))
    lookup = synthetic_cell(2, 23.0, Counters.of(rounds=100, drafts=20, drafted_tokens=40, accepted_tokens=30,
                                              target_seconds=(80 + 20 * 1.25) * STEP,
                                              sources={"lookup": {"drafts": 20, "drafted_tokens": 40,
                                                                  "accepted_tokens": 30}}), lookup=True)
    cell = compare([base, lookup])[1]
    assert cell.tokens_per_round == pytest.approx(1.3)
    assert cell.expected_speedup == pytest.approx(1.3 / 1.05)  # MAL / V(K) over drafted rounds would say 2.5 / 1.05
    assert cell.expected_speedup_textbook == pytest.approx(1.3)
    assert cell.efficiency == pytest.approx((23 / 20) / (1.3 / 1.05))


def test_match_baseline_counts_identical_outputs():
    cells = [synthetic_cell(0, 10.0, None), synthetic_cell(2, 10.0, None)]
    cells.append(synthetic_cell(2, 10.0, None, lookup=True))
    match_baseline(cells, {(0, False, False, 1, "greedy"): {0: "a", 1: "b"}, (2, False, False, 1, "greedy"): {0: "a", 1: "c", 2: "d"},
                           (2, False, True, 1, "greedy"): {0: "a", 1: "b"}})
    assert [c.matches_baseline for c in cells] == [1.0, 0.5, 1.0]
    sampled = synthetic_cell(2, 10.0, None, sampling="t0.7")
    match_baseline([sampled], {(0, False, False, 1, "t0.7"): {0: "a"}, (2, False, False, 1, "t0.7"): {0: "a"}})
    assert sampled.matches_baseline is None  # its draws depend on K: its text is not compared


def test_each_sampling_profile_is_compared_with_its_own_k0():
    cells = compare([synthetic_cell(0, 10.0, None), synthetic_cell(2, 15.0, None),
                     synthetic_cell(0, 8.0, None, sampling="t1.0"), synthetic_cell(2, 10.0, None, sampling="t1.0")])
    assert [(c.label, c.speedup) for c in cells] == [("K=0", 1.0), ("K=2", 1.5), ("K=0 t1.0", 1.0),
                                                      ("K=2 t1.0", 1.25)]


def test_a_sampled_cell_sends_seeded_requests_the_same_in_every_cell():
    from specbuild.bench.sweep import SentPrompt, _request

    plan = BenchPlan(ks=(2,), samplings=("greedy", "t0.7"))
    prompt = SentPrompt("hi", "chat")
    greedy = _request(prompt, 3, plan, (2, False, True, 1, "greedy"))
    sampled = [_request(prompt, 3, plan, (k, False, k > 0, 1, "t0.7")) for k in (0, 2)]
    assert (greedy.temperature, greedy.top_p, greedy.seed) == (None, None, None)
    assert {(r.temperature, r.top_p, r.seed) for r in sampled} == {(0.7, 0.9, 1003)}
    assert plan.cells() == [(0, False, False, 1, "greedy"), (2, False, False, 1, "greedy"),
                            (0, False, False, 1, "t0.7"), (2, False, False, 1, "t0.7")]
    with pytest.raises(ValueError, match="unknown sampling profile 'hot'"):
        BenchPlan(samplings=("hot",))


def test_the_warm_up_has_the_target_read_every_prompt_the_cells_send():
    """Both engines' first calls on the first prompt, then each other prompt the cells will send once, at K=0 for one
    token (a prefill in no timed cell); nothing without warm-up; a failed warm-up request stops the run by name."""
    from specbuild.bench.sweep import WARMUP_TOKENS, SentPrompt, warm_up
    from specbuild.errors import ServerError

    prompts = [SentPrompt(f"prompt {index}", "chat") for index in range(5)]
    sent: list[tuple[int, int, int | None, str]] = []

    def send(request, index):
        sent.append((index, request.max_tokens, request.num_draft_tokens, request.prompt))
        return RequestTrace(index, "warmup", (0.1,), (request.max_tokens,), 0.1)

    warm_up(send, prompts, BenchPlan(ks=(3,), requests=3))  # the cells send prompts 0, 1 and 2
    assert sorted((tokens, k, text) for _, tokens, k, text in sent[:2]) == [
        (WARMUP_TOKENS, 0, "prompt 0"), (WARMUP_TOKENS, 3, "prompt 0")]
    assert [(tokens, k, text) for _, tokens, k, text in sent[2:]] == [(1, 0, "prompt 1"), (1, 0, "prompt 2")]
    sent.clear()
    warm_up(send, prompts, BenchPlan(ks=(3,), requests=3, warmup=False))
    assert sent == []

    def failing(request, index):
        return RequestTrace(index, "warmup", (), (), 0.1, error="model not ready")

    with pytest.raises(ServerError, match="the warm-up request failed: model not ready"):
        warm_up(failing, prompts, BenchPlan(ks=(3,)))


# --- plan and addresses ----------------------------------------------------------------------------------
def test_plan_always_includes_k0_and_skips_adaptive_and_lookup_at_k0():
    plan = BenchPlan(ks=(4, 2), adaptive=(True, False), concurrencies=(2, 1))
    assert plan.ks == (0, 2, 4)
    assert plan.cells()[:4] == [(0, False, False, 1, "greedy"), (2, False, False, 1, "greedy"), (2, True, False, 1, "greedy"), (4, False, False, 1, "greedy")]
    assert len(plan.cells()) == 10
    lookup = BenchPlan(ks=(2,), lookup=(True, False))
    assert lookup.cells() == [(0, False, False, 1, "greedy"), (2, False, False, 1, "greedy"), (2, False, True, 1, "greedy")]
    with pytest.raises(ValueError):
        BenchPlan(concurrencies=(0,))


def test_rotated_puts_every_item_first_in_turn():
    assert [rotated([1, 2, 3], shift) for shift in range(4)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]
    assert rotated([], 5) == []


def test_cells_run_interleaved_block_by_block_in_rotating_order():
    plan = BenchPlan(ks=(2,), lookup=(False, True), concurrencies=(1, 2), requests=3)
    level_one = [(0, False, False, 1, "greedy"), (2, False, False, 1, "greedy"), (2, False, True, 1, "greedy")]
    assert plan.blocks(1) == [[0], [1], [2]] and plan.blocks(2) == [[0, 1], [2]]
    assert plan.schedule(1) == [(level_one[0], [0]), (level_one[1], [0]), (level_one[2], [0]),
                                (level_one[1], [1]), (level_one[2], [1]), (level_one[0], [1]),
                                (level_one[2], [2]), (level_one[0], [2]), (level_one[1], [2])]
    level_two = plan.schedule(2)
    assert [key[3] for key, _ in level_two] == [2] * 6
    assert [block for _, block in level_two] == [[0, 1]] * 3 + [[2]] * 3
    # every cell runs every block once, and no cell always goes first
    for schedule in (plan.schedule(1), level_two):
        cells = {key for key, _ in schedule}
        assert all(sorted(b for k, block in schedule if k == key for b in block) == [0, 1, 2] for key in cells)
        assert len({schedule[i][0] for i in range(0, len(schedule), len(cells))}) > 1


def test_counter_deltas_add_up_over_blocks():
    first = Counters.of(rounds=10, accepted_tokens=4, accepted_per_position=(3.0, 1.0))
    second = Counters.of(rounds=5, accepted_tokens=2, accepted_per_position=(2.0,), drafted_per_position=(4.0,))
    total = Counters() + first + second
    assert total.rounds == 15 and total.accepted_tokens == 6
    assert total.accepted_per_position == (5.0, 1.0) and total.drafted_per_position == (4.0,)
    assert total - second == first


def test_drift_warning_when_verification_comes_out_cheaper_than_a_step():
    base = synthetic_cell(0, 20.0, Counters.of(rounds=100, target_seconds=100 * STEP))
    honest = synthetic_cell(2, 24.0, Counters.of(rounds=50, drafts=50, drafted_tokens=100, accepted_tokens=50,
                                              draft_seconds=100 * 0.1 * STEP, target_seconds=50 * 1.2 * STEP))
    drifted = synthetic_cell(2, 30.0, Counters.of(rounds=50, drafts=50, drafted_tokens=100, accepted_tokens=50,
                                               draft_seconds=100 * 0.1 * STEP, target_seconds=50 * 0.9 * STEP),
                             lookup=True)
    cells = compare([base, honest, drifted])
    [warning] = drift_warnings(cells)
    assert warning.startswith("K=2+lookup at concurrency 1: V(K) = 0.90 < 1")
    assert drift_warnings(cells[:2]) == []


@pytest.mark.parametrize("url", ["127.0.0.1:8001", "localhost:8001", "http://127.0.0.1:8002/metrics", "[::1]:8001"])
def test_loopback_addresses_are_recognised(url):
    assert is_loopback(url)


@pytest.mark.parametrize("url", ["10.1.2.3:8001", "http://192.168.0.4:8002/metrics", "no-such-host.invalid:1"])
def test_other_addresses_are_not_loopback(url):
    assert not is_loopback(url)  # bench --url may target them (the user named them), with a note saying so


# --- reports ---------------------------------------------------------------------------------------------
def test_reports_are_written(tmp_path: Path):
    from specbuild.bench.report import markdown, tables, write_outputs
    from specbuild.bench.sweep import BenchReport

    base = synthetic_cell(0, 20.0, Counters.of(rounds=100, target_seconds=5.0))
    spec = synthetic_cell(2, 26.0, Counters.of(rounds=50, drafts=50, drafted_tokens=100, accepted_tokens=50, draft_seconds=0.5,
                                            target_seconds=3.0, accepted_per_position=(30.0, 20.0)))
    lookup = synthetic_cell(2, 30.0, Counters.of(rounds=40, drafts=40, drafted_tokens=80, accepted_tokens=50, draft_seconds=0.3,
                                              target_seconds=2.5,
                                              sources={"lookup": {"drafts": 10, "drafted_tokens": 20,
                                                                  "accepted_tokens": 11}}), lookup=True)
    report = BenchReport(BenchPlan(ks=(2,), lookup=(False, True)), "127.0.0.1:1", 82, compare([base, spec, lookup]),
                         True, {"cpus": 2}, warnings=["K=2 drifted"])
    written = write_outputs(report, tmp_path / "out")
    assert sorted(p.name for p in written) == ["acceptance.png", "bench.json", "bench.md", "latency.png",
                                               "speedup.png"]
    for png in (p for p in written if p.suffix == ".png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["cells"][1]["label"] == "K=2" and math.isclose(data["cells"][1]["speedup"], 1.3)
    assert data["cells"][2]["label"] == "K=2+lookup" and data["cells"][2]["lookup"] is True
    assert data["cells"][2]["sources"] == {"lookup": {"share": 0.25, "acceptance": 0.55}}
    assert data["plan"]["lookup"] == [False, True]
    assert data["order"] == "interleaved" and data["warnings"] == ["K=2 drifted"]
    text = markdown(report)
    assert "**Warning:** K=2 drifted" in text
    assert "| 2 | 1 | 4 | 26.0 | 1.30x |" in text
    assert "| 2+lookup | 1 | 4 | 30.0 | 1.50x |" in text and "| lookup 25%/0.55 |" in text
    speed, _ = tables(report.cells)
    sources_column = [column for column in speed.columns if column.header == "sources"]
    assert len(sources_column) == 1 and list(sources_column[0].cells) == ["-", "-", "lookup 25%/0.55"]


def test_wheel_ships_the_bundled_prompts(tmp_path: Path):
    import zipfile

    hatchling = pytest.importorskip("hatchling.builders.wheel")
    root = REPO_ROOT
    wheel = next(iter(hatchling.WheelBuilder(str(root)).build(directory=str(tmp_path), versions=["standard"])))
    names = zipfile.ZipFile(wheel).namelist()
    assert all(f"specbuild/bench/{file}" in names for file in BUNDLED.values())


# --- end to end (slow): a real Triton server on the tiny pair ----------------------------------------------
@pytest.fixture(scope="module")
def bench_release(tiny_pair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair compiled with the torch runtime; returns its spec file (the repository is in its folder)."""
    from specbuild import compiler
    from specbuild.spec import load_spec

    root = tmp_path_factory.mktemp("tiny_release")
    spec = load_spec(None, {"name": "tiny", "runtime": "torch", "target.checkpoint": str(tiny_pair.target_dir),
                            "draft.checkpoint": str(tiny_pair.draft_dir), "speculation.max_draft_len": 4,
                            "outputs.build_dir": "build", "outputs.engines_dir": "engines",
                            "outputs.repository_dir": "triton_repo"}, base_dir=root)
    spec_file = root / "specbuild.yaml"
    spec_file.write_text(spec.to_yaml(), encoding="utf-8")
    compiler.run(spec)
    return spec_file


@pytest.mark.slow
@pytest.mark.e2e
def test_bench_against_a_real_server(bench_release: Path, tmp_path: Path):
    from click.testing import CliRunner

    from specbuild.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "bench", "--repository", str(bench_release.parent / "triton_repo"), "--k", "2", "--concurrency", "1,2",
        "--lookup", "off,on", "--num-prompts", "3", "--requests", "3", "--max-tokens", "12", "--out", str(out),
        "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    assert data["metrics"] is True
    cells = {(c["k"], c["lookup"], c["concurrency"]): c for c in data["cells"]}
    assert set(cells) == {(0, False, 1), (2, False, 1), (2, True, 1), (0, False, 2), (2, False, 2), (2, True, 2)}
    for (k, lookup, concurrency), cell in cells.items():
        # Which rounds draft at 2 in flight depends on timing (torch's load policy: no drafts from 2 in flight), and
        # the per-request break-even may then switch the model off where lookup still proposes: only at 1 in flight
        # must every source that was asked for draft.
        assert set(cell["sources"]) <= ({"model", "lookup"} if lookup else {"model"} if k else set())
        if concurrency == 1:
            assert ("lookup" in cell["sources"]) == lookup and ("model" in cell["sources"]) == (k > 0)
        for figures in cell["sources"].values():
            assert 0.0 < figures["share"] <= 1.0
        assert cell["requests"] == 3 and cell["errors"] == 0 and cell["output_tokens"] > 0
        assert cell["source"] == "metrics"
        assert cell["matches_baseline"] == 1.0  # greedy: speculation never changes the text
        if cell["sources"]:
            assert 0.0 <= cell["acceptance_rate"] <= 1.0
            assert 1.0 <= cell["mean_acceptance_length"] <= 3.0
            assert cell["draft_tokens_per_round"] <= 2
            assert all(0.0 <= a <= 1.0 for a in cell["acceptance_per_position"])
            assert cell["expected_speedup"] > 0 and cell["verify_cost"] > 0
            assert cell["cost_ratio"] > 0 or "model" not in cell["sources"]  # lookup makes no draft calls
        # the server's latency histograms over the cell, beside what the client measured
        assert set(cell["server_latency"]) == {"ttft", "tpot", "e2e", "queue"}
        for quantiles in cell["server_latency"].values():
            assert 0 < quantiles["p50"] <= quantiles["p95"] <= quantiles["p99"]
    assert "server TTFT ms p50/p95/p99" in (out / "bench.md").read_text()
    assert {p.name for p in out.iterdir()} >= {"bench.md", "speedup.png", "acceptance.png", "latency.png"}
    assert data["order"] == "interleaved"
    impossible = [c for c in data["cells"] if c["k"] and c["verify_cost"] < 1]
    assert len(data["warnings"]) == len(impossible)


@pytest.mark.slow
@pytest.mark.e2e
def test_in_process_cells_run_the_release_s_own_engines_beside_the_server(bench_release: Path, tmp_path: Path):
    """``--in-process``: every concurrency-1 cell again with the release's preprocessing, orchestrator code and
    engines in the bench's process; the same texts as the served target alone, counters read as a server's, and
    the served path's efficiency per cell (served tokens/s over in-process)."""
    from click.testing import CliRunner

    from specbuild.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "bench", "--repository", str(bench_release.parent / "triton_repo"), "--in-process", "--k", "2",
        "--concurrency", "1,2", "--lookup", "on", "--num-prompts", "3", "--requests", "3", "--max-tokens", "12",
        "--out", str(out), "--no-plots", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    local = {cell["label"]: cell for cell in data["in_process"]}
    assert set(local) == {"K=0", "K=2+lookup"}  # concurrency 1 only
    for label, cell in local.items():
        assert cell["concurrency"] == 1 and cell["requests"] == 3 and cell["errors"] == 0
        assert cell["source"] == "metrics"  # the request runner's own counters, read as a server's
        assert cell["matches_baseline"] == 1.0  # the served target alone's texts, token for token
        assert data["served_efficiency"][label] > 0
    assert local["K=2+lookup"]["drafted_per_round"] > 0 and local["K=0"]["drafted_per_round"] == 0
    assert data["environment"]["cpu_model"]
    assert "The served path against the same release in process" in (out / "bench.md").read_text()


def test_in_process_needs_the_release_s_folder():
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--in-process"])
    assert result.exit_code == 2 and "--in-process" in result.output and "--repository" in result.output


def test_served_efficiency_pairs_each_in_process_cell_with_the_served_one():
    served = [summarize(0, 1, False, [], 1.0), summarize(2, 1, False, [], 1.0)]
    served[0].tokens_per_second, served[1].tokens_per_second = 30.0, 45.0
    local = [summarize(0, 1, False, [], 1.0), summarize(2, 1, False, [], 1.0), summarize(3, 1, False, [], 1.0)]
    local[0].tokens_per_second, local[1].tokens_per_second, local[2].tokens_per_second = 40.0, 50.0, 50.0
    pairs = [(cell.k, ratio) for cell, ratio in served_efficiency(served, local)]
    assert pairs == [(0, 0.75), (2, 0.9), (3, None)]


@pytest.mark.slow
@pytest.mark.e2e
def test_interleaved_cells_count_only_their_own_blocks(tiny_release, tiny_server):
    """Cells of one level run block by block in turn against the shared tiny server: each cell's counter
    deltas are its own blocks' (K=0 drafts nothing, K=1 at most one token a round), and every cell sent
    every prompt; sampled cells beside greedy ones, each against its own K=0, text compared on greedy only."""
    from specbuild.bench.sweep import repository_tokenizer, run_bench

    plan = BenchPlan(ks=(1, 3), lookup=(False, True), concurrencies=(1, 2), requests=3, max_tokens=10,
                     samplings=("greedy", "t1.0"))
    prompts = [prompt for prompt in load_prompts() if len(prompt.prompt) < 200][:3]  # within max_input_len
    report = run_bench(tiny_server.grpc_url, prompts, plan, metrics_url=tiny_server.metrics_url,
                       tokenizer_dir=repository_tokenizer(tiny_release.repository))
    assert [cell.key for cell in report.cells] == plan.cells()
    for cell in report.cells:
        assert cell.requests == 3 and cell.errors == 0 and cell.source == "metrics"
        assert cell.matches_baseline == (1.0 if cell.sampling == "greedy" else None)
        assert cell.speedup is not None  # against K=0 of the same sampling
        if cell.k == 0:
            assert cell.acceptance_rate is None and cell.draft_tokens_per_round is None
        else:
            assert 0 < cell.draft_tokens_per_round <= cell.k and cell.verify_cost > 0
    assert report.warnings == drift_warnings(report.cells)


@pytest.mark.slow
@pytest.mark.e2e
def test_tune_writes_the_choice_into_the_spec_and_the_repository(bench_release: Path, tmp_path: Path):
    import shutil

    from click.testing import CliRunner
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from specbuild.cli import main
    from specbuild.spec import load_spec

    release = tmp_path / "release"
    shutil.copytree(bench_release.parent, release, symlinks=True)
    spec_file = release / "specbuild.yaml"
    spec_file.write_text(spec_file.read_text().replace(str(bench_release.parent), str(release)))
    result = CliRunner().invoke(main, ["tune", "--spec", str(spec_file), "--goal", "throughput", "--k", "0,1",
                                       "--adaptive", "both", "--concurrency", "1", "--num-prompts", "2",
                                       "--requests", "2", "--max-tokens", "8"])
    assert result.exit_code == 0, result.output
    spec = load_spec(spec_file)
    config = text_format.Parse((release / "triton_repo" / "orchestrator" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert config.parameters["num_draft_tokens"].string_value == str(spec.speculation.num_draft_tokens)
    assert config.parameters["adaptive_draft"].string_value == str(spec.speculation.adaptive).lower()
    assert f"K={spec.speculation.num_draft_tokens}" in result.output
    verified = CliRunner().invoke(main, ["verify", str(release / "triton_repo")])
    assert verified.exit_code == 0, verified.output  # the manifest was re-written with the new configs


@pytest.mark.slow
@pytest.mark.e2e
def test_tune_measures_k_per_load_and_ships_it(bench_release: Path, tmp_path: Path):
    """K per load on the tiny pair: every level's cells drafted the K they asked for (the release's own load policy,
    torch's {2: 0}, is off while measuring), the schedule is written into the spec and the orchestrator's
    parameters, and verify shows it."""
    import json
    import shutil

    from click.testing import CliRunner
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from specbuild.cli import main
    from specbuild.spec import load_spec
    from specbuild.speculation.schedule import TUNED_LOADS

    release = tmp_path / "release"
    shutil.copytree(bench_release.parent, release, symlinks=True)
    spec_file = release / "specbuild.yaml"
    spec_file.write_text(spec_file.read_text().replace(str(bench_release.parent), str(release)))
    result = CliRunner().invoke(main, ["tune", "--spec", str(spec_file), "--concurrency-schedule", "--goal",
                                       "throughput", "--k", "0,2", "--num-prompts", "2", "--requests", "2",
                                       "--max-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout[result.stdout.index("{"):])
    levels = sorted({cell["concurrency"] for cell in document["cells"]})
    assert levels == list(TUNED_LOADS)
    for cell in document["cells"]:  # each level ran at least one full block, and K=2 drafted at every load
        assert cell["requests"] >= cell["concurrency"] and cell["errors"] == 0
        if cell["k"]:
            assert (cell["draft_tokens_per_round"] or 0) > 0, cell
    speculation = load_spec(spec_file).speculation
    schedule = speculation.draft_len_schedule
    assert schedule == {int(key): k for key, k in document["draft_len_schedule"].items()}
    assert min(schedule) == 1 and schedule[1] == speculation.num_draft_tokens and speculation.busy_in_flight is None
    config = text_format.Parse((release / "triton_repo" / "orchestrator" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert config.parameters["draft_len_schedule"].string_value == ",".join(f"{c}:{k}" for c, k in schedule.items())
    verified = CliRunner().invoke(main, ["verify", str(release / "triton_repo")])
    assert verified.exit_code == 0 and "K by load: " in verified.output, verified.output
    assert not [path.name for path in release.iterdir() if path.name.startswith(".tune-")]  # the copy is gone


@pytest.mark.parametrize("args,message", [
    ([], "either --url"),
    (["--url", "127.0.0.1:1", "--repository", "."], "either --url"),
    (["--url", "127.0.0.1:1", "--k", "2,x"], "comma-separated list"),
    (["--url", "127.0.0.1:1", "--concurrency", "0"], "concurrency levels"),
])
def test_bench_command_refuses_bad_options_without_a_traceback(args, message):
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, ["bench", "--num-prompts", "1", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_acceptance_per_position_divides_by_drafts_at_that_position():
    from specbuild.bench.figures import acceptance_per_position

    # Adaptive K: 10 rounds drafted position 0, only 4 reached position 2.
    counters = Counters.of(drafts=10, accepted_per_position=(8.0, 5.0, 2.0), drafted_per_position=(10.0, 8.0, 4.0))
    assert acceptance_per_position(counters) == pytest.approx([0.8, 0.625, 0.5])
    older_server = Counters.of(drafts=10, accepted_per_position=(8.0, 5.0))
    assert acceptance_per_position(older_server) == pytest.approx([0.8, 0.5])
    parsed = Counters.from_samples([
        ("specbuild_spec_decode_num_draft_tokens_per_pos_total", {"position": "0"}, 10.0),
        ("specbuild_spec_decode_num_draft_tokens_per_pos_total", {"position": "1"}, 8.0)])
    assert parsed.drafted_per_position == (10.0, 8.0)
    assert (parsed - Counters()).drafted_per_position == (10.0, 8.0)
