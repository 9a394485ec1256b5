"""The serving models' metrics exporter (triton_models/metrics.py) outside Triton, through the python backend's
stand-in (tests/image_python, as strict about histogram buckets as the backend): every row of the metrics table
is exported with its kind, and the latency histograms observe what a request row's timestamps say. Served, on a
real Triton server: test_e2e_serving.py (section 6) and test_prometheus_e2e.py."""

from __future__ import annotations

import sys
import types

import pytest

from specbuild.speculation.stats import E2E, LATENCY_METRICS, METRICS, QUEUE, TPOT, TTFT, Metric, SpeculationStats
from locations import IMAGE_PYTHON

MS = 1_000_000  # ns


@pytest.fixture
def metrics_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    monkeypatch.syspath_prepend(str(IMAGE_PYTHON))
    for name in ("triton_python_backend_utils", "specbuild.triton_models.metrics"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import specbuild.triton_models.metrics as module

    return module


def test_latencies_of_a_row_from_its_timestamps(metrics_module):
    latencies = metrics_module.request_latencies(arrival_ns=1000 * MS, scheduled_ns=1002 * MS,
                                                 first_token_ns=1050 * MS, last_token_ns=1250 * MS,
                                                 output_tokens=5, end_ns=1260 * MS)
    assert latencies == pytest.approx({QUEUE.key: 0.002, TTFT.key: 0.05, TPOT.key: 0.05, E2E.key: 0.26})


@pytest.mark.parametrize("tokens, timed", [(0, {QUEUE.key, E2E.key}), (1, {QUEUE.key, E2E.key, TTFT.key})])
def test_ttft_and_tpot_wait_for_the_tokens_they_time(metrics_module, tokens, timed):
    latencies = metrics_module.request_latencies(arrival_ns=0, scheduled_ns=MS, first_token_ns=2 * MS if tokens else 0,
                                                 last_token_ns=2 * MS if tokens else 0, output_tokens=tokens,
                                                 end_ns=3 * MS)
    assert set(latencies) == timed


def test_every_row_of_the_table_is_exported_with_its_kind(metrics_module):
    exporter = metrics_module.Metrics("orchestrator")
    families = exporter._families
    assert set(families) == {family.name for family in families.values()} == {metric.name for metric in METRICS}
    for metric in METRICS:
        assert families[metric.name].kind == metric.kind.upper()
    for metric in LATENCY_METRICS:
        assert exporter._metrics[metric.key].buckets == list(metric.buckets)
    exporter.observe_latencies(arrival_ns=0, scheduled_ns=MS, first_token_ns=3 * MS, last_token_ns=7 * MS,
                               output_tokens=3)
    assert exporter._metrics[TPOT.key].observations == [pytest.approx(0.002)]
    assert exporter._metrics[TTFT.key].observations == [pytest.approx(0.003)]
    [e2e] = exporter._metrics[E2E.key].observations
    assert e2e > 1e6  # arrival at the epoch's start, ended now
    exporter.record(SpeculationStats(rounds=2), 3)
    assert exporter._metrics["requests"].value == 1 and exporter._metrics["rounds"].value == 2


def test_the_stand_in_refuses_buckets_as_the_backend_does(metrics_module):
    family = metrics_module.pb_utils.MetricFamily
    with pytest.raises(ValueError, match="needs buckets"):
        family("h", "", family.HISTOGRAM).Metric(labels={})
    with pytest.raises(ValueError, match="takes no buckets"):
        family("c", "", family.COUNTER).Metric(labels={}, buckets=[1.0])
    with pytest.raises(TypeError, match="not a list"):
        family("h", "", family.HISTOGRAM).Metric(labels={}, buckets=(1.0,))


@pytest.mark.parametrize("kind, buckets", [("histogram", ()), ("counter", (1.0,)), ("histogram", (2.0, 1.0)),
                                           ("histogram", (1.0, 1.0))])
def test_a_histogram_row_needs_increasing_buckets_and_only_a_histogram_has_them(kind, buckets):
    with pytest.raises(ValueError, match="strictly increasing"):
        Metric("x", "specbuild_x", "x", kind=kind, buckets=buckets)
