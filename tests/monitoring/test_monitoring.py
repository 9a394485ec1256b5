"""What an operator gets besides the metrics (specbuild/monitoring): the shipped dashboard is what its builder makes,
laid out without overlaps; every rule and panel reads its release's series only; thresholds default per runtime and
refuse nonsense; deploy writes the PrometheusRule and the dashboard's ConfigMap with the labels asked for. promtool
checks the rules in test_prometheus_rules.py; a real Prometheus evaluates every expression in
test_prometheus_e2e.py."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from click.testing import CliRunner

from specbuild.errors import UsageError
from specbuild.monitoring.dashboard import DASHBOARD_FILE, GRID_WIDTH, JOB, render, specbuild_dashboard
from specbuild.monitoring.promql import Scope
from specbuild.monitoring.alert_rules import AlertThresholds, alerts, recording_rules, release_thresholds
from specbuild.runtimes.pod_plans import DeployOptions
from specbuild.serve.k8s import DASHBOARD_CONFIG_MAP, manifests
from specbuild.cli import main
from k8s_objects import FOOTPRINT, by_kind, gpu_spec
from prometheus_tools import selectors
from locations import REPO_ROOT

def test_the_shipped_dashboard_is_what_the_builder_makes():
    assert DASHBOARD_FILE.read_text(encoding="utf-8") == render(specbuild_dashboard()), \
        "regenerate it: python -m specbuild.monitoring.dashboard"


def test_the_dashboard_lays_out_every_panel_once_within_the_grid():
    model = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    panels = model["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    assert [variable["name"] for variable in model["templating"]["list"]] == ["datasource", JOB]
    refs = [target["refId"] for panel in panels for target in panel.get("targets", [])]
    assert refs and all(re.fullmatch("[A-Z]", ref) for ref in refs)


def test_every_dashboard_query_reads_the_chosen_release_only():
    for _, panel, query in specbuild_dashboard().queries():
        found = selectors(query.expr)
        assert found, query.expr
        for name, matchers in found:
            assert f'job=~"${JOB}"' in matchers, (panel.title, name, query.expr)


def test_a_release_s_rules_read_its_own_series_only():
    scope = Scope(('namespace="llm"', 'job="llm/demo"'))
    thresholds = AlertThresholds(ttft_p95_seconds=1.0)
    exprs = [*recording_rules(scope).values(), *(alert.expr for alert in alerts(scope, thresholds)),
             *(alert.signal for alert in alerts(scope, thresholds))]
    for expr in exprs:
        found = selectors(expr)
        assert found, expr
        for name, matchers in found:
            assert 'namespace="llm"' in matchers and 'job="llm/demo"' in matchers, (name, expr)


def test_selectors_are_found_where_they_are():
    """Control of the regular expression the two tests above rely on."""
    assert selectors('sum by (job) (rate(a_total{job="x"}[5m])) / b{job="x"} > 0.2 unless on (job) up') == [
        ("a_total", '{job="x"}'), ("b", '{job="x"}'), ("up", "")]


def test_thresholds_default_per_runtime_and_refuse_nonsense():
    assert release_thresholds(gpu_spec(runtime="torch")).ttft_p95_seconds == 5.0
    gpu = release_thresholds(gpu_spec(), min_acceptance=0.3)
    assert (gpu.ttft_p95_seconds, gpu.min_acceptance) == (2.0, 0.3)
    with pytest.raises(UsageError, match="min_acceptance must lie between 0 and 1") as error:
        AlertThresholds(ttft_p95_seconds=1.0, min_acceptance=20)
    assert "--min-acceptance" in error.value.fix
    with pytest.raises(UsageError, match="TTFT threshold must be positive"):
        AlertThresholds(ttft_p95_seconds=0)


def test_deploy_objects_carry_the_rules_and_the_dashboard():
    options = DeployOptions(pvc="release", namespace="llm", monitor_labels={"release": "prom"}, min_acceptance=0.35,
                            ttft_p95_seconds=0.8, dashboard_labels={"grafana_dashboard": "yes"})
    objects = by_kind(manifests(gpu_spec(), FOOTPRINT, options))
    rule = objects["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"  # selected by the Prometheus that selects the PodMonitor
    assert rule["metadata"]["labels"] == objects["PodMonitor"]["metadata"]["labels"]
    by_name = {item.get("alert"): item for group in rule["spec"]["groups"] for item in group["rules"]}
    assert by_name["SpecbuildAcceptanceLow"]["expr"].endswith("< 0.35")
    assert by_name["SpecbuildTTFTHigh"]["expr"].endswith("> 0.8")
    assert 'job="llm/demo-pair"' in by_name["SpecbuildServerNotReady"]["expr"]  # the PodMonitor's scrape job
    config_map = objects["ConfigMap"]
    assert config_map["metadata"]["name"] == DASHBOARD_CONFIG_MAP
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "yes"
    assert config_map["data"]["specbuild.json"] == DASHBOARD_FILE.read_text(encoding="utf-8")
    default = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release")))["ConfigMap"]
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"  # kube-prometheus-stack's sidecar label


def test_deploy_flags_reach_the_rules(gpu_release, tmp_path):
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, [
        "deploy", str(gpu_release.repository), "-o", str(out), "--pvc", "release", "--min-acceptance", "0.25",
        "--ttft-p95", "3", "--dashboard-label", "team=llm"])
    assert result.exit_code == 0, result.output
    rule = yaml.safe_load((out / "prometheusrule.yaml").read_text())
    exprs = [item["expr"] for group in rule["spec"]["groups"] for item in group["rules"]]
    assert any(expr.endswith("< 0.25") for expr in exprs) and any(expr.endswith("> 3") for expr in exprs)
    assert yaml.safe_load((out / "configmap.yaml").read_text())["metadata"]["labels"]["team"] == "llm"
    refused = CliRunner().invoke(main, [
        "deploy", str(gpu_release.repository), "-o", str(out), "--pvc", "release", "--min-acceptance", "1.5"])
    assert refused.exit_code == 2 and "--min-acceptance" in refused.output


def test_the_wheel_ships_the_dashboard(tmp_path):
    """deploy and monitoring read dashboard.json from the installed package."""
    import zipfile
    
    hatchling = pytest.importorskip("hatchling.builders.wheel")
    root = REPO_ROOT
    wheel = next(iter(hatchling.WheelBuilder(str(root)).build(directory=str(tmp_path), versions=["standard"])))
    assert "specbuild/monitoring/dashboard.json" in zipfile.ZipFile(wheel).namelist()
