"""The release gate of ``specbuild bench``: thresholds checked against a bench report. Pure: a report's JSON
(``BenchReport.to_dict()``, or a ``bench.json`` read back) in, a verdict out.

Which cells a threshold applies to: the speculative ones (K > 0), which are what a release serves; K=0 is the
baseline they are measured against (with no K > 0 in the run, every cell). The error rate counts every request
of the run, K=0's and the incumbent release's included. The error-rate check always runs: with no tolerated rate given, one failed request
fails the run (a pipeline must not pass a release that dropped requests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbuild.errors import UsageError
from specbuild.speculation.traffic import GREEDY


class GateThresholds(BaseModel):
    """What a release must measure to pass; ``None`` (or ``False``) leaves a threshold out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_speedup: float | None = Field(None, gt=0, description="each speculative cell's tokens/s at least this "
                                      "many times K=0's at the same concurrency")
    min_acceptance: float | None = Field(None, ge=0, le=1, description="each speculative cell's acceptance rate "
                                         "(accepted / drafted tokens) at least this")
    greedy_identical: bool = Field(False, description="greedy text identical to K=0's on every prompt (the "
                                   "greedy cells; a run needs some: --sampling greedy)")
    max_p95_ms: float | None = Field(None, gt=0, description="each gated cell's end-to-end latency P95 at most "
                                     "this many milliseconds")
    max_error_rate: float = Field(0.0, ge=0, le=1, description="the share of failed requests tolerated over the "
                                  "whole run (0: any failed request fails it)")
    faster_than_incumbent: float | None = Field(None, gt=0, description="each speculative cell's tokens/s at "
                                                "least this many times the incumbent release's same cell (bench "
                                                "--incumbent), every K=0 cell's within this factor of it (the target "
                                                "alone: else the load's noise exceeds the margin), and every greedy "
                                                "cell's text the incumbent's on every prompt")


def parse_thresholds(assignments: Iterable[str]) -> GateThresholds:
    """``["min_speedup=1.1", "greedy_identical"]`` (``--gate`` values) as thresholds; a bare name means true."""
    values: dict[str, Any] = {}
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        values[name.strip()] = value.strip() if sep else True
    try:
        return GateThresholds.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        names = ", ".join(GateThresholds.model_fields)
        raise UsageError(f"invalid --gate {where}: {error['msg']}",
                         f"use NAME=VALUE with NAME one of {names}, e.g. --gate min_acceptance=0.5") from None


@dataclass(frozen=True)
class GateCheck:
    """One threshold against one cell (or the whole run: ``cell`` None)."""

    threshold: str  # the GateThresholds field
    limit: float | bool
    measured: float | None
    passed: bool
    cell: str | None = None  # e.g. "K=2 concurrency 1"
    detail: str = ""

    def sentence(self) -> str:
        where = f"{self.cell}: " if self.cell else ""
        measured = "nothing measured" if self.measured is None else f"{self.measured:.4g}"
        return f"{where}{self.threshold} {measured} (limit {self.limit})" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class GateResult:
    thresholds: GateThresholds
    checks: tuple[GateCheck, ...]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[GateCheck]:
        return [check for check in self.checks if not check.passed]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "thresholds": self.thresholds.model_dump(),
                "failures": [asdict(check) for check in self.failures],
                "checks": [asdict(check) for check in self.checks]}

    def summary(self) -> str:
        """The failures in one line (or that every check passed)."""
        if self.passed:
            return f"gate passed ({len(self.checks)} checks)"
        return "gate failed: " + "; ".join(check.sentence() for check in self.failures)


def _gated_cells(cells: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    speculative = [cell for cell in cells if cell.get("k")]
    return speculative or list(cells)


def _where(cell: Mapping[str, Any]) -> str:
    return f"{cell.get('label', 'K=' + str(cell.get('k')))} concurrency {cell.get('concurrency')}"


def _at_least(threshold: str, limit: float, measured: float | None, cell: Mapping[str, Any], missing: str) -> GateCheck:
    return GateCheck(threshold, limit, measured, measured is not None and measured >= limit, _where(cell),
                 missing if measured is None else "")


def _identity(cell: Mapping[str, Any], threshold: str = "greedy_identical", share_of: str = "matches_baseline",
              other: str = "K=0") -> GateCheck:
    """The share of prompts whose text equals ``other``'s must be 1 (``share_of``: the cell's field holding it, set
    for greedy cells)."""
    share = cell.get(share_of)
    if share is None:
        detail = f"no prompt was answered both by this cell and by {other}"
    elif share < 1.0:
        detail = f"{1 - share:.0%} of the prompts were answered differently from {other}"
    else:
        detail = ""
    return GateCheck(threshold, True, share, share == 1.0, _where(cell), detail)


def evaluate(report: Mapping[str, Any], thresholds: GateThresholds) -> GateResult:
    """Every threshold of ``thresholds`` against the bench ``report`` (its JSON form)."""
    cells: list[Mapping[str, Any]] = list(report.get("cells", []))
    gated = _gated_cells(cells)
    checks: list[GateCheck] = []
    if thresholds.min_speedup is not None:
        checks += [_at_least("min_speedup", thresholds.min_speedup, cell.get("speedup"), cell,
                             "no K=0 cell at this concurrency to compare with") for cell in gated]
    if thresholds.min_acceptance is not None:
        checks += [_at_least("min_acceptance", thresholds.min_acceptance, cell.get("acceptance_rate"), cell,
                             "no draft token was verified") for cell in gated]
    if thresholds.greedy_identical:
        greedy = [cell for cell in gated if cell.get("sampling", GREEDY) == GREEDY]
        checks += [_identity(cell) for cell in greedy] or [
            GateCheck("greedy_identical", True, None, False, None, "the run has no greedy cell: identity is checked on "
                  "greedy answers (sampled ones depend on K), so add --sampling greedy")]
    if thresholds.max_p95_ms is not None:
        for cell in gated:
            p95 = (cell.get("e2e") or {}).get("p95")
            measured = None if p95 is None else p95 * 1000.0
            checks.append(GateCheck("max_p95_ms", thresholds.max_p95_ms, measured,
                                measured is not None and measured <= thresholds.max_p95_ms, _where(cell),
                                "no request finished" if measured is None else ""))
    if thresholds.faster_than_incumbent is not None:
        checks += _against_incumbent(report, cells, gated, thresholds.faster_than_incumbent)
    checks.append(_error_rate(cells + list((report.get("incumbent") or {}).get("cells", [])),
                              thresholds.max_error_rate))
    return GateResult(thresholds, tuple(checks))


def _against_incumbent(report: Mapping[str, Any], cells: Sequence[Mapping[str, Any]],
                       gated: Sequence[Mapping[str, Any]], margin: float) -> list[GateCheck]:
    """Each gated cell at least ``margin`` times as fast as the incumbent's same cell (and each K=0 cell as fast
    within the margin, see :func:`_steady`), and each greedy cell with the incumbent's text on every prompt
    (``incumbent_ratio``, ``matches_incumbent``)."""
    if not report.get("incumbent"):
        return [GateCheck("faster_than_incumbent", margin, None, False, None, "the run measured no incumbent: "
                          "pass --incumbent with the release in service")]
    checks = [_steady(cell, margin) for cell in cells if not cell.get("k")]
    checks += [_at_least("faster_than_incumbent", margin, cell.get("incumbent_ratio"), cell,
                         "the incumbent has no such cell") for cell in gated]
    greedy = [cell for cell in cells if cell.get("sampling", GREEDY) == GREEDY]
    checks += [_identity(cell, "faster_than_incumbent", "matches_incumbent", "the incumbent") for cell in greedy]
    if not greedy:
        checks.append(GateCheck("faster_than_incumbent", True, None, False, None, "the run has no greedy cell to "
                                "compare texts on: add --sampling greedy"))
    return checks


def _steady(cell: Mapping[str, Any], margin: float) -> GateCheck:
    """A K=0 cell (the target alone, which a new draft does not change) must measure the incumbent's speed within
    the margin: if the machine's load moves it further, the run cannot tell a gain of that margin from noise."""
    ratio = cell.get("incumbent_ratio")
    low, high = sorted((margin, 1 / margin))
    steady = ratio is not None and low <= ratio <= high
    detail = "" if steady else ("the incumbent has no such cell" if ratio is None else
                                f"the target alone measured {ratio:.2f}x the incumbent's, outside {low:.2f}-"
                                f"{high:.2f}: the load moved more than the margin, so a gain of it is noise here; "
                                "rerun on a quiet machine or with more --requests")
    return GateCheck("faster_than_incumbent", margin, ratio, steady, _where(cell), detail)


def _error_rate(cells: Sequence[Mapping[str, Any]], limit: float) -> GateCheck:
    """Failed requests over the whole run, with what the first failures were told."""
    failed = sum(int(cell.get("errors") or 0) for cell in cells)
    sent = failed + sum(int(cell.get("requests") or 0) for cell in cells)
    rate = failed / sent if sent else None
    messages = list(dict.fromkeys(message for cell in cells for message in cell.get("error_messages") or []))
    detail = f"{failed} of {sent} requests failed" if sent else "no request was sent"
    if messages:
        detail += ": " + "; ".join(messages[:3]) + (f" (and {len(messages) - 3} more)" if len(messages) > 3 else "")
    return GateCheck("max_error_rate", limit, rate, rate is not None and rate <= limit, None, detail)
