"""The recording and alerting rules against the real ``promtool`` (Debian's prometheus package, tests/
prometheus_tools.py): ``check rules`` on the plain rule file and on the PrometheusRule's groups, ``check config``
on what ``specbuild monitoring`` writes, and ``test rules`` with, for every alert, synthetic series on which it fires
and ones on which it does not, its ``for:`` duration included. The expected annotations are written out here as an
operator reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from prometheus_tools import promtool
from specbuild.monitoring.prometheus_config import CONFIG_FILE, RULES_FILE, rule_file
from specbuild.monitoring.promql import Scope
from specbuild.monitoring.alert_rules import AlertThresholds, alerts

THRESHOLDS = AlertThresholds(ttft_p95_seconds=2.0, min_acceptance=0.2, error_share=0.05, timeout_share=0.05)
NS, JOB, OTHER = "llm", "llm/demo", "llm/other"
SCOPE = Scope((f'namespace="{NS}"', f'job="{JOB}"'))  # as deploy scopes a release's PrometheusRule
RELEASE = {"namespace": NS, "job": JOB}


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """One input series of the release (``labels`` added), in promtool's expanding notation."""
    inside = ",".join(f'{key}="{value}"' for key, value in {**RELEASE, "model": "orchestrator", **labels}.items())
    return {"series": f"{name}{{{inside}}}", "values": values}


def alert_case(name: str, eval_time: str, fired: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": fired}


def fired(severity: str, summary: str, name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An alert that fires, with its annotations (description and runbook as the rule has them)."""
    [rule] = [alert for alert in alerts(SCOPE, THRESHOLDS) if alert.name == name]
    return {"exp_labels": {"severity": severity, **(RELEASE if labels is None else labels)},
            "exp_annotations": {"summary": summary, "description": rule.description, "runbook": rule.runbook}}


def buckets(name: str, per_minute: dict[str, int]) -> list[dict[str, str]]:
    """A histogram's cumulative bucket series, growing by ``per_minute`` observations at each bound."""
    return [series(f"{name}_bucket", f"0+{count}x40", le=bound) for bound, count in per_minute.items()]


# Each test: (input series, cases); every alert has a case where it fires and one (or more) where it does not.
TESTS: list[tuple[list[dict[str, str]], list[dict[str, Any]]]] = [
    # acceptance 10% for 40 minutes, another release's too; 60% after that would be healthy
    ([series("specbuild_spec_decode_num_draft_tokens_total", "0+100x40"),
      series("specbuild_spec_decode_num_accepted_tokens_total", "0+10x40"),
      series("specbuild_spec_decode_num_draft_tokens_total", "0+100x40", job=OTHER),
      series("specbuild_spec_decode_num_accepted_tokens_total", "0+10x40", job=OTHER)],
     [alert_case("SpecbuildAcceptanceLow", "12m", []),  # below for 11 minutes: not yet (for: 15m)
      alert_case("SpecbuildAcceptanceLow", "20m", [fired(
          "warning", "llm/demo: 10% of drafted tokens accepted, below 20%", "SpecbuildAcceptanceLow")])]),
    ([series("specbuild_spec_decode_num_draft_tokens_total", "0+100x40"),
      series("specbuild_spec_decode_num_accepted_tokens_total", "0+60x40")],
     [alert_case("SpecbuildAcceptanceLow", "30m", [])]),
    # one fallback at minute 11
    ([series("specbuild_draft_fallbacks_total", "0x10 1x30")],
     [alert_case("SpecbuildDraftFallbacks", "9m", []), alert_case("SpecbuildDraftFallbacks", "12m", []),
      alert_case("SpecbuildDraftFallbacks", "14m", [fired(
          "warning", "llm/demo: 1 draft fallbacks in 10 minutes", "SpecbuildDraftFallbacks")]),
      alert_case("SpecbuildDraftFallbacks", "30m", [])]),  # ten minutes without one
    # 10% of requests fail and 10% time out
    ([series("specbuild_requests_total", "0+60x40"), series("specbuild_request_errors_total", "0+6x40"),
      series("specbuild_timed_out_requests_total", "0+6x40")],
     [alert_case("SpecbuildRequestErrors", "4m", []),
      alert_case("SpecbuildRequestErrors", "10m", [fired(
          "critical", "llm/demo: 10% of requests fail", "SpecbuildRequestErrors")]),
      alert_case("SpecbuildRequestTimeouts", "8m", []),
      alert_case("SpecbuildRequestTimeouts", "15m", [fired(
          "warning", "llm/demo: 10% of requests stopped at their time limit", "SpecbuildRequestTimeouts")])]),
    ([series("specbuild_requests_total", "0+60x40"), series("specbuild_request_errors_total", "0+1x40"),
      series("specbuild_timed_out_requests_total", "0x40")],
     [alert_case("SpecbuildRequestErrors", "30m", []), alert_case("SpecbuildRequestTimeouts", "30m", [])]),
    # every first token between 2 and 5 s: p95 at 4.85 s; then every one within a second
    (buckets("specbuild_time_to_first_token_seconds", {"0.5": 0, "1": 0, "2": 0, "5": 10, "+Inf": 10}),
     [alert_case("SpecbuildTTFTHigh", "8m", []),
      alert_case("SpecbuildTTFTHigh", "15m", [fired(
          "warning", "llm/demo: p95 time to first token 4.85s, above 2s", "SpecbuildTTFTHigh")])]),
    (buckets("specbuild_time_to_first_token_seconds", {"0.5": 0, "1": 10, "2": 10, "5": 10, "+Inf": 10}),
     [alert_case("SpecbuildTTFTHigh", "30m", [])]),
    # replica a unreachable; b reachable without the serving model's metrics; c serving
    ([series("up", "0x30", instance="a:8002", model="", pod="a"), series("up", "1x30", instance="b:8002", pod="b"),
      series("up", "1x30", instance="c:8002", pod="c"),
      series("specbuild_requests_in_flight", "0x30", instance="c:8002", pod="c")],
     [alert_case("SpecbuildServerNotReady", "5m", []),
      alert_case("SpecbuildServerNotReady", "15m", [
          fired("critical", f"{JOB} replica {replica}:8002 does not serve", "SpecbuildServerNotReady",
                labels={**RELEASE, "instance": f"{replica}:8002", "pod": replica, **extra})
          for replica, extra in (("a", {}), ("b", {"model": "orchestrator"}))]),
      alert_case("SpecbuildNoReplicas", "15m", [])]),
    # no target of the release at all (another release's only)
    ([series("up", "1x30", job=OTHER, instance="d:8002")],
     [alert_case("SpecbuildNoReplicas", "5m", []),
      alert_case("SpecbuildNoReplicas", "15m", [fired(
          "critical", "llm/demo: no replica is scraped", "SpecbuildNoReplicas")])]),
]


def test_every_alert_is_tested_firing_and_not():
    """Control of the table above: no alert goes untested either way."""
    names = {alert.name for alert in alerts(SCOPE, THRESHOLDS)}
    cases = [case for _, cases in TESTS for case in cases]
    assert {case["alertname"] for case in cases if case["exp_alerts"]} == names
    assert {case["alertname"] for case in cases if not case["exp_alerts"]} == names


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(rule_file(THRESHOLDS, SCOPE), encoding="utf-8")
    return path


def test_promtool_unit_tests_of_every_alert(rules: Path, tmp_path: Path):
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": cases} for inputs, cases in TESTS]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails_promtool(rules: Path, tmp_path: Path):
    """Control: promtool's tests can fail (an alert expected where none fires)."""
    inputs, _ = TESTS[1]  # healthy acceptance
    case = alert_case("SpecbuildAcceptanceLow", "30m", [fired("warning", "x", "SpecbuildAcceptanceLow")])
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": [case]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    assert promtool("test", "rules", "tests.yaml", cwd=tmp_path).returncode != 0


def test_promtool_checks_the_rule_files_deploy_and_monitoring_write(tmp_path: Path):
    """The compose rule file (every series) and a release's PrometheusRule groups (its job) both pass."""
    from specbuild.runtimes.pod_plans import DeployOptions
    from specbuild.serve.k8s import prometheus_rule
    from k8s_objects import gpu_spec

    (tmp_path / "plain.yaml").write_text(rule_file(THRESHOLDS), encoding="utf-8")
    rule = prometheus_rule(gpu_spec(), DeployOptions(pvc="release", namespace=NS))
    (tmp_path / "operator.yaml").write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    result = promtool("check", "rules", "plain.yaml", "operator.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(f"SUCCESS: {sum(len(g['rules']) for g in rule['spec']['groups'])} rules found") == 2


def test_promtool_checks_the_compose_configuration(gpu_release, tmp_path: Path):
    from click.testing import CliRunner

    from specbuild.cli import main

    out = tmp_path / "monitoring"
    result = CliRunner().invoke(main, ["monitoring", str(gpu_release.repository), "-o", str(out),
                                       "--min-acceptance", "0.3", "--ttft-p95", "1.5"])
    assert result.exit_code == 0, result.output
    checked = promtool("check", "config", CONFIG_FILE, cwd=out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{RULES_FILE}" in checked.stdout and "SUCCESS" in checked.stdout
    exprs = {rule.get("alert"): rule["expr"] for group in yaml.safe_load((out / RULES_FILE).read_text())["groups"]
             for rule in group["rules"]}
    assert exprs["SpecbuildAcceptanceLow"].endswith("< 0.3") and exprs["SpecbuildTTFTHigh"].endswith("> 1.5")


def test_the_compose_rule_file_watches_every_series(tmp_path: Path):
    """Unscoped (one release per Prometheus), the alerts fire for whatever job scrapes it, and name none when no
    target is there at all."""
    (tmp_path / "plain.yaml").write_text(rule_file(THRESHOLDS), encoding="utf-8")
    inputs = [{"series": 'specbuild_requests_total{job="specbuild",instance="triton:8002"}', "values": "0+60x40"},
              {"series": 'specbuild_request_errors_total{job="specbuild",instance="triton:8002"}',
               "values": "0+30x40"}]
    [errors] = [alert for alert in alerts(Scope(), THRESHOLDS) if alert.name == "SpecbuildRequestErrors"]
    [absent] = [alert for alert in alerts(Scope(), THRESHOLDS) if alert.name == "SpecbuildNoReplicas"]
    tests = {"rule_files": ["plain.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": inputs, "alert_rule_test": [
            {"eval_time": "10m", "alertname": errors.name, "exp_alerts": [{
                "exp_labels": {"severity": "critical", "job": "specbuild"},
                "exp_annotations": {"summary": "specbuild: 50% of requests fail", "description": errors.description,
                                    "runbook": errors.runbook}}]},
            {"eval_time": "15m", "alertname": absent.name, "exp_alerts": [{
                "exp_labels": {"severity": "critical"},
                "exp_annotations": {"summary": "no replica is scraped", "description": absent.description,
                                    "runbook": absent.runbook}}]}]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
