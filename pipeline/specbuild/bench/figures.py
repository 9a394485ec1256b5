"""The math of ``specbuild bench``: traces in, figures out. No I/O here (see :mod:`specbuild.bench.sweep`
for the request loops and :mod:`specbuild.bench.report` for tables and plots).

Definitions follow the field (see docs/benchmarks.md):

* acceptance rate = accepted draft tokens / drafted tokens;
* mean acceptance length (MAL) = tokens per target step = 1 + accepted / drafts (counts the bonus token);
* speedup = output tokens/s at K against K=0 at the same concurrency;
* expected speedup (:func:`specbuild.speculation.cost.expected_speedup`, the one formula) = MAL / (K*c + V(K)), with c = draft cost per token and V(K) = cost of one verification
  call, both in target steps measured at K=0 (Leviathan et al. 2023 assume V = 1; a CPU does not give
  that). Measured, it is computed over every round, drafted or not: (1 + accepted / rounds) / ((draft +
  target seconds) / rounds / K=0 step), which is the same when every round drafts K tokens and stays
  right when some rounds draft nothing (prompt lookup without a match, lookup-only releases). MAL is what
  Leviathan's (1 - a^(K+1)) / (1 - a) predicts for a per-token acceptance ``a``;
  :func:`per_token_acceptance` solves it back for ``a``;
* efficiency = measured / expected: near 1, the draft (acceptance, cost) explains the speed; far below 1,
  time goes outside the engines (orchestration, streaming, queueing);
* with prompt lookup, the totals count both draft sources; lookup share = rounds drafted by lookup / all
  rounds, lookup acceptance = its accepted / its drafted tokens. (The draft cost c then averages over both
  sources, lookup's tokens costing nothing, and V(K) over all rounds, one-token rounds included.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from specbuild.speculation.cost import expected_speedup, per_token_acceptance
from specbuild.speculation.stats import METRICS
from specbuild.speculation.traffic import GREEDY

QUANTILES = (50, 95, 99)

# The orchestrator's Prometheus counters by key (speculation/stats.py owns the names): every unlabelled counter, the
# counters by draft position, and those by draft source (keyed by the SourceStats field they count).
COUNTER_NAMES = {metric.key: metric.name for metric in METRICS if metric.kind == "counter" and metric.label is None}
PER_POSITION = {metric.key: metric.name for metric in METRICS if metric.label == "position"}
BY_SOURCE = {metric.key: metric.name for metric in METRICS if metric.label == "source"}


# --- per request -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestTrace:
    """One streamed request: when each response arrived (seconds from sending) and its new tokens."""

    prompt_index: int
    category: str
    chunk_times: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    total_time: float
    drafted: int = 0
    accepted: int = 0
    text: str = ""
    error: str | None = None

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def _token_chunks(self) -> list[tuple[float, int]]:
        return [(t, n) for t, n in zip(self.chunk_times, self.chunk_tokens) if n > 0]

    @property
    def ttft(self) -> float | None:
        chunks = self._token_chunks
        return chunks[0][0] if chunks else None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (last token time - TTFT) / (tokens - 1)."""
        chunks = self._token_chunks
        if self.output_tokens < 2:
            return None
        return (chunks[-1][0] - chunks[0][0]) / (self.output_tokens - 1)

    def inter_token_latencies(self) -> list[float]:
        """Gaps between tokens: a response carrying n tokens after a gap g counts as n gaps of g/n
        (the first response's extra tokens arrived together with the first token: gaps of 0)."""
        chunks = self._token_chunks
        gaps = [0.0] * (chunks[0][1] - 1) if chunks else []
        for (before, _), (after, tokens) in zip(chunks, chunks[1:]):
            gaps.extend([(after - before) / tokens] * tokens)
        return gaps

    @property
    def rounds(self) -> int:
        """Responses that carried tokens: one per speculative round when streaming."""
        return len(self._token_chunks)


def chunk_tokens(cumulative: Sequence[int | None]) -> list[int]:
    """New tokens per response from the running ``output_token_count`` (``None``: no count, so none new)."""
    new, last = [], 0
    for count in cumulative:
        current = last if count is None else count
        new.append(max(0, current - last))
        last = max(last, current)
    return new


def percentiles(values: Iterable[float | None], quantiles: Sequence[int] = QUANTILES) -> dict[str, float | None]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of the values that are not None (None when there are none)."""
    data = np.array([v for v in values if v is not None], dtype=float)
    return {f"p{q}": (float(np.percentile(data, q)) if data.size else None) for q in quantiles}


# --- server counters -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Counters:
    """The orchestrator's Prometheus counters (summed over models), or their change over a run: every counter of
    :data:`~specbuild.speculation.stats.METRICS` by its key (``counters.rounds``; 0 when a server does not export
    it), the per-position ones as tuples (``counters.accepted_per_position``) and the per-source ones by source
    (:meth:`source`)."""

    totals: Mapping[str, float] = field(default_factory=dict)
    per_position: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    by_source: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every counter present (0 where none was seen), so equal counts compare equal however they were made."""
        object.__setattr__(self, "totals", {key: float(self.totals.get(key, 0.0)) for key in COUNTER_NAMES})
        object.__setattr__(self, "per_position", {key: tuple(self.per_position.get(key, ())) for key in PER_POSITION})
        object.__setattr__(self, "by_source", {name: {key: float(counts.get(key, 0.0)) for key in BY_SOURCE}
                                               for name, counts in self.by_source.items()})

    @classmethod
    def of(cls, sources: Mapping[str, Mapping[str, float]] | None = None, **values: Any) -> Counters:
        """Counters from their keys (``rounds=40``, ``accepted_per_position=(...)``) and ``sources`` by name."""
        unknown = set(values) - set(COUNTER_NAMES) - set(PER_POSITION)
        unknown |= {key for counts in (sources or {}).values() for key in counts if key not in BY_SOURCE}
        if unknown:
            raise TypeError(f"no such counter: {', '.join(sorted(unknown))}")
        return cls({key: float(value) for key, value in values.items() if key in COUNTER_NAMES},
                   {key: tuple(float(v) for v in value) for key, value in values.items() if key in PER_POSITION},
                   {name: {key: float(value) for key, value in counts.items()}
                    for name, counts in (sources or {}).items()})

    def __getattr__(self, key: str) -> Any:
        if key in COUNTER_NAMES:
            return self.totals.get(key, 0.0)
        if key in PER_POSITION:
            return self.per_position.get(key, ())
        raise AttributeError(f"{type(self).__name__} has no counter {key!r}")

    def as_dict(self) -> dict[str, Any]:
        """Every counter by its key (the per-position ones as lists) and ``by_source``: a JSON report's form."""
        return {**self.totals, **{key: list(value) for key, value in self.per_position.items()},
                "by_source": {name: dict(counts) for name, counts in self.by_source.items()}}

    def source(self, name: str) -> dict[str, float]:
        """What the draft source ``name`` drafted (``drafts``, ``drafted_tokens``, ``accepted_tokens``)."""
        counts = self.by_source.get(name, {})
        return {key: counts.get(key, 0.0) for key in BY_SOURCE}

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[str, Mapping[str, str], float]]) -> Counters:
        """From (sample name, labels, value) triples as a Prometheus text parser yields them."""
        totals_by_name = {name: key for key, name in COUNTER_NAMES.items()}
        positions_by_name = {name: key for key, name in PER_POSITION.items()}
        sources_by_name = {name: key for key, name in BY_SOURCE.items()}
        totals: dict[str, float] = {}
        positions: dict[str, dict[int, float]] = {key: {} for key in PER_POSITION}
        sources: dict[str, dict[str, float]] = {}
        for name, labels, value in samples:
            if name in totals_by_name:
                totals[totals_by_name[name]] = totals.get(totals_by_name[name], 0.0) + value
            elif name in positions_by_name and "position" in labels:
                counts = positions[positions_by_name[name]]
                counts[int(labels["position"])] = counts.get(int(labels["position"]), 0.0) + value
            elif name in sources_by_name and "source" in labels:
                counts = sources.setdefault(labels["source"], {})
                counts[sources_by_name[name]] = counts.get(sources_by_name[name], 0.0) + value
        vectors = {key: tuple(counts.get(i, 0.0) for i in range(max(counts) + 1)) if counts else ()
                   for key, counts in positions.items()}
        return cls(totals, vectors, sources)

    def __sub__(self, before: Counters) -> Counters:
        return self._combine(before, -1.0)

    def __add__(self, other: Counters) -> Counters:
        """Sums of counter deltas: a cell measured in many blocks adds up each block's change."""
        return self._combine(other, 1.0)

    def _combine(self, other: Counters, sign: float) -> Counters:
        totals = {key: getattr(self, key) + sign * getattr(other, key) for key in COUNTER_NAMES}
        vectors = {key: _combine(getattr(self, key), getattr(other, key), sign) for key in PER_POSITION}
        sources = {name: {key: self.source(name)[key] + sign * other.source(name)[key] for key in BY_SOURCE}
                   for name in {*self.by_source, *other.by_source}}
        return Counters(totals, vectors, sources)


def _combine(first: tuple[float, ...], second: tuple[float, ...], sign: float) -> tuple[float, ...]:
    """Element-wise ``first + sign * second`` of per-position counts, trailing zeros dropped."""
    width = max(len(first), len(second))
    padded_first = list(first) + [0.0] * (width - len(first))
    padded_second = list(second) + [0.0] * (width - len(second))
    combined = tuple(a + sign * b for a, b in zip(padded_first, padded_second))
    while combined and combined[-1] == 0:
        combined = combined[:-1]
    return combined


def acceptance_per_position(counters: Counters) -> list[float]:
    """Accepted / drafted at each draft position; from servers without the drafted-per-position counter,
    accepted / drafts (exact only when every round drafts the same K)."""
    if counters.drafted_per_position:
        return [_ratio(a, d) for a, d in zip(counters.accepted_per_position, counters.drafted_per_position)]
    return [a / counters.drafts for a in counters.accepted_per_position] if counters.drafts else []


# --- one cell of the sweep (one K, one concurrency) -------------------------------------------------------
CellKey = tuple[int, bool, bool, int, str]  # (k, adaptive, lookup, concurrency, sampling profile)


@dataclass
class KindFigures:
    """One kind of prompt (a category) within a cell, from its requests: tokens per request-second (each request's
    own time, so kinds sharing a block do not blur), acceptance from the responses' draft counts, tokens per round
    (one streamed response per round); ``speedup`` against the same kind at K=0, set by :func:`compare`."""

    requests: int
    output_tokens: int
    request_seconds: float
    tokens_per_second: float
    acceptance_rate: float | None
    tokens_per_round: float | None
    speedup: float | None = None


def kind_figures(traces: Sequence[RequestTrace]) -> dict[str, KindFigures]:
    """:class:`KindFigures` of the finished requests, by category."""
    by_kind: dict[str, list[RequestTrace]] = {}
    for trace in traces:
        if trace.error is None:
            by_kind.setdefault(trace.category, []).append(trace)
    figures = {}
    for kind, done in by_kind.items():
        tokens, seconds = sum(t.output_tokens for t in done), sum(t.total_time for t in done)
        figures[kind] = KindFigures(len(done), tokens, seconds, tokens / seconds if seconds > 0 else 0.0,
                                    _ratio(sum(t.accepted for t in done), sum(t.drafted for t in done)),
                                    _ratio(tokens, sum(t.rounds for t in done)))
    return figures


def cell_label(k: int, adaptive: bool = False, lookup: bool = False, sampling: str = GREEDY) -> str:
    """``K=2+adaptive+lookup``, with `` t0.7`` after it for a sampled cell (:mod:`specbuild.speculation.traffic`)."""
    return f"K={k}{'+adaptive' if adaptive else ''}{'+lookup' if lookup else ''}{'' if sampling == GREEDY else ' ' + sampling}"


@dataclass
class Cell:
    """The figures of one (K, adaptive, lookup, concurrency, sampling) run; comparison fields are set by
    :func:`compare`."""

    k: int
    concurrency: int
    adaptive: bool
    requests: int
    errors: int
    output_tokens: int
    wall_seconds: float
    tokens_per_second: float
    ttft: dict[str, float | None]
    tpot: dict[str, float | None]
    itl: dict[str, float | None]
    e2e: dict[str, float | None]
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    acceptance_per_position: list[float] = field(default_factory=list)
    draft_tokens_per_round: float | None = None  # the K really used (shorter at the end, or adaptive)
    draft_seconds_per_token: float | None = None
    target_seconds_per_round: float | None = None
    drafted_per_round: float | None = None  # draft tokens over all rounds, drafted or not
    tokens_per_round: float | None = None  # 1 + accepted / rounds, over all rounds
    engine_share: float | None = None  # engine seconds / request seconds
    guide_share: float | None = None  # grammar matcher seconds / request seconds (guided requests only)
    # share of rounds run without drafts because a request's break-even said drafting did not pay, and the
    # requests it switched off (of those the cell sent)
    break_even_share: float | None = None
    break_even_requests: int | None = None
    lookup: bool = False  # prompt lookup on for this cell's requests
    sampling: str = GREEDY  # the cell's sampling profile (speculation.traffic.SAMPLING_PROFILES)
    # by draft source (model, lookup): "share" of all rounds it drafted, "acceptance" of its own tokens
    sources: dict[str, dict[str, float | None]] = field(default_factory=dict)
    source: str = "requests"  # where acceptance came from: "metrics" or "requests"
    matches_baseline: float | None = None  # share of prompts whose text equals K=0's (greedy)
    latencies: dict[str, list[float]] = field(default_factory=dict)  # per request, for distribution plots
    # quantiles of the serving model's latency histograms over the cell (bench.histograms), by metric key
    # (ttft, tpot, e2e, queue); empty when the metrics endpoint was not read
    server_latency: dict[str, dict[str, float | None]] = field(default_factory=dict)
    error_messages: list[str] = field(default_factory=list)  # what the failed requests were told, each once
    by_kind: dict[str, KindFigures] = field(default_factory=dict)  # per prompt category, from the requests
    # set by compare():
    speedup: float | None = None
    cost_ratio: float | None = None
    verify_cost: float | None = None
    per_token_acceptance: float | None = None
    expected_speedup: float | None = None
    expected_speedup_textbook: float | None = None
    efficiency: float | None = None
    # set by match_incumbent() (bench --incumbent): tokens/s over the incumbent release's same cell, and the share
    # of prompts answered with its text (greedy)
    incumbent_ratio: float | None = None
    matches_incumbent: float | None = None

    @property
    def label(self) -> str:
        return cell_label(self.k, self.adaptive, self.lookup, self.sampling)

    @property
    def key(self) -> CellKey:
        return self.k, self.adaptive, self.lookup, self.concurrency, self.sampling

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, **asdict(self)}


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def summarize(k: int, concurrency: int, adaptive: bool, traces: Sequence[RequestTrace], wall_seconds: float,
              counters: Counters | None = None, *, lookup: bool = False, sampling: str = GREEDY,
              server_latency: dict[str, dict[str, float | None]] | None = None) -> Cell:
    """Figures of one cell from its request traces, and the server's counter deltas and latency quantiles over it
    when known."""
    done = [t for t in traces if t.error is None]
    output_tokens = sum(t.output_tokens for t in done)
    cell = Cell(
        k=k, concurrency=concurrency, adaptive=adaptive, lookup=lookup, sampling=sampling, requests=len(done),
        errors=len(traces) - len(done),
        output_tokens=output_tokens, wall_seconds=wall_seconds,
        tokens_per_second=output_tokens / wall_seconds if wall_seconds > 0 else 0.0,
        ttft=percentiles(t.ttft for t in done), tpot=percentiles(t.tpot for t in done),
        itl=percentiles(gap for t in done for gap in t.inter_token_latencies()),
        e2e=percentiles(t.total_time for t in done),
        acceptance_rate=None, mean_acceptance_length=None,
        latencies={"ttft": [t.ttft for t in done if t.ttft is not None],
                   "tpot": [t.tpot for t in done if t.tpot is not None],
                   "e2e": [t.total_time for t in done]},
        error_messages=list(dict.fromkeys(t.error for t in traces if t.error is not None)),
        server_latency=server_latency or {},
        by_kind=kind_figures(traces),
    )
    request_seconds = sum(t.total_time for t in done)
    if counters is not None and counters.rounds > 0:
        cell.source = "metrics"
        cell.acceptance_rate = _ratio(counters.accepted_tokens, counters.drafted_tokens)
        cell.mean_acceptance_length = 1.0 + counters.accepted_tokens / counters.drafts if counters.drafts else 1.0
        cell.acceptance_per_position = acceptance_per_position(counters)
        cell.draft_tokens_per_round = _ratio(counters.drafted_tokens, counters.drafts)
        cell.draft_seconds_per_token = _ratio(counters.draft_seconds, counters.drafted_tokens)
        cell.target_seconds_per_round = counters.target_seconds / counters.rounds
        cell.drafted_per_round = counters.drafted_tokens / counters.rounds
        cell.tokens_per_round = 1.0 + counters.accepted_tokens / counters.rounds
        cell.engine_share = _ratio(counters.draft_seconds + counters.target_seconds, request_seconds)
        cell.guide_share = _ratio(counters.guide_seconds, request_seconds) if counters.guide_seconds else None
        cell.break_even_share = counters.break_even_rounds / counters.rounds
        cell.break_even_requests = int(counters.break_even_requests)
        cell.sources = {name: {"share": counts["drafts"] / counters.rounds,
                               "acceptance": _ratio(counts["accepted_tokens"], counts["drafted_tokens"])}
                        for name, counts in ((name, counters.source(name)) for name in sorted(counters.by_source))
                        if counts["drafts"]}
    else:  # per-request outputs only: one streamed response per round
        drafted = sum(t.drafted for t in done)
        rounds = sum(t.rounds for t in done)
        cell.acceptance_rate = _ratio(sum(t.accepted for t in done), drafted)
        cell.mean_acceptance_length = _ratio(output_tokens, rounds)
    return cell


def compare(cells: Sequence[Cell]) -> list[Cell]:
    """Copies of ``cells`` with speedup, step costs, expectations and efficiency against the K=0 cell of the
    same concurrency and sampling profile (cells without one are returned unchanged)."""
    baselines = {(c.concurrency, c.sampling): c for c in cells if c.k == 0 and not c.adaptive and not c.lookup}
    compared = []
    for cell in cells:
        base = baselines.get((cell.concurrency, cell.sampling))
        if base is None:
            compared.append(cell)
            continue
        cell = replace(cell, speedup=_ratio(cell.tokens_per_second, base.tokens_per_second),
                       by_kind={kind: replace(figures, speedup=_ratio(figures.tokens_per_second,
                                                                      base.by_kind[kind].tokens_per_second))
                                if kind in base.by_kind else figures for kind, figures in cell.by_kind.items()})
        step = base.target_seconds_per_round
        k = cell.draft_tokens_per_round
        if step and k and cell.draft_seconds_per_token is not None \
                and cell.target_seconds_per_round is not None and cell.mean_acceptance_length is not None:
            cell.cost_ratio = cell.draft_seconds_per_token / step
            cell.verify_cost = cell.target_seconds_per_round / step
            cell.per_token_acceptance = per_token_acceptance(cell.mean_acceptance_length, k)
            # Over every round (see the module docstring): MAL and K per drafted round would overstate it.
            tokens, drafted = cell.tokens_per_round or 1.0, cell.drafted_per_round or 0.0
            cell.expected_speedup = expected_speedup(tokens, drafted, cell.cost_ratio, cell.verify_cost)
            cell.expected_speedup_textbook = expected_speedup(tokens, drafted, cell.cost_ratio)
            cell.efficiency = _ratio(cell.speedup or 0.0, cell.expected_speedup)
        compared.append(cell)
    return compared


def served_efficiency(cells: Sequence[Cell], in_process: Sequence[Cell]) -> list[tuple[Cell, float | None]]:
    """Each in-process cell with the served tokens/s of the same cell over its own: what serving keeps of the
    engines' speed (``bench --in-process``)."""
    served = {cell.key: cell for cell in cells}
    return [(cell, _ratio(served[cell.key].tokens_per_second, cell.tokens_per_second) if cell.key in served else None)
            for cell in in_process]


def drift_warnings(cells: Sequence[Cell]) -> list[str]:
    """One warning per cell whose V(K) came out below 1: verifying K+1 tokens cannot cost less than making
    one, so the machine ran faster during that cell than during K=0 and its ratios are not to be trusted."""
    return [f"{cell.label} at concurrency {cell.concurrency}: V(K) = {cell.verify_cost:.2f} < 1 is physically "
            "impossible (verifying K+1 tokens costs at least one target step): the load on this machine changed "
            "between this cell and K=0, so their ratios drifted; rerun on a quieter machine or with more prompts"
            for cell in cells if cell.k and cell.verify_cost is not None and cell.verify_cost < 1.0]


def _same_text(mine: Mapping[int, str], theirs: Mapping[int, str]) -> float | None:
    """The share of the prompts answered in both whose texts are equal (None: none answered in both)."""
    shared = [i for i in mine if i in theirs]
    return sum(mine[i] == theirs[i] for i in shared) / len(shared) if shared else None


def match_incumbent(cells: Sequence[Cell], incumbent: Sequence[Cell], texts: Mapping[CellKey, Mapping[int, str]],
                    incumbent_texts: Mapping[CellKey, Mapping[int, str]]) -> None:
    """Set each cell's ``incumbent_ratio`` (its tokens/s over the incumbent release's same cell) and, greedy,
    ``matches_incumbent`` (the share of its prompts whose text equals the incumbent's): the same target answers
    greedy prompts alike whatever the draft, so a new draft that changes a text is a broken release."""
    theirs = {cell.key: cell for cell in incumbent}
    for cell in cells:
        other = theirs.get(cell.key)
        if other is None:
            continue
        cell.incumbent_ratio = _ratio(cell.tokens_per_second, other.tokens_per_second)
        if cell.sampling == GREEDY:
            cell.matches_incumbent = _same_text(texts.get(cell.key, {}), incumbent_texts.get(cell.key, {}))


def match_baseline(cells: Sequence[Cell], texts: Mapping[CellKey, Mapping[int, str]],
                   baseline: Mapping[int, str] | None = None) -> None:
    """Set each greedy cell's ``matches_baseline``: the share of its prompts whose output equals K=0's (or
    ``baseline``'s: the served greedy K=0 texts, for cells run in process). A sampled cell's stays None: its random
    draws depend on K, so its text is not K=0's.

    ``texts`` maps each cell's :attr:`Cell.key` to {prompt index: output text}.
    """
    for cell in cells:
        if cell.sampling != GREEDY:
            continue
        base = baseline if baseline is not None else texts.get((0, False, False, cell.concurrency, GREEDY), {})
        cell.matches_baseline = _same_text(texts.get(cell.key, {}), base)
