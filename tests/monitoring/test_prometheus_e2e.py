"""Tested against the real thing: a real Prometheus (Debian's package, tests/prometheus_tools.py) on loopback, with
the configuration and rule file ``specbuild monitoring`` writes (scraping every second), scrapes the tiny torch
release on a real Triton server under a short bounded load. Through Prometheus's HTTP API: every rule evaluates
without error, every recording rule, alert signal and dashboard query returns a series wherever a CPU torch
release exports what it reads (the GPU-only panels, whose metrics it does not export, evaluate without one), the
alerts a healthy server must not raise are quiet, and bench's quantile estimate equals histogram_quantile's on the
same buckets."""

from __future__ import annotations

import itertools
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from prometheus_tools import selectors, PrometheusServer, prometheus_tools
from specbuild.bench.histograms import Histogram
from specbuild.monitoring.dashboard import GPU_ONLY_METRICS, JOB, RATE_INTERVAL, specbuild_dashboard
from specbuild.monitoring.prometheus_config import JOB as SCRAPE_JOB
from specbuild.monitoring.prometheus_config import CONFIG_FILE, RULES_FILE, prometheus_config, rule_file
from specbuild.monitoring.promql import Scope
from specbuild.monitoring.alert_rules import AlertThresholds, alerts, recording_rules
from specbuild.serve.client import GenerationRequest
from specbuild.speculation.stats import LATENCY_METRICS

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

LOAD_SECONDS = 35
THRESHOLDS = AlertThresholds(ttft_p95_seconds=5.0)  # the torch runtime's default
QUIET = {"SpecbuildDraftFallbacks", "SpecbuildRequestErrors", "SpecbuildRequestTimeouts", "SpecbuildTTFTHigh",
         "SpecbuildServerNotReady", "SpecbuildNoReplicas"}  # a healthy server under light load raises none
REQUESTS = [GenerationRequest("def add(a, b):", 24, stream=True, num_draft_tokens=3),
            GenerationRequest("for i in range(10):\n    total += i\nfor i in range(10):\n", 24, stream=True,
                              num_draft_tokens=3, prompt_lookup=True),
            GenerationRequest("The weather today", 16, num_draft_tokens=0),
            GenerationRequest("Once upon a time", 20, stream=True, num_draft_tokens=2, temperature=0.9, top_p=1.0,
                              seed=11)]


def bounded_load(client, seconds: float) -> int:
    """Two clients sending the requests above in turn for ``seconds``; how many were answered."""
    deadline, answered, lock = time.monotonic() + seconds, [0], threading.Lock()
    mix = itertools.cycle(REQUESTS)

    def sender() -> None:
        while time.monotonic() < deadline:
            with lock:
                request = next(mix)
            client.run(request)
            with lock:
                answered[0] += 1

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(sender) for _ in range(2)]:
            future.result()
    return answered[0]


@pytest.fixture(scope="module")
def scraped(tiny_server, tiny_client, tmp_path_factory):
    """Prometheus after scraping the tiny release every second through the bounded load."""
    prometheus_tools()  # fetched (or skipped) before the server's time is spent
    folder: Path = tmp_path_factory.mktemp("prometheus")
    target = urllib.parse.urlsplit(tiny_server.metrics_url).netloc
    (folder / RULES_FILE).write_text(rule_file(THRESHOLDS), encoding="utf-8")
    config = prometheus_config([target], scrape_interval="1s")
    (folder / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    with PrometheusServer(folder / CONFIG_FILE, folder) as prometheus:
        answered = bounded_load(tiny_client, LOAD_SECONDS)
        assert answered > 20, answered
        print(f"bounded load: {answered} requests answered in {LOAD_SECONDS} s, scraped every second")
        time.sleep(3)  # the last scrape and rule evaluation after the load
        yield prometheus


def test_prometheus_scrapes_the_release_and_evaluates_every_rule(scraped):
    [target] = scraped.api("targets")["activeTargets"]
    assert target["health"] == "up" and target["labels"]["job"] == SCRAPE_JOB, target
    groups = scraped.api("rules")["groups"]
    evaluated = [rule for group in groups for rule in group["rules"]]
    assert len(evaluated) == len(recording_rules(Scope())) + len(alerts(Scope(), THRESHOLDS))
    for rule in evaluated:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule


def test_every_recording_rule_and_alert_signal_has_a_series(scraped):
    for name, expr in recording_rules(Scope()).items():
        assert scraped.query(name), f"recording rule {name} recorded nothing ({expr})"
    for alert in alerts(Scope(), THRESHOLDS):
        assert scraped.query(alert.signal), f"{alert.name}: its signal {alert.signal} has no series"
        firing = scraped.query(alert.expr)  # evaluates, whether or not it holds
        if alert.name in QUIET:
            assert not firing, f"{alert.name} holds on a healthy server: {firing}"


def test_every_dashboard_query_evaluates_and_shows_what_a_cpu_release_exports(scraped):
    exported = set(scraped.api("label/__name__/values"))
    for row, panel, query in specbuild_dashboard().queries():
        expr = query.expr.replace(f"${JOB}", SCRAPE_JOB).replace(RATE_INTERVAL, "1m")
        result = scraped.query(expr)
        missing = {name for name, _ in selectors(query.expr)} - exported
        assert missing <= GPU_ONLY_METRICS, f"{panel.title}: {missing} are neither exported here nor GPU-only"
        if not missing:
            assert result, f"{row.title} / {panel.title}: {expr} has no series"


def test_bench_estimates_quantiles_as_prometheus_does(scraped):
    """bench's Histogram.quantile on the buckets Prometheus holds at one instant equals histogram_quantile's."""
    at = time.time()
    for metric in LATENCY_METRICS:
        raw = scraped.query(f"sum by (le) ({metric.name}_bucket)", time=at)
        bounds = sorted(float(item["metric"]["le"]) for item in raw)
        counts = {float(item["metric"]["le"]): float(item["value"][1]) for item in raw}
        histogram = Histogram(tuple(bounds), tuple(counts[bound] for bound in bounds))
        assert histogram.count > 0, metric.name
        for q in (0.5, 0.95, 0.99):
            [answer] = scraped.query(f"histogram_quantile({q}, sum by (le) ({metric.name}_bucket))", time=at)
            assert histogram.quantile(q) == pytest.approx(float(answer["value"][1]), rel=1e-9), (metric.name, q)
