"""bench's reading of the serving model's latency histograms (bench/histograms.py): parsed from the metrics text,
summed over models, subtracted between readings, and quantiles estimated as Prometheus's histogram_quantile does.
test_prometheus_e2e.py checks the estimate against a real Prometheus on the same buckets."""

from __future__ import annotations

import math

import pytest

from specbuild.bench.histograms import Histogram, Latencies
from specbuild.speculation.stats import E2E, LATENCY_METRICS, TTFT

INF = math.inf


def samples_of(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


TEXT = """# HELP specbuild_time_to_first_token_seconds TTFT
# TYPE specbuild_time_to_first_token_seconds histogram
specbuild_time_to_first_token_seconds_count{model="orchestrator"} 10
specbuild_time_to_first_token_seconds_sum{model="orchestrator"} 1.5
specbuild_time_to_first_token_seconds_bucket{model="orchestrator",le="0.1"} 4
specbuild_time_to_first_token_seconds_bucket{model="orchestrator",le="0.5"} 9
specbuild_time_to_first_token_seconds_bucket{model="orchestrator",le="+Inf"} 10
specbuild_time_to_first_token_seconds_bucket{model="other",le="0.1"} 0
specbuild_time_to_first_token_seconds_bucket{model="other",le="0.5"} 1
specbuild_time_to_first_token_seconds_bucket{model="other",le="+Inf"} 2
# TYPE nv_inference_count counter
nv_inference_count{model="target"} 99
"""


def test_buckets_are_read_per_metric_and_summed_over_models():
    latencies = Latencies.from_samples(samples_of(TEXT))
    assert set(latencies.histograms) == {metric.key for metric in LATENCY_METRICS}
    assert latencies.histograms[TTFT.key] == Histogram((0.1, 0.5, INF), (4.0, 10.0, 12.0))
    assert latencies.histograms[E2E.key].count == 0 and latencies.percentiles()[E2E.key]["p50"] is None


@pytest.mark.parametrize("q, expected", [
    (0.25, 0.075),  # rank 3 of 12 in the first bucket: 0 + 0.1 * 3/4
    (0.5, 0.1 + 0.4 * 2 / 6),  # rank 6: 2 of the second bucket's 6
    (0.9, 0.5),  # rank 10.8 falls in +Inf: the highest finite bound
])
def test_quantiles_interpolate_within_a_bucket_as_histogram_quantile(q, expected):
    assert Histogram((0.1, 0.5, INF), (4.0, 10.0, 12.0)).quantile(q) == pytest.approx(expected)


def test_a_histogram_without_inf_or_observations_has_no_quantile():
    assert Histogram((0.1, 0.5), (1.0, 2.0)).quantile(0.5) is None
    assert Histogram((0.1, INF), (0.0, 0.0)).quantile(0.5) is None


def test_counts_forced_monotonic_as_prometheus_does():
    """A bucket below its predecessor (a reading taken mid-update) counts as its predecessor."""
    # rank 6 in the third bucket, above 4 (not 3): 0.5 + 0.5 * 2/4
    assert Histogram((0.1, 0.5, 1.0, INF), (4.0, 3.0, 8.0, 8.0)).quantile(0.75) == pytest.approx(0.75)


def test_readings_subtract_and_add_bucket_by_bucket():
    before = Latencies({TTFT.key: Histogram((0.1, INF), (1.0, 2.0))})
    after = Latencies({TTFT.key: Histogram((0.1, INF), (4.0, 7.0))})
    change = after - before
    assert change.histograms[TTFT.key] == Histogram((0.1, INF), (3.0, 5.0))
    assert (Latencies({}) + change).histograms[TTFT.key] == change.histograms[TTFT.key]
    with pytest.raises(ValueError, match="buckets changed"):
        after - Latencies({TTFT.key: Histogram((0.2, INF), (1.0, 2.0))})
