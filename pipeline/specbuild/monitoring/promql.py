"""PromQL for what an operator watches, each signal written once from the metrics table's names
(:mod:`specbuild.speculation.stats`), for the recording and alerting rules (:mod:`specbuild.monitoring.alert_rules`) and the
dashboard (:mod:`specbuild.monitoring.dashboard`) alike.

Every signal is per release: summed over its replicas ``by (namespace, job)`` (a release has one scrape job: its
PodMonitor's ``<namespace>/<name>`` on Kubernetes, the compose file's job elsewhere), and over the serving model,
whose name is the ``model`` label (``orchestrator``, or ``llmapi_adapter``: the only model exporting ``specbuild_*``).
"""

from __future__ import annotations

from dataclasses import dataclass

from specbuild.speculation.stats import IN_FLIGHT, METRICS, Metric

RELEASE = ("namespace", "job")  # the labels that tell releases apart; every signal keeps them
METRIC = {metric.key: metric for metric in METRICS if metric.label != "source"}
BY_SOURCE = {metric.key: metric for metric in METRICS if metric.label == "source"}  # per draft source, label source


@dataclass(frozen=True)
class Scope:
    """Which series a signal reads: label matchers added to every selector (none: every series Prometheus has)."""

    matchers: tuple[str, ...] = ()  # e.g. ('namespace="llm"', 'job="llm/tiny"'), or ('job=~"$job"',)

    def of(self, name: str, *more: str) -> str:
        """The selector of metric ``name`` within this scope, with ``more`` matchers."""
        inside = ",".join((*self.matchers, *more))
        return f"{name}{{{inside}}}" if inside else name


def by(*labels: str) -> str:
    return f"by ({', '.join(RELEASE + labels)})"


@dataclass(frozen=True)
class Signals:
    """The signals of the releases in ``scope``, rates taken over ``window`` (``5m``, or Grafana's
    ``$__rate_interval``)."""

    scope: Scope = Scope()
    window: str = "5m"

    def rate(self, metric: Metric, *labels: str, name: str | None = None) -> str:
        """Per second, summed per release (and ``labels``)."""
        return f"sum {by(*labels)} (rate({self.scope.of(name or metric.name)}[{self.window}]))"

    def increase(self, metric: Metric) -> str:
        return f"sum {by()} (increase({self.scope.of(metric.name)}[{self.window}]))"

    def per_request(self, metric: Metric) -> str:
        """A request counter as a share of the requests finished (errors, time-outs, ...)."""
        return f"{self.rate(metric)} / {self.rate(METRIC['requests'])}"

    # --- speculation ---------------------------------------------------------------------------------------
    def acceptance(self) -> str:
        """Accepted / drafted tokens, every draft source."""
        return f"{self.rate(METRIC['accepted_tokens'])} / {self.rate(METRIC['drafted_tokens'])}"

    def acceptance_by_source(self) -> str:
        """Accepted / drafted tokens of each draft source (label ``source``: model, lookup)."""
        return (f"{self.rate(BY_SOURCE['accepted_tokens'], 'source')} / "
                f"{self.rate(BY_SOURCE['drafted_tokens'], 'source')}")

    def acceptance_per_position(self) -> str:
        return (f"{self.rate(METRIC['accepted_per_position'], 'position')} / "
                f"{self.rate(METRIC['drafted_per_position'], 'position')}")

    def tokens_per_round(self) -> str:
        """Tokens per target call over every round, drafted or not: 1 + accepted / rounds."""
        return f"1 + {self.rate(METRIC['accepted_tokens'])} / {self.rate(METRIC['rounds'])}"

    def share_of_rounds(self, metric: Metric, *labels: str) -> str:
        """Rounds that ``metric`` counts (drafted ones; one series per source with ``labels`` ``source``) over all
        rounds."""
        rounds = self.rate(METRIC["rounds"])
        if not labels:
            return f"{self.rate(metric)} / {rounds}"
        return f"{self.rate(metric, *labels)} / ignoring({', '.join(labels)}) group_left {rounds}"

    def tokens_by_source(self) -> dict[str, str]:
        """Output tokens per second by where they came from: each draft source's accepted drafts (one series per
        ``source``), and the target's own token of each round."""
        return {"{{source}}": self.rate(BY_SOURCE["accepted_tokens"], "source"),
                "target": f"{self.rate(METRIC['output_tokens'])} - {self.rate(METRIC['accepted_tokens'])}"}

    def seconds_per_round(self, metric: Metric) -> str:
        """Engine seconds (draft or target) per round."""
        return f"{self.rate(metric)} / {self.rate(METRIC['rounds'])}"

    # --- load and latency ----------------------------------------------------------------------------------
    def in_flight(self) -> str:
        return f"sum {by()} ({self.scope.of(IN_FLIGHT.name)})"

    def quantile(self, metric: Metric, q: float) -> str:
        """The ``q`` quantile of a latency histogram, over the window, per release."""
        return f"histogram_quantile({q:g}, {self.rate(metric, 'le', name=metric.name + '_bucket')})"

    def up(self) -> str:
        """1 per replica Prometheus scraped, 0 per replica it could not reach."""
        return self.scope.of("up")

    def replicas(self) -> str:
        """The replicas Prometheus scrapes, per release."""
        return f"count {by()} ({self.up()})"

    def not_serving(self) -> str:
        """The replicas that are unreachable, or reachable without the serving model's metrics (it is not loaded)."""
        return (f"({self.up()} == 0) or ({self.up()} == 1 unless on (job, instance) "
                f"{self.scope.of(IN_FLIGHT.name)})")
