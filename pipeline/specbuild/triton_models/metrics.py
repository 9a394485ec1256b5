"""The metrics of :data:`specbuild.speculation.stats.METRICS` on Triton's metrics endpoint (python backend
metrics API), for the models that serve a release's requests (the orchestrator, the LLM-API adapter)."""

from __future__ import annotations

from typing import Any

import triton_python_backend_utils as pb_utils

from specbuild.speculation.stats import IN_FLIGHT, METRICS, SPECULATION_METRICS, SpeculationStats


class Metrics:
    """The metrics of :data:`specbuild.speculation.stats.METRICS` on Triton's metrics endpoint (the families
    are kept: the python backend deletes a metric with its family)."""

    def __init__(self, model_name: str) -> None:
        self._labels = {"model": model_name}
        # looked up here: the python backend provides MetricFamily once the model runs, not when it is imported
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE}
        self._families = {metric.name: pb_utils.MetricFamily(name=metric.name, description=metric.description,
                                                             kind=kinds[metric.kind])
                          for metric in METRICS}
        # the unlabelled series by key (request totals are counted by it); labelled ones made as they appear
        self._metrics = {metric.key: self._families[metric.name].Metric(labels=self._labels)
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

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        self.count("requests")
        self.count("output_tokens", output_tokens)
        for metric in SPECULATION_METRICS:
            for labels, value in metric.series(stats):
                if not labels:
                    self.count(metric.key, value)
                    continue
                series = (metric.name, tuple(sorted(labels.items())))
                if series not in self._labelled:
                    self._labelled[series] = self._families[metric.name].Metric(labels={**self._labels, **labels})
                if value:
                    self._labelled[series].increment(value)
