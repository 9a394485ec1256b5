"""A new release against the one in service (``bench --incumbent``): the interleaved order of two releases, their
ratio and texts per cell, and the gate's ``faster_than_incumbent`` both ways."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from specbuild.bench.figures import RequestTrace, match_incumbent, summarize
from specbuild.bench.gate import GateThresholds, evaluate
from specbuild.bench.sweep import BenchPlan, BenchReport, IncumbentRun
from specbuild.cli import main


def test_every_cell_s_block_runs_on_both_releases_back_to_back_the_first_alternating():
    plan = BenchPlan(ks=(2,), requests=2)
    k0, k2 = plan.cells()
    assert plan.runs(1, 2) == [(0, k0, [0]), (1, k0, [0]), (0, k2, [0]), (1, k2, [0]),
                               (1, k2, [1]), (0, k2, [1]), (1, k0, [1]), (0, k0, [1])]
    assert plan.runs(1) == [(0, key, block) for key, block in plan.schedule(1)]  # one release: the cells' order
    # every (release, cell) sends every prompt once
    runs = plan.runs(1, 2)
    assert sorted((release, key, tuple(block)) for release, key, block in runs) == sorted(
        (release, key, (block,)) for release in (0, 1) for key in (k0, k2) for block in (0, 1))


def _cell(k: int, tokens_per_second: float, texts: dict[int, str], sampling: str = "greedy") -> Any:
    traces = [RequestTrace(i, "captured", (0.1,), (4,), 0.1, text=text) for i, text in texts.items()]
    cell = summarize(k, 1, False, traces, 1.0, sampling=sampling)
    cell.tokens_per_second = tokens_per_second
    return cell


def test_each_cell_is_compared_with_the_incumbent_s_same_cell():
    new = [_cell(0, 10.0, {0: "a", 1: "b"}), _cell(2, 15.0, {0: "a", 1: "b"}),
           _cell(2, 14.0, {0: "x", 1: "y"}, sampling="t0.7")]
    old = [_cell(0, 10.0, {0: "a", 1: "b"}), _cell(2, 12.0, {0: "a", 1: "c"}),
           _cell(2, 14.0, {0: "z", 1: "y"}, sampling="t0.7")]
    texts = {cell.key: {0: "a", 1: "b"} for cell in new}
    old_texts = {old[0].key: {0: "a", 1: "b"}, old[1].key: {0: "a", 1: "c"}}
    match_incumbent(new, old, texts, old_texts)
    assert [cell.incumbent_ratio for cell in new] == [1.0, 1.25, 1.0]
    # greedy: the share of prompts with the incumbent's text; sampled: not compared (draws depend on the draft)
    assert [cell.matches_incumbent for cell in new] == [1.0, 0.5, None]


def _report(ratio: float, matches: float | None, *, incumbent: bool = True, errors: int = 0,
            target_alone: float = 1.0) -> dict[str, Any]:
    cells = [{"label": "K=0", "k": 0, "concurrency": 1, "sampling": "greedy", "incumbent_ratio": target_alone,
              "matches_incumbent": 1.0, "requests": 4, "errors": 0},
             {"label": "K=2", "k": 2, "concurrency": 1, "sampling": "greedy", "incumbent_ratio": ratio,
              "matches_incumbent": matches, "requests": 4, "errors": 0}]
    old = [{"label": "K=0", "k": 0, "concurrency": 1, "requests": 4 - errors, "errors": errors}]
    return {"cells": cells, "incumbent": {"url": "127.0.0.1:1", "cells": old} if incumbent else None}


def test_the_gate_passes_a_release_faster_by_the_margin_with_the_incumbent_s_text():
    result = evaluate(_report(1.2, 1.0, target_alone=0.97), GateThresholds(faster_than_incumbent=1.05))
    assert result.passed, result.summary()
    assert evaluate(_report(0.5, 1.0, target_alone=2.0), GateThresholds(faster_than_incumbent=0.4)).passed  # < 1
    assert [(check.threshold, check.cell) for check in result.checks] == [
        ("faster_than_incumbent", "K=0 concurrency 1"),  # the target alone: the same speed within the margin
        ("faster_than_incumbent", "K=2 concurrency 1"),  # speed: the speculative cells
        ("faster_than_incumbent", "K=0 concurrency 1"), ("faster_than_incumbent", "K=2 concurrency 1"),  # text
        ("max_error_rate", None)]


@pytest.mark.parametrize("report, why", [
    (_report(1.02, 1.0), "faster_than_incumbent 1.02 (limit 1.05)"),
    (_report(1.5, 0.75), "25% of the prompts were answered differently from the incumbent"),
    (_report(1.5, None), "no prompt was answered both by this cell and by the incumbent"),
    (_report(1.5, 1.0, incumbent=False), "the run measured no incumbent"),
    (_report(1.5, 1.0, errors=1), "1 of 12 requests failed"),  # the incumbent's requests count too
    # the same target measured 0.82x: the load moved more than the margin, so 1.5x may be noise (measured here)
    (_report(1.5, 1.0, target_alone=0.82), "the target alone measured 0.82x the incumbent's, outside 0.95-1.05"),
    (_report(1.5, 1.0, target_alone=1.06), "outside 0.95-1.05"),
])
def test_the_gate_refuses_a_release_too_slow_or_with_other_text(report: dict[str, Any], why: str):
    result = evaluate(report, GateThresholds(faster_than_incumbent=1.05))
    assert not result.passed and why in result.summary(), result.summary()


def test_the_report_shows_both_releases_and_their_ratio(tmp_path):
    from specbuild.bench.report import incumbent_rows, markdown

    new, old = [_cell(0, 10.0, {0: "a"}), _cell(2, 15.0, {0: "a"})], [_cell(0, 10.0, {0: "a"}), _cell(2, 12.0, {0: "a"})]
    match_incumbent(new, old, {cell.key: {0: "a"} for cell in new}, {cell.key: {0: "a"} for cell in old})
    report = BenchReport(BenchPlan(ks=(2,)), "127.0.0.1:2", 1, new, False, incumbent=IncumbentRun("127.0.0.1:3", old))
    assert incumbent_rows(report) == [("0", "1", "10.0", "10.0", "1.00x", "-", "-", "100%"),
                                      ("2", "1", "15.0", "12.0", "1.25x", "-", "-", "100%")]
    assert "## Against the incumbent release" in markdown(report) and "`127.0.0.1:3`" in markdown(report)
    document = report.to_dict()
    assert document["incumbent"]["url"] == "127.0.0.1:3" and len(document["incumbent"]["cells"]) == 2
    assert document["cells"][1]["incumbent_ratio"] == 1.25
    assert BenchReport(BenchPlan(), "u", 1, new, False).to_dict()["incumbent"] is None
    assert incumbent_rows(BenchReport(BenchPlan(), "u", 1, new, False)) == []


@pytest.mark.parametrize("args, message", [
    (["--url", "127.0.0.1:1", "--incumbent", "."], "--incumbent needs --repository"),
    (["--url", "127.0.0.1:1", "--captured", "."], "--captured needs --repository"),
    (["--repository", ".", "--incumbent", ".", "--in-process"], "--in-process measures one release"),
    (["--repository", ".", "--captured", ".", "--category", "code"], "--captured replays captured prompts"),
    (["--repository", ".", "--gate", "faster_than_incumbent=1.1"], "no --incumbent was given"),
    (["--repository", ".", "--gate", "faster_than_incumbent=0"], "invalid --gate faster_than_incumbent"),
])
def test_bench_refuses_release_options_that_do_not_fit(args: list[str], message: str):
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
