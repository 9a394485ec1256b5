"""The release gate of `specbuild bench --gate`: thresholds against a bench report (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from specbuild.bench.gate import GateThresholds, evaluate, parse_thresholds
from specbuild.cli import main
from specbuild.errors import UsageError


def _cell(k: int, concurrency: int = 1, *, speedup: float | None = 1.0, acceptance: float | None = None,
          matches: float | None = 1.0, p95: float | None = 0.5, requests: int = 4, errors: int = 0,
          sampling: str = "greedy") -> dict[str, Any]:
    return {"label": f"K={k}", "k": k, "concurrency": concurrency, "sampling": sampling, "speedup": speedup, "acceptance_rate": acceptance,
            "matches_baseline": matches, "e2e": {"p50": None, "p95": p95, "p99": None}, "requests": requests,
            "errors": errors}


def _report(*cells: dict[str, Any]) -> dict[str, Any]:
    return {"format": "specbuild.bench/v1", "plan": {}, "cells": list(cells)}


GOOD = _report(_cell(0), _cell(2, speedup=1.3, acceptance=0.8, p95=0.4), _cell(4, speedup=1.2, acceptance=0.7))


def test_a_release_that_meets_every_threshold_passes():
    thresholds = GateThresholds(min_speedup=1.1, min_acceptance=0.6, greedy_identical=True, max_p95_ms=600)
    result = evaluate(GOOD, thresholds)
    assert result.passed and result.failures == []
    # each threshold on each speculative cell, and the error rate once for the run
    assert [(c.threshold, c.cell) for c in result.checks] == [
        ("min_speedup", "K=2 concurrency 1"), ("min_speedup", "K=4 concurrency 1"),
        ("min_acceptance", "K=2 concurrency 1"), ("min_acceptance", "K=4 concurrency 1"),
        ("greedy_identical", "K=2 concurrency 1"), ("greedy_identical", "K=4 concurrency 1"),
        ("max_p95_ms", "K=2 concurrency 1"), ("max_p95_ms", "K=4 concurrency 1"),
        ("max_error_rate", None)]
    assert result.summary() == "gate passed (9 checks)"


def test_each_failing_threshold_names_its_cell_and_figure():
    report = _report(_cell(0), _cell(2, speedup=0.9, acceptance=0.2, matches=0.75, p95=0.9))
    result = evaluate(report, GateThresholds(min_speedup=1.0, min_acceptance=0.5, greedy_identical=True,
                                             max_p95_ms=800))
    failures = {check.threshold: check for check in result.failures}
    assert set(failures) == {"min_speedup", "min_acceptance", "greedy_identical", "max_p95_ms"}
    assert failures["min_acceptance"].measured == 0.2 and failures["min_acceptance"].limit == 0.5
    assert failures["greedy_identical"].detail == "25% of the prompts were answered differently from K=0"
    assert failures["max_p95_ms"].measured == pytest.approx(900.0)
    data = result.to_dict()
    assert data["passed"] is False and len(data["failures"]) == 4 and len(data["checks"]) == 5
    assert "K=2 concurrency 1: min_acceptance 0.2 (limit 0.5)" in result.summary()


def test_any_failed_request_fails_the_run_unless_a_rate_is_tolerated():
    too_long = "prompt has 306 tokens, more than max_input_len (256)"
    report = _report(_cell(0, requests=9, errors=1) | {"error_messages": [too_long]}, _cell(2, acceptance=0.5))
    strict = evaluate(report, GateThresholds())
    assert not strict.passed
    [failure] = strict.failures
    assert failure.threshold == "max_error_rate" and failure.measured == pytest.approx(1 / 14)
    assert failure.detail == f"1 of 14 requests failed: {too_long}"  # what they were told, in the JSON
    assert evaluate(report, GateThresholds(max_error_rate=0.1)).passed


def test_missing_figures_fail_rather_than_pass():
    report = _report(_cell(0), _cell(2, speedup=None, acceptance=None, matches=None, p95=None, requests=0))
    result = evaluate(report, GateThresholds(min_speedup=1.0, min_acceptance=0.1, greedy_identical=True,
                                             max_p95_ms=100))
    details = {check.threshold: check.detail for check in result.failures}
    assert details == {"min_speedup": "no K=0 cell at this concurrency to compare with",
                       "min_acceptance": "no draft token was verified",
                       "greedy_identical": "no prompt was answered both by this cell and by K=0",
                       "max_p95_ms": "no request finished"}
    assert evaluate(_report(), GateThresholds()).failures[0].detail == "no request was sent"


def test_greedy_identity_is_checked_on_the_greedy_cells_and_needs_some():
    sampled = [_cell(0, sampling="t0.7", matches=None), _cell(2, sampling="t0.7", matches=None)]
    [failure] = evaluate(_report(*sampled), GateThresholds(greedy_identical=True)).failures
    assert "the run has no greedy cell" in failure.detail and failure.cell is None
    mixed = evaluate(_report(_cell(0), _cell(2), *sampled), GateThresholds(greedy_identical=True))
    assert mixed.passed and [c.cell for c in mixed.checks if c.threshold == "greedy_identical"] == ["K=2 concurrency 1"]


def test_without_speculative_cells_the_baseline_is_gated():
    result = evaluate(_report(_cell(0, p95=2.0)), GateThresholds(max_p95_ms=1000))
    assert [check.cell for check in result.failures] == ["K=0 concurrency 1"]


def test_thresholds_parse_from_gate_options():
    thresholds = parse_thresholds(["min_speedup=1.05", "greedy_identical", "max_error_rate=0.02"])
    assert thresholds == GateThresholds(min_speedup=1.05, greedy_identical=True, max_error_rate=0.02)
    with pytest.raises(UsageError, match="min_acceptance") as caught:
        parse_thresholds(["min_acceptance=2"])
    assert "min_speedup, min_acceptance" in str(caught.value.fix)
    with pytest.raises(UsageError, match="speed"):
        parse_thresholds(["speed=2"])


@pytest.mark.parametrize("args,message", [
    (["--gate", "min_acceptance=x"], "invalid --gate min_acceptance"),
    (["--gate", "greedy_identical", "--sampling", "t0.7"], "greedy_identical compares greedy answers"),
    (["--sampling", "t0.5"], "unknown sampling profile 't0.5'"),
])
def test_bench_refuses_bad_gates_before_sending_anything(args, message):
    result = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--json", *args])
    assert result.exit_code == 2
    error = json.loads(result.stdout)
    assert message in error["error"] and error["exit_code"] == 2
