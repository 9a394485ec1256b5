"""The metrics of :data:`specbuild.speculation.stats.METRICS` on Triton's metrics endpoint (python backend
metrics API), for the models that serve a release's requests (the orchestrator, the LLM-API adapter)."""

from __future__ import annotations

from typing import Any

import triton_python_backend_utils as pb_utils

from specbuild.speculation.stats import IN_FLIGHT, METRICS, SpeculationStats


class Metrics:
    """The metrics of :data:`specbuild.speculation.stats.METRICS` on Triton's metrics endpoint (the families
    are kept: the python backend deletes a metric with its family)."""

    def __init__(self, model_name: str) -> None:
        self._labels = {"model": model_name}
        # looked up here: the python backend provides MetricFamily once the model runs, not when it is imported
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE}
        self._families = {metric.key: pb_utils.MetricFamily(name=metric.name, description=metric.description,
                                                            kind=kinds[metric.kind])
                          for metric in METRICS}
        self._metrics = {metric.key: self._families[metric.key].Metric(labels=self._labels)
                         for metric in METRICS if not metric.per_position}
        self._per_position: dict[tuple[str, int], Any] = {}
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

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        self.count("requests")
        self.count("output_tokens", output_tokens)
        for metric in METRICS:
            value = getattr(stats, metric.key, None)
            if value is None:
                continue
            if not metric.per_position:
                self.count(metric.key, value)
                continue
            for position, count in enumerate(value):
                if (metric.key, position) not in self._per_position:
                    labels = dict(self._labels, position=str(position))
                    self._per_position[metric.key, position] = self._families[metric.key].Metric(labels=labels)
                if count:
                    self._per_position[metric.key, position].increment(count)
