"""Acceptance statistics: what one request (or, summed, many) drafted and accepted, and the Prometheus counters
the orchestrator exports them as. This module owns the names: the orchestrator writes these counters and
``specbuild bench`` reads them back (:class:`specbuild.bench.metrics.Counters`). Names follow vLLM's
``spec_decode`` metrics.
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
    fallbacks: int = 0  # requests that went on with the target alone because the draft model failed
    unspeculated: int = 0  # requests that asked for drafts but ran by the target alone: their sampling penalties
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
    or what a gauge measures); with ``label`` ``position`` one series per draft position (a list field), with
    ``source`` one per draft source, ``key`` then naming the :class:`SourceStats` field."""

    key: str
    name: str
    description: str
    label: Literal["position", "source"] | None = None
    kind: Literal["counter", "gauge"] = "counter"

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
    Metric("fallbacks", "specbuild_draft_fallbacks_total",
           "Requests that fell back to the target alone because the draft failed"),
    Metric("unspeculated", "specbuild_unspeculated_requests_total",
           "Requests that asked for drafts but ran by the target alone: their sampling penalties"),
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
METRICS = REQUEST_METRICS + SPECULATION_METRICS + (IN_FLIGHT,)
