"""The metrics of :data:`specbuild.speculation.stats.METRICS` on Triton's metrics endpoint (python backend
metrics API), for the models that serve a release's requests (the orchestrator, the LLM-API adapter).

Histograms use the python backend's ``MetricFamily.HISTOGRAM`` kind (triton-inference-server/python_backend
``src/metric_family.cc`` and ``src/pb_stub.cc``, added in r24.08 and unchanged through r26.04, so in Triton 2.51 here
and the 26.04 NGC image): a histogram's buckets are given per metric, as a list, and it is fed with ``observe``.
"""

from __future__ import annotations

import time
from typing import Any

import triton_python_backend_utils as pb_utils

from specbuild.speculation.stats import (E2E, IN_FLIGHT, METRICS, QUEUE, TPOT, TTFT, SpeculationStats,
                                        request_samples)

NS = 1e-9


def request_latencies(*, arrival_ns: int, scheduled_ns: int, first_token_ns: int, last_token_ns: int,
                      output_tokens: int, end_ns: int) -> dict[str, float]:
    """What the latency histograms observe for one request row (epoch ns in, seconds out, by metric key): TTFT and
    TPOT only once there are tokens to time (TPOT from the second token on)."""
    values = {QUEUE.key: (scheduled_ns - arrival_ns) * NS, E2E.key: (end_ns - arrival_ns) * NS}
    if output_tokens and first_token_ns:
        values[TTFT.key] = (first_token_ns - arrival_ns) * NS
    if output_tokens > 1 and first_token_ns:
        values[TPOT.key] = (last_token_ns - first_token_ns) * NS / (output_tokens - 1)
    return {key: max(0.0, value) for key, value in values.items()}


class Metrics:
    """The metrics of :data:`specbuild.speculation.stats.METRICS` on Triton's metrics endpoint (the families
    are kept: the python backend deletes a metric with its family)."""

    def __init__(self, model_name: str) -> None:
        self._labels = {"model": model_name}
        # looked up here: the python backend provides MetricFamily once the model runs, not when it is imported
        family = pb_utils.MetricFamily
        kinds = {"counter": family.COUNTER, "gauge": family.GAUGE, "histogram": family.HISTOGRAM}
        self._families = {metric.name: family(name=metric.name, description=metric.description, kind=kinds[metric.kind])
                          for metric in METRICS}
        # the unlabelled series by key (request totals are counted by it; the backend takes a histogram's buckets
        # as a list, and only for a histogram); labelled ones made as they appear
        self._metrics = {metric.key: self._families[metric.name].Metric(
            labels=self._labels, **({"buckets": list(metric.buckets)} if metric.buckets else {}))
            for metric in METRICS if metric.label is None}
        self._labelled: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._in_flight = 0

    def count(self, key: str, value: float = 1.0) -> None:
        if value:
            self._metrics[key].increment(value)

    def in_flight(self, change: int) -> None:
        """Requests started (+1) or finished (-1): the ``specbuild_requests_in_flight`` gauge."""
        self._in_flight += change
        self._metrics[IN_FLIGHT.key].set(self._in_flight)

    @property
    def requests_in_flight(self) -> int:
        """What the ``specbuild_requests_in_flight`` gauge shows now."""
        return self._in_flight

    def observe_latencies(self, *, arrival_ns: int, scheduled_ns: int, first_token_ns: int, last_token_ns: int,
                          output_tokens: int) -> None:
        """A row that ended now (before its last response goes): its latencies into the histograms."""
        for key, seconds in request_latencies(arrival_ns=arrival_ns, scheduled_ns=scheduled_ns,
                                              first_token_ns=first_token_ns, last_token_ns=last_token_ns,
                                              output_tokens=output_tokens, end_ns=time.time_ns()).items():
            self._metrics[key].observe(seconds)

    def observe(self, key: str, value: float) -> None:
        """One observation of the histogram ``key`` (a row's capture time)."""
        self._metrics[key].observe(value)

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        for metric, labels, value in request_samples(stats, output_tokens):
            if not labels:
                self.count(metric.key, value)
                continue
            series = (metric.name, tuple(sorted(labels.items())))
            if series not in self._labelled:
                self._labelled[series] = self._families[metric.name].Metric(labels={**self._labels, **labels})
            if value:
                self._labelled[series].increment(value)
