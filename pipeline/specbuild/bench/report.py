"""The outputs of ``specbuild bench``: terminal tables, JSON, Markdown and PNG plots of a
:class:`~specbuild.bench.sweep.BenchReport`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.table import Table

from specbuild.bench.figures import Cell, served_efficiency
from specbuild.errors import UsageError
from specbuild.speculation.stats import E2E, QUEUE, TPOT, TTFT, Metric
from specbuild.speculation.traffic import GREEDY, describe_profiles

Column = tuple[str, Callable[[Cell], str]]


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _milliseconds(seconds: float | None) -> str:
    """Whole milliseconds, or two significant digits below 10 ms (a queue time is a fraction of one)."""
    if seconds is None:
        return "-"
    milliseconds = seconds * 1000
    return f"{milliseconds:.0f}" if milliseconds >= 10 else f"{milliseconds:.2g}"


def _ms(values: dict[str, float | None]) -> str:
    return " / ".join(_milliseconds(values.get(q)) for q in ("p50", "p95", "p99"))


def _sources(cell: Cell) -> str:
    """Each draft source's share of rounds and its own acceptance, e.g. ``lookup 25%/0.55 model 50%/0.41``."""
    return " ".join(f"{name} {figures['share']:.0%}/{_num(figures['acceptance'], 2)}"
                    for name, figures in cell.sources.items()) or "-"


def _positions(cell: Cell, shown: int = 4) -> str:
    values = [f"{v:.2f}" for v in cell.acceptance_per_position[:shown]]
    return " ".join(values) + (" ..." if len(cell.acceptance_per_position) > shown else "") if values else "-"


SPEED_COLUMNS: list[Column] = [
    ("K", lambda c: c.label.removeprefix("K=")),
    ("conc.", lambda c: str(c.concurrency)),
    ("requests", lambda c: f"{c.requests}" + (f" ({c.errors} failed)" if c.errors else "")),
    ("tok/s", lambda c: _num(c.tokens_per_second, 1)),
    ("speedup", lambda c: _num(c.speedup, 2, "x")),
    ("expected", lambda c: _num(c.expected_speedup, 2, "x")),
    ("textbook V=1", lambda c: _num(c.expected_speedup_textbook, 2, "x")),
    ("effic.", lambda c: _num(c.efficiency, 2)),
    ("accept", lambda c: _num(c.acceptance_rate, 2)),
    ("MAL", lambda c: _num(c.mean_acceptance_length, 2)),
    ("sources", _sources),
    ("per position", _positions),
    ("c", lambda c: _num(c.cost_ratio, 3)),
    ("V(K)", lambda c: _num(c.verify_cost, 2)),
    ("engine share", lambda c: _num(c.engine_share, 2)),
    ("guide share", lambda c: _num(c.guide_share, 3)),
    ("break-even off", lambda c: "-" if c.break_even_share is None
     else f"{c.break_even_requests} req, {c.break_even_share:.0%} of rounds"),
    ("=K0 text", lambda c: "-" if c.matches_baseline is None else f"{c.matches_baseline:.0%}"),
]
def _server(metric: Metric) -> Column:
    """A column of the serving model's histogram ``metric`` over the cell (``-`` without the metrics endpoint)."""
    return (f"server {metric.key.upper()} ms p50/p95/p99", lambda c: _ms(c.server_latency.get(metric.key, {})))


LATENCY_COLUMNS: list[Column] = [
    ("K", lambda c: c.label.removeprefix("K=")),
    ("conc.", lambda c: str(c.concurrency)),
    ("TTFT ms p50/p95/p99", lambda c: _ms(c.ttft)),
    ("TPOT ms p50/p95/p99", lambda c: _ms(c.tpot)),
    ("ITL ms p50/p95/p99", lambda c: _ms(c.itl)),
    ("E2E ms p50/p95/p99", lambda c: _ms(c.e2e)),
    *(_server(metric) for metric in (TTFT, TPOT, E2E, QUEUE)),
]


# Left out of the terminal table to keep it narrow (they are in the Markdown and JSON reports).
MARKDOWN_ONLY = {"requests", "textbook V=1", "per position", "engine share", "guide share", _server(TPOT)[0],
                 _server(E2E)[0]}


KIND_COLUMNS = ("kind", "K", "conc.", "requests", "tok/s", "speedup", "accept", "tokens/round")


def kind_rows(cells: Sequence[Cell]) -> list[tuple[str, ...]]:
    """One row per kind of prompt and cell, when the prompts are of more than one kind: a speedup that shows only on
    some kinds is read here, not averaged into the overall one."""
    kinds = sorted({kind for cell in cells for kind in cell.by_kind})
    if len(kinds) < 2:
        return []
    return [(kind, cell.label.removeprefix("K="), str(cell.concurrency), str(figures.requests),
             _num(figures.tokens_per_second, 1), _num(figures.speedup, 2, "x"), _num(figures.acceptance_rate, 2),
             _num(figures.tokens_per_round, 2))
            for kind in kinds for cell in cells if (figures := cell.by_kind.get(kind)) is not None]


SERVED_PATH_COLUMNS = ("K", "served tok/s", "in process tok/s", "served / in process", "speedup served",
                       "speedup in process", "a served / in process", "c served / in process",
                       "V(K) served / in process", "= served K0 text")


def served_path_rows(report: Any) -> list[tuple[str, ...]]:
    """``bench --in-process``: per concurrency-1 cell, the served figures beside the same release's in process."""
    served = {cell.key: cell for cell in report.cells}

    def pair(cell: Cell, figure: Callable[[Cell], float | None], digits: int = 2) -> str:
        return f"{_num(figure(served[cell.key]), digits)} / {_num(figure(cell), digits)}"

    return [(cell.label.removeprefix("K="), _num(served[cell.key].tokens_per_second, 1),
             _num(cell.tokens_per_second, 1), _num(efficiency, 2, "x"), pair(cell, lambda c: c.speedup),
             _num(cell.speedup, 2, "x"), pair(cell, lambda c: c.per_token_acceptance),
             pair(cell, lambda c: c.cost_ratio), pair(cell, lambda c: c.verify_cost),
             "-" if cell.matches_baseline is None else f"{cell.matches_baseline:.0%}")
            for cell, efficiency in served_efficiency(report.cells, report.in_process) if cell.key in served]


def served_path_table(report: Any) -> list[Table]:
    """The served path's table, when the report has in-process cells."""
    return _table("the served path against the same release in process (concurrency 1)", SERVED_PATH_COLUMNS,
                  served_path_rows(report))


INCUMBENT_COLUMNS = ("K", "conc.", "tok/s", "incumbent tok/s", "x incumbent", "accept", "incumbent accept",
                     "= incumbent text")


def incumbent_rows(report: Any) -> list[tuple[str, ...]]:
    """``bench --incumbent``: per cell, this release's figures beside the incumbent release's same cell."""
    if report.incumbent is None:
        return []
    theirs = {cell.key: cell for cell in report.incumbent.cells}
    return [(cell.label.removeprefix("K="), str(cell.concurrency), _num(cell.tokens_per_second, 1),
             _num(other.tokens_per_second, 1), _num(cell.incumbent_ratio, 2, "x"), _num(cell.acceptance_rate, 2),
             _num(other.acceptance_rate, 2),
             "-" if cell.matches_incumbent is None else f"{cell.matches_incumbent:.0%}")
            for cell in report.cells if (other := theirs.get(cell.key)) is not None]


def _table(title: str, columns: Sequence[str], rows: Sequence[tuple[str, ...]]) -> list[Table]:
    """A right-aligned table of ``rows`` (none when there are no rows)."""
    if not rows:
        return []
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*row)
    return [table]


def incumbent_table(report: Any) -> list[Table]:
    return _table("against the incumbent release (interleaved, same prompts)", INCUMBENT_COLUMNS,
                  incumbent_rows(report))


def tables(cells: Sequence[Cell]) -> list[Table]:
    """Rich tables: speed and acceptance, latency, and (prompts of several kinds) speed by kind."""
    result = []
    speed = [column for column in SPEED_COLUMNS if column[0] not in MARKDOWN_ONLY]
    latency = [column for column in LATENCY_COLUMNS if column[0] not in MARKDOWN_ONLY]
    for title, columns in (("speed and acceptance", speed), ("latency (streamed)", latency)):
        table = Table(title=title, title_justify="left")
        for name, _ in columns:
            table.add_column(name, justify="right" if name not in ("per position",) else "left")
        for cell in cells:
            table.add_row(*(render(cell) for _, render in columns))
        result.append(table)
    if rows := kind_rows(cells):
        table = Table(title="by kind of prompt (tokens per request-second)", title_justify="left")
        for name in KIND_COLUMNS:
            table.add_column(name, justify="left" if name == "kind" else "right")
        for row in rows:
            table.add_row(*row)
        result.append(table)
    return result


def max_tokens_line(report: Any) -> str:
    """What the requests asked for: the one max_tokens, or the range of the captured records' own."""
    fewest, most = report.max_tokens_sent
    return f"max_tokens {most}" if fewest == most else f"max_tokens: each record's own ({fewest}-{most})"


def markdown(report: Any) -> str:
    """The report as Markdown: conditions, then the two tables."""
    plan, env = report.plan, report.environment
    lines = [
        "# specbuild bench", "",
        f"- server: `{report.url}`, counters from the metrics endpoint: {'yes' if report.metrics else 'no'}",
        f"- {report.prompts} prompts, {plan.requests} requests per cell (no new round after {plan.max_seconds:g} s), "
        f"{max_tokens_line(report)}, {describe_profiles(plan.samplings)}, "
        "streaming",
        f"- machine: {env.get('machine')} ({env.get('cpu_model') or 'CPU model unknown'}), {env.get('cpus')} CPUs, load average {env.get('load_average')}, "
        f"{env.get('date')}",
        "- cells interleaved: at each concurrency C, every cell runs each block of C prompts in turn, in an "
        "order rotating from block to block", "",
    ]
    lines += [f"**Warning:** {warning}" for warning in report.warnings] + ([""] if report.warnings else [])
    for title, columns in (("Speed and acceptance", SPEED_COLUMNS), ("Latency", LATENCY_COLUMNS)):
        lines += [f"## {title}", "", "| " + " | ".join(name for name, _ in columns) + " |",
                  "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(render(cell) for _, render in columns) + " |" for cell in report.cells]
        lines.append("")
    if rows := served_path_rows(report):
        lines += ["## The served path against the same release in process", "",
                  "| " + " | ".join(SERVED_PATH_COLUMNS) + " |", "|" + "---|" * len(SERVED_PATH_COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", "Concurrency 1. In process: the release's preprocessing, orchestrator code and engines (loaded as "
                  "its engine models load them) in the bench's process, each block right after the server ran it; "
                  "served / in process is what serving keeps of the engines' speed (Triton, BLS calls, the "
                  "postprocessing model, the stream, processes sharing the cores). a = per-token acceptance, "
                  "c and V(K) as above.", ""]
    if rows := incumbent_rows(report):
        lines += ["## Against the incumbent release", "", f"The incumbent served at `{report.incumbent.url}`, every "
                  "cell's blocks run on both releases back to back (which first alternating); x incumbent = tokens/s "
                  "over the incumbent's same cell; = incumbent text: the share of greedy prompts answered with its "
                  "text.", "", "| " + " | ".join(INCUMBENT_COLUMNS) + " |", "|" + "---|" * len(INCUMBENT_COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += [f"**Warning (incumbent):** {warning}" for warning in report.incumbent.warnings]
        lines.append("")
    if rows := kind_rows(report.cells):
        lines += ["## By kind of prompt", "", "| " + " | ".join(KIND_COLUMNS) + " |", "|" + "---|" * len(KIND_COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", "Per kind, tokens per request-second (each request's own end-to-end time) and the speedup "
                  "against the same kind at K=0; acceptance and tokens per round from the responses' draft counts.",
                  ""]
    lines += ["MAL = 1 + accepted / drafts (tokens per target step); per position = accepted at that position "
              "per draft; c = draft seconds per token and V(K) = target seconds per round, both over the K=0 target "
              "step; expected = MAL / (K*c + V(K)) (textbook: V = 1); efficiency = speedup / expected; engine "
              "share = engine seconds / request seconds (guide share: the grammar matchers' part of it, guided "
              "requests only); sources = rounds each draft source (model, lookup) drafted / "
              "all rounds, then its own acceptance (its accepted / drafted tokens; acceptance and MAL count every "
              "source). Latency: TTFT to E2E as the client saw them; the server columns are quantiles of the "
              "serving model's histograms over the cell's requests ("
              + ", ".join(f"`{metric.name}`" for metric in (TTFT, TPOT, E2E, QUEUE))
              + "), estimated as Prometheus's histogram_quantile does (linear within a bucket), so they match a "
              "dashboard's; QUEUE is the time before a request's first round.", ""]
    return "\n".join(lines)


def plots(cells: Sequence[Cell], out_dir: Path) -> list[Path]:
    """speedup.png (measured and expected against K), acceptance.png (rate and per position against K),
    latency.png (TTFT, TPOT and end-to-end distributions per cell)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("matplotlib is not installed, so no plots can be drawn",
                         "pip install 'specbuild[bench]', or pass --no-plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    levels = sorted({c.concurrency for c in cells})
    # One line per concurrency, sampling profile and prompt lookup setting (K=0 starts each), adaptive K left out.
    series = [(f"concurrency {level}{'' if sampling == GREEDY else ', ' + sampling}{', lookup' if lookup else ''}",
               sorted((c for c in cells if c.concurrency == level and c.sampling == sampling and not c.adaptive
                       and (c.lookup == lookup or not c.k)), key=lambda c: c.k))
              for level in levels for sampling in dict.fromkeys(c.sampling for c in cells)
              for lookup in sorted({c.lookup for c in cells})]

    figure, axis = plt.subplots(figsize=(6, 4))
    for name, row in series:
        axis.plot([c.k for c in row], [c.speedup or 0 for c in row], "o-", label=f"measured, {name}")
        expected = [c for c in row if c.expected_speedup is not None]
        axis.plot([c.k for c in expected], [c.expected_speedup for c in expected], "x--", label=f"expected, {name}")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set(xlabel="K (draft tokens per round)", ylabel="speedup vs K=0", title="Speedup against K")
    axis.legend(fontsize="small")
    written.append(_save(figure, out_dir / "speedup.png"))

    figure, (rate_axis, position_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for name, row in series:
        drafted = [c for c in row if c.k]
        rate_axis.plot([c.k for c in drafted], [c.acceptance_rate or 0 for c in drafted], "o-", label=name)
    for cell in (c for c in cells if c.k and c.acceptance_per_position and c.concurrency == levels[0]):
        positions = range(1, len(cell.acceptance_per_position) + 1)
        position_axis.plot(list(positions), cell.acceptance_per_position, "o-", label=cell.label)
    rate_axis.set(xlabel="K", ylabel="accepted / drafted", title="Acceptance rate", ylim=(0, 1))
    position_axis.set(xlabel="draft position", ylabel="accepted per draft", ylim=(0, 1),
                      title=f"Acceptance per position (concurrency {levels[0]})")
    for axis in (rate_axis, position_axis):
        axis.legend(fontsize="small")
    written.append(_save(figure, out_dir / "acceptance.png"))

    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    labels = [f"{c.label}\nc={c.concurrency}" for c in cells]
    for axis, (key, title) in zip(axes, (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end-to-end"))):
        data = [[v * 1000 for v in c.latencies.get(key, [])] or [float("nan")] for c in cells]
        axis.boxplot(data, whis=(5, 95))
        axis.set_xticks(range(1, len(cells) + 1), labels, fontsize="x-small")
        axis.set(ylabel="ms", title=f"{title} (whiskers P5-P95)")
    written.append(_save(figure, out_dir / "latency.png"))
    return written


def _save(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_outputs(report: Any, out_dir: str | Path, *, with_plots: bool = True) -> list[Path]:
    """bench.json, bench.md and (``with_plots``) the PNG plots, in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench.json"
    json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    markdown_path = out / "bench.md"
    markdown_path.write_text(markdown(report), encoding="utf-8")
    return [json_path, markdown_path] + (plots(report.cells, out) if with_plots else [])


def gate_table(verdict: Any) -> Table:
    """The checks of a :class:`~specbuild.bench.gate.GateResult`, one row each."""
    table = Table(title="release gate", title_justify="left")
    for name in ("threshold", "cell", "measured", "limit", "result"):
        table.add_column(name, justify="right" if name in ("measured", "limit") else "left")
    for check in verdict.checks:
        table.add_row(check.threshold, check.cell or "whole run", _num(check.measured, 3), str(check.limit),
                      "[green]pass[/]" if check.passed else f"[bold red]FAIL[/] {check.detail}")
    return table
