"""Acceptance statistics: what one request (or, summed, many) drafted and accepted, and the Prometheus metrics
the orchestrator exports them as (counters, the in-flight gauge, latency histograms). This module owns the names:
the orchestrator writes these metrics, ``specbuild bench`` reads them back (:class:`specbuild.bench.figures.Counters`,
:mod:`specbuild.bench.histograms`), and the alerting rules and dashboard query them (:mod:`specbuild.monitoring`).
Names follow vLLM's (``spec_decode`` counters, request latency histograms).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal


@dataclass
class SourceStats:
    """What one draft source (its :attr:`~specbuild.speculation.drafting.Draft.source` name) drafted."""

    drafts: int = 0  # rounds it proposed the draft of
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def __iadd__(self, other: SourceStats) -> SourceStats:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))
        return self


@dataclass
class SpeculationStats:
    """Acceptance and timing of one request (or, summed with ``+=``, of many)."""

    rounds: int = 0  # target calls
    drafts: int = 0  # rounds that verified at least one draft token
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    guide_seconds: float = 0.0  # in the grammar matcher (a guided request's masks and proposal checks)
    fallbacks: int = 0  # requests that went on with the target alone because the draft model failed
    # requests whose context outgrew the draft model's window: the rest drafted by prompt lookup, or the target alone
    draft_window: int = 0
    unspeculated: int = 0  # requests that asked for drafts but ran by the target alone: their sampling penalties
    guided_target_only: int = 0  # the same, for a guide the target engine applies itself (drafting.draft_sources)
    break_even_requests: int = 0  # requests whose break-even switched drafting off at least once
    break_even_rounds: int = 0  # rounds run without drafts because the request's break-even said they do not pay
    probe_rounds: int = 0  # rounds run without drafts to measure the target-alone step (speculation.round_costs)
    load_rounds: int = 0  # rounds whose K the load policy (draft_len_schedule) lowered, to 0 included
    by_source: dict[str, SourceStats] = field(default_factory=dict)  # the totals above, by who proposed the draft

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target step over speculative rounds: 1 + accepted / drafts (counts the bonus token)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    def source(self, name: str) -> SourceStats:
        """What the source called ``name`` drafted (nothing yet: zeros)."""
        return self.by_source.get(name, SourceStats())

    def record_round(self, drafted: int, accepted: int, *, source: str | None = None) -> None:
        """A round that verified ``drafted`` tokens proposed by ``source`` and accepted ``accepted`` of them."""
        self.rounds += 1
        if drafted == 0:
            return
        self.drafts += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if source is not None:
            self.by_source.setdefault(source, SourceStats()).__iadd__(SourceStats(1, drafted, accepted))
        for counts, upto in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            counts.extend([0] * (upto - len(counts)))
            for position in range(upto):
                counts[position] += 1

    def __iadd__(self, other: SpeculationStats) -> SpeculationStats:
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for position, count in enumerate(theirs):
                    mine[position] += count
            elif isinstance(mine, dict):
                for name, counts in theirs.items():
                    mine.setdefault(name, SourceStats()).__iadd__(counts)
            else:
                setattr(self, item.name, mine + theirs)
        return self


@dataclass(frozen=True)
class Metric:
    """One Prometheus metric: ``key`` is the :class:`SpeculationStats` field a counter counts (or a request total,
    or what a gauge measures, or the latency a histogram observes); with ``label`` ``position`` one series per draft
    position (a list field), with ``source`` one per draft source, ``key`` then naming the :class:`SourceStats`
    field."""

    key: str
    name: str
    description: str
    label: Literal["position", "source"] | None = None
    kind: Literal["counter", "gauge", "histogram"] = "counter"
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds (seconds), increasing; +Inf is implied

    def __post_init__(self) -> None:
        if (self.kind == "histogram") != bool(self.buckets) or list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"{self.name}: a histogram and only a histogram has buckets, strictly increasing")

    def series(self, stats: SpeculationStats) -> list[tuple[dict[str, str], float]]:
        """This metric's series in ``stats``: (labels, value) pairs; empty for a request total."""
        if self.label == "source":
            return [({"source": name}, getattr(counts, self.key)) for name, counts in stats.by_source.items()]
        value = getattr(stats, self.key, None)
        if value is None:
            return []
        if self.label == "position":
            return [({"position": str(position)}, count) for position, count in enumerate(value)]
        return [({}, value)]


REQUEST_METRICS = (
    Metric("requests", "specbuild_requests_total", "Generation requests finished by the orchestrator"),
    Metric("output_tokens", "specbuild_output_tokens_total", "Tokens generated"),
    Metric("errors", "specbuild_request_errors_total", "Requests rejected or failed"),
    Metric("cancelled", "specbuild_cancelled_requests_total", "Requests whose client went away before the end"),
    Metric("timed_out", "specbuild_timed_out_requests_total",
           "Requests stopped at their deadline (max_time, or the server's max_request_seconds)"),
)
SPECULATION_METRICS = (
    Metric("rounds", "specbuild_spec_decode_rounds_total", "Target calls (speculative rounds)"),
    Metric("drafts", "specbuild_spec_decode_num_drafts_total", "Rounds with at least one draft token"),
    Metric("drafted_tokens", "specbuild_spec_decode_num_draft_tokens_total", "Draft tokens proposed"),
    Metric("accepted_tokens", "specbuild_spec_decode_num_accepted_tokens_total", "Draft tokens accepted"),
    Metric("accepted_per_position", "specbuild_spec_decode_num_accepted_tokens_per_pos_total",
           "Draft tokens accepted, by position in the draft", label="position"),
    Metric("drafted_per_position", "specbuild_spec_decode_num_draft_tokens_per_pos_total",
           "Draft tokens proposed, by position in the draft", label="position"),
    Metric("draft_seconds", "specbuild_draft_seconds_total", "Time spent in draft calls"),
    Metric("target_seconds", "specbuild_target_seconds_total", "Time spent in target calls"),
    Metric("guide_seconds", "specbuild_guide_seconds_total",
           "Time spent in grammar matchers (guided decoding: masks, counted in the engine calls' time too, proposal "
           "checks and advancing)"),
    Metric("fallbacks", "specbuild_draft_fallbacks_total",
           "Requests that fell back to the target alone because the draft failed"),
    Metric("draft_window", "specbuild_draft_window_requests_total",
           "Requests whose context outgrew the draft model's window (its engine's max_seq_len): from there they "
           "drafted by prompt lookup only, or ran on the target alone"),
    Metric("unspeculated", "specbuild_unspeculated_requests_total",
           "Requests that asked for drafts but ran by the target alone: their sampling penalties"),
    Metric("guided_target_only", "specbuild_guided_target_only_requests_total",
           "Guided requests that asked for drafts but ran by the target alone: TensorRT-LLM's executor applies "
           "the guide and takes no draft tokens with it"),
    Metric("break_even_requests", "specbuild_break_even_requests_total",
           "Requests whose drafting the per-request break-even switched off at least once (it did not pay)"),
    Metric("break_even_rounds", "specbuild_break_even_rounds_total",
           "Rounds run without drafts because the request's break-even said drafting does not pay"),
    Metric("probe_rounds", "specbuild_break_even_probe_rounds_total",
           "Rounds run without drafts to measure what a target-alone step costs on this host, for the break-even"),
    Metric("load_rounds", "specbuild_load_schedule_rounds_total",
           "Rounds whose K the load policy (the release's draft_len_schedule) lowered, to 0 included"),
    Metric("drafts", "specbuild_spec_decode_source_drafts_total",
           "Rounds with at least one draft token, by the source that proposed them (model, lookup)", label="source"),
    Metric("drafted_tokens", "specbuild_spec_decode_source_draft_tokens_total", "Draft tokens proposed, by source",
           label="source"),
    Metric("accepted_tokens", "specbuild_spec_decode_source_accepted_tokens_total", "Draft tokens accepted, by source",
           label="source"),
)
# Requests the orchestrator is serving now: the load signal (Kubernetes autoscaling, load-aware K). The target's own
# "active" count undercounts it: the orchestrator sends the target one request per round, not one per request.
IN_FLIGHT = Metric("in_flight", "specbuild_requests_in_flight", "Generation requests being served by the orchestrator",
                   kind="gauge")
# Request latencies (seconds), observed when a request row ends (finished or at its time limit; a failed or cancelled
# row is counted above, not timed): from its arrival at the serving model to its first token (TTFT), between its
# first and last token per later token (TPOT), to its end (E2E), and before its first round starts (queue; Triton's
# own queue in front of the model is nv_inference_queue_duration_us). One set of bounds serves both a GPU release's
# milliseconds and a CPU release's seconds; quantiles interpolate within a bucket, so the bounds are dense (about a
# factor 1.5 apart) from 10 ms to a few seconds, where both kinds of release answer and SLOs sit, and include the
# runtimes' default p95 TTFT thresholds (2 s, 5 s) so the alert compares at a bound.
LATENCY_METRICS = (
    Metric("ttft", "specbuild_time_to_first_token_seconds", "Time from a request's arrival to its first token",
           kind="histogram", buckets=(0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5,
                                      2.0, 3.0, 5.0, 10.0, 20.0, 60.0)),
    Metric("tpot", "specbuild_time_per_output_token_seconds",
           "Time per output token after the first: (last token - first token) / (tokens - 1)", kind="histogram",
           buckets=(0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
                    2.5)),
    Metric("e2e", "specbuild_e2e_request_latency_seconds", "Time from a request's arrival to its last response",
           kind="histogram", buckets=(0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0,
                                      40.0, 80.0, 160.0, 320.0, 640.0)),
    Metric("queue", "specbuild_request_queue_time_seconds",
           "Time from a request's arrival to the start of its first round", kind="histogram",
           buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)),
)
TTFT, TPOT, E2E, QUEUE = LATENCY_METRICS
# Capture (a release whose spec enables it: capture/store.py): counted as each finished row's record is written or
# dropped, before the row's last response goes; the time is the whole capture path's for that row (the record
# made, its one write), what capture adds to the request.
CAPTURE_METRICS = (
    Metric("captured", "specbuild_capture_records_total", "Finished request rows written to the capture store"),
    Metric("capture_bytes", "specbuild_capture_bytes_total", "Bytes written to the capture store"),
    Metric("capture_drops", "specbuild_capture_dropped_records_total",
           "Records a failed write dropped (disk full, permissions); their requests were served"),
    Metric("capture_seconds", "specbuild_capture_seconds",
           "Time the capture path took for a finished request row (its record made and written)", kind="histogram",
           buckets=(0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                    0.1)),
)
CAPTURE_SECONDS = CAPTURE_METRICS[-1]
METRICS = REQUEST_METRICS + SPECULATION_METRICS + (IN_FLIGHT,) + LATENCY_METRICS + CAPTURE_METRICS


def request_samples(stats: SpeculationStats, output_tokens: int) -> list[tuple[Metric, dict[str, str], float]]:
    """What one finished request adds to the counters of :data:`METRICS`: (metric, labels, value) per series."""
    totals = {metric.key: metric for metric in REQUEST_METRICS}
    return [(totals["requests"], {}, 1.0), (totals["output_tokens"], {}, float(output_tokens))] + [
        (metric, labels, value) for metric in SPECULATION_METRICS for labels, value in metric.series(stats)]

