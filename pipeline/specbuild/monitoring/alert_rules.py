"""Prometheus recording and alerting rules for a release: a Prometheus rule file's ``groups``, written as a plain
rule file (``specbuild monitoring``, for the compose setup) and as the ``spec`` of a Prometheus Operator
``PrometheusRule`` (``specbuild deploy``). docs/deployment.md ("Alerts") says what each alert means and what to do.

Recording rules keep the five-minute figures the alerts and a team's own dashboards read (acceptance, tokens per
round, the latency quantiles, error and time-out shares) under Prometheus's ``level:metric:operations`` names;
every alert has a ``severity`` label and ``summary``, ``description`` and ``runbook`` (what to check first)
annotations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbuild.errors import UsageError
from specbuild.monitoring.promql import METRIC, Scope, Signals
from specbuild.runtimes.registry import runtime_for
from specbuild.spec import BuildSpec
from specbuild.speculation.stats import LATENCY_METRICS, TTFT, Metric

WINDOW = "5m"  # what the recording rules average over
QUANTILES = (0.5, 0.95, 0.99)
# Acceptance below which speculation is assumed to cost more than it saves. By speculation.cost.expected_speedup, a
# draft costing a tenth of a target step per token, at K=4 with verification costing 1.2 steps, breaks even at an
# acceptance of 0.15 ((1 + 4a) / (4 * 0.1 + 1.2) = 1); 0.2 leaves a margin. The release's own break-even comes from
# its cost model once the release records one; until then, `deploy --min-acceptance`.
DEFAULT_MIN_ACCEPTANCE = 0.2
DEFAULT_ERROR_SHARE = 0.05  # of finished requests
DEFAULT_TIMEOUT_SHARE = 0.05


@dataclass(frozen=True)
class AlertThresholds:
    """Where the alerts fire; ``ttft_p95_seconds`` defaults to the release's runtime's
    (:attr:`~specbuild.runtimes.interface.Runtime.ttft_p95_seconds`)."""

    ttft_p95_seconds: float
    min_acceptance: float = DEFAULT_MIN_ACCEPTANCE
    error_share: float = DEFAULT_ERROR_SHARE
    timeout_share: float = DEFAULT_TIMEOUT_SHARE

    def __post_init__(self) -> None:
        for name, value, flag in (("min_acceptance", self.min_acceptance, "--min-acceptance"),
                                  ("error_share", self.error_share, None),
                                  ("timeout_share", self.timeout_share, None)):
            if not 0 < value < 1:
                raise UsageError(f"{name} must lie between 0 and 1 (a share), got {value}",
                                 f"pass {flag or name} as a fraction, e.g. 0.2")
        if not self.ttft_p95_seconds > 0:
            raise UsageError(f"the p95 TTFT threshold must be positive, got {self.ttft_p95_seconds}",
                             "pass --ttft-p95 SECONDS above 0")


def release_thresholds(spec: BuildSpec, *, min_acceptance: float | None = None,
                       ttft_p95_seconds: float | None = None) -> AlertThresholds:
    """The thresholds for the release ``spec`` describes: those given, else the defaults (its runtime's p95 TTFT)."""
    ttft = runtime_for(spec.runtime).ttft_p95_seconds if ttft_p95_seconds is None else ttft_p95_seconds
    return AlertThresholds(ttft_p95_seconds=ttft,
                           min_acceptance=DEFAULT_MIN_ACCEPTANCE if min_acceptance is None else min_acceptance)


@dataclass(frozen=True)
class Alert:
    """One alerting rule: ``signal`` is what it watches (a dashboard can plot it; it has a series whenever the
    release is scraped), ``expr`` when it fires."""

    name: str
    signal: str
    expr: str
    duration: str  # ``for:``: how long ``expr`` must hold
    severity: str
    summary: str
    description: str
    runbook: str

    def rule(self) -> dict[str, Any]:
        return {"alert": self.name, "expr": self.expr, "for": self.duration, "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary, "description": self.description, "runbook": self.runbook}}


def record_name(what: str, operation: str = f"rate{WINDOW}") -> str:
    """A recording rule's name: ``specbuild:<what>:<operation>``."""
    return f"specbuild:{what}:{operation}"


def _base(metric: Metric) -> str:
    return metric.name.removeprefix("specbuild_")


def quantile_record(metric: Metric, q: float) -> str:
    return record_name(_base(metric), f"p{round(q * 100)}_rate{WINDOW}")


ACCEPTANCE = record_name("acceptance_rate")
ERROR_SHARE = record_name("request_errors", f"ratio_rate{WINDOW}")
TIMEOUT_SHARE = record_name("timed_out_requests", f"ratio_rate{WINDOW}")


def recording_rules(scope: Scope) -> dict[str, str]:
    """The recorded series by name, each with its expression."""
    signals = Signals(scope, WINDOW)
    records = {
        record_name("requests"): signals.rate(METRIC["requests"]),
        record_name("output_tokens"): signals.rate(METRIC["output_tokens"]),
        ACCEPTANCE: signals.acceptance(),
        record_name("acceptance_rate_per_position"): signals.acceptance_per_position(),
        record_name("tokens_per_round"): signals.tokens_per_round(),
        record_name("speculation_share"): signals.share_of_rounds(METRIC["drafts"]),
        ERROR_SHARE: signals.per_request(METRIC["errors"]),
        TIMEOUT_SHARE: signals.per_request(METRIC["timed_out"]),
    }
    records.update({quantile_record(metric, q): signals.quantile(metric, q) for metric in LATENCY_METRICS
                    for q in QUANTILES})
    return records


def alerts(scope: Scope, thresholds: AlertThresholds) -> list[Alert]:
    """The alerts of the releases in ``scope`` (they read the recorded series of :func:`recording_rules`)."""
    signals = Signals(scope, WINDOW)
    acceptance, errors, timeouts = scope.of(ACCEPTANCE), scope.of(ERROR_SHARE), scope.of(TIMEOUT_SHARE)
    ttft = scope.of(quantile_record(TTFT, 0.95))
    fallbacks = Signals(scope, "10m").increase(METRIC["fallbacks"])
    release = "{{ $labels.job }}"
    return [
        Alert("SpecbuildAcceptanceLow", acceptance, f"{acceptance} < {thresholds.min_acceptance:g}", "15m", "warning",
              f"{release}: {{{{ $value | humanizePercentage }}}} of drafted tokens accepted, below "
              f"{thresholds.min_acceptance:.0%}",
              "Speculation costs more than it saves: every request is slower than the target alone would be, while "
              "the output stays correct (verification keeps it exact), so nothing else shows it.",
              "Check first that the draft is the one the release was built with (specbuild verify on the release), "
              "then the requests (sampled ones at a high temperature accept less); meanwhile lower K (re-package with "
              "--set speculation.num_draft_tokens=N, 0 for the target alone, or have clients send num_draft_tokens)."),
        Alert("SpecbuildDraftFallbacks", fallbacks, f"{fallbacks} > 0", "2m", "warning",
              f"{release}: {{{{ $value | humanize }}}} draft fallbacks in 10 minutes",
              "The draft model failed (an error from its engine), so requests went on with the target alone: "
              "exact, but without speculation's speedup, for a while after each failure.",
              "Check first the server log for 'draft model failed' and the draft model's own errors "
              "(nv_inference_request_failure{model=\"draft\"}): a crashed or unloaded draft, or its memory."),
        Alert("SpecbuildRequestErrors", errors, f"{errors} > {thresholds.error_share:g}", "5m", "critical",
              f"{release}: {{{{ $value | humanizePercentage }}}} of requests fail",
              "Requests are rejected or fail: bad input a client keeps sending, or an engine returning errors.",
              "Check first whether an engine fails (the server log's 'request failed' lines; the target's and "
              "draft's nv_inference_request_failure) or a client sends invalid requests (the error it gets back "
              "names the input; the engines' failures stay flat)."),
        Alert("SpecbuildRequestTimeouts", timeouts, f"{timeouts} > {thresholds.timeout_share:g}", "10m", "warning",
              f"{release}: {{{{ $value | humanizePercentage }}}} of requests stopped at their time limit",
              "Requests reach their deadline (max_time, or the release's triton.max_request_seconds) before "
              "their answer is complete: the server is too slow for the load, or clients ask for too long answers.",
              "Check first the requests in flight against the replicas (the autoscaler at its maximum?) and the "
              "end-to-end latency; then raise replicas or lower max_tokens."),
        Alert("SpecbuildTTFTHigh", ttft, f"{ttft} > {thresholds.ttft_p95_seconds:g}", "10m", "warning",
              f"{release}: p95 time to first token {{{{ $value | humanizeDuration }}}}, above "
              f"{thresholds.ttft_p95_seconds:g}s",
              "The slowest twentieth of requests wait longer than the SLO for their first token.",
              "Check first the queue time before the first round and the requests in flight (more load than the "
              "replicas serve: scale out), then the prompt lengths (prefill grows with them)."),
        Alert("SpecbuildServerNotReady", signals.up(), signals.not_serving(), "10m", "critical",
              "{{ $labels.job }} replica {{ $labels.instance }} does not serve",
              "A replica cannot be scraped, or its serving model's metrics are missing: the server is down, or "
              "the model that answers requests is not loaded.",
              "Check first the pod's state and the server log's first error (a failed model load names the model "
              "and why); readiness /v2/health/ready stays false until every model is loaded."),
        Alert("SpecbuildNoReplicas", signals.replicas(), f"absent({signals.up()})", "10m", "critical",
              "{{ with $labels.job }}{{ . }}: {{ end }}no replica is scraped",
              "Prometheus finds no target to scrape: the deployment has no pods, or its scrape selection (the "
              "PodMonitor's labels, the compose file's target) matches none.",
              "Check first that the server runs (kubectl get pods -l app.kubernetes.io/instance=NAME, or docker "
              "compose ps) and that your Prometheus selects the PodMonitor (deploy --monitor-label)."),
    ]


def rule_groups(scope: Scope, thresholds: AlertThresholds) -> list[dict[str, Any]]:
    """The rule file's ``groups`` (a ``PrometheusRule``'s ``spec.groups`` too)."""
    return [
        {"name": "specbuild.recording", "rules": [{"record": name, "expr": expr}
                                                  for name, expr in recording_rules(scope).items()]},
        {"name": "specbuild.alerts", "rules": [alert.rule() for alert in alerts(scope, thresholds)]},
    ]

