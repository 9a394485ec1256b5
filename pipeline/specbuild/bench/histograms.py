"""The serving model's latency histograms (:data:`specbuild.speculation.stats.LATENCY_METRICS`) as ``specbuild
bench`` reads them: cumulative bucket counts from the metrics endpoint summed over models, their change over a run,
and quantiles estimated the way Prometheus's ``histogram_quantile`` estimates them (prometheus/prometheus
``promql/quantile.go``, ``bucketQuantile``, v2.42 to v3: linear within the bucket holding the rank, 0 as the lowest
bucket's lower bound, the highest finite bound when the rank falls in the ``+Inf`` bucket), so that bench's
server-side figures are the ones a dashboard shows for the same requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from specbuild.bench.figures import QUANTILES
from specbuild.speculation.stats import LATENCY_METRICS


@dataclass(frozen=True)
class Histogram:
    """One histogram: cumulative counts at increasing upper bounds (``+Inf`` last), or their change over a run."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) as ``histogram_quantile`` estimates it; None without observations."""
        if len(self.bounds) < 2 or not math.isinf(self.bounds[-1]) or self.count <= 0:
            return None
        counts, highest = [], 0.0
        for count in self.counts:  # monotonic, as Prometheus forces it
            highest = max(highest, count)
            counts.append(highest)
        rank = q * counts[-1]
        index = next(i for i, count in enumerate(counts[:-1] + [math.inf]) if count >= rank)
        if index == len(counts) - 1:
            return self.bounds[-2]
        if index == 0 and self.bounds[0] <= 0:
            return self.bounds[0]
        start = self.bounds[index - 1] if index else 0.0
        below = counts[index - 1] if index else 0.0
        inside = counts[index] - below  # > 0 but at q = 0 over an empty first bucket
        return start + (self.bounds[index] - start) * (rank - below) / inside if inside else start

    def combine(self, other: Histogram, sign: float) -> Histogram:
        """``self + sign * other`` bucket by bucket (an empty histogram takes the other's bounds)."""
        if not other.bounds:
            return self
        if not self.bounds:
            return Histogram(other.bounds, tuple(sign * count for count in other.counts))
        if self.bounds != other.bounds:
            raise ValueError(f"histogram buckets changed between readings: {self.bounds} and {other.bounds}")
        return Histogram(self.bounds, tuple(a + sign * b for a, b in zip(self.counts, other.counts)))


@dataclass(frozen=True)
class Latencies:
    """The latency histograms by metric key (``ttft``, ``tpot``, ``e2e``, ``queue``), or their change over a run."""

    histograms: Mapping[str, Histogram]

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[str, Mapping[str, str], float]]) -> Latencies:
        """From (sample name, labels, value) triples as a Prometheus text parser yields them (``_bucket`` samples;
        the other series are ignored)."""
        keys = {f"{metric.name}_bucket": metric.key for metric in LATENCY_METRICS}
        buckets: dict[str, dict[float, float]] = {metric.key: {} for metric in LATENCY_METRICS}
        for name, labels, value in samples:
            if name in keys and "le" in labels:
                by_bound = buckets[keys[name]]
                bound = float(labels["le"])
                by_bound[bound] = by_bound.get(bound, 0.0) + value
        return cls({key: Histogram(tuple(sorted(counts)), tuple(counts[bound] for bound in sorted(counts)))
                    for key, counts in buckets.items()})

    def __sub__(self, before: Latencies) -> Latencies:
        return self._combine(before, -1.0)

    def __add__(self, other: Latencies) -> Latencies:
        return self._combine(other, 1.0)

    def _combine(self, other: Latencies, sign: float) -> Latencies:
        empty = Histogram((), ())
        return Latencies({key: self.histograms.get(key, empty).combine(other.histograms.get(key, empty), sign)
                          for key in self.histograms.keys() | other.histograms.keys()})

    def percentiles(self, quantiles: tuple[int, ...] = QUANTILES) -> dict[str, dict[str, float | None]]:
        """``{"ttft": {"p50": ..., "p95": ..., "p99": ...}, ...}`` (None where a histogram observed nothing)."""
        return {key: {f"p{q}": histogram.quantile(q / 100) for q in quantiles}
                for key, histogram in sorted(self.histograms.items())}
