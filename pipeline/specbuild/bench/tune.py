"""``specbuild tune``: sweep K (and adaptive K) on a workload, pick the best for a goal, and make it the
release's default: ``speculation.num_draft_tokens`` / ``speculation.adaptive`` in the spec file, then the
repository re-packaged from that spec (the orchestrator's ``num_draft_tokens`` / ``adaptive_draft``
parameters, validated configs and a new manifest; engines are unchanged, so only packaging re-runs).
Prompt lookup is not swept: every cell runs with the spec's own ``speculation.prompt_lookup.enabled``, so
the choice is measured as the release serves it. Every setting runs under each sampling profile of the traffic mix
the release expects (``speculation.traffic``, or ``--traffic``, which is then written too): the choice is the best
for the mix (each profile's score weighted by its share) and the break-even's prior (``measured_acceptance``) is the
mix's acceptance, since a draft's acceptance under sampling differs from its greedy one.

With ``concurrency_schedule`` it measures K per load instead (:func:`tune_schedule`): the best fixed K at each of
:data:`TUNED_LOADS`, on a copy of the release packaged without its load policy (so each cell drafts the
K it asks for), written as ``speculation.draft_len_schedule`` (K falling, or staying, as load rises), its K at one
request in flight as ``num_draft_tokens``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from specbuild.bench.figures import Cell
from specbuild.errors import SpecError, UsageError
from specbuild.spec import load_spec
from specbuild.spec_rendering import yaml_scalar
from specbuild.speculation.schedule import TUNED_LOADS
from specbuild.speculation.traffic import GREEDY, checked_mix

Goal = Literal["latency", "throughput"]
CANDIDATE_KS = (0, 1, 2, 3, 4, 6, 8)


def candidate_ks(max_draft_len: int) -> tuple[int, ...]:
    """The K values worth trying up to the engine's limit."""
    return tuple(k for k in CANDIDATE_KS if k <= max_draft_len)


def release_max_draft_len(repository: str | Path) -> int:
    """The most draft tokens a request to the release in ``repository`` may ask for: its target engine's build
    record, as the server reads it (the spec file may have changed since the release was built)."""
    from specbuild.package.contract import TARGET_MODEL
    from specbuild.package.manifest import read_release

    release = read_release(repository)
    record = release.build_info.get(TARGET_MODEL)
    if record is None:
        raise UsageError(f"the release in {repository} records no {TARGET_MODEL} engine, so its max_draft_len is "
                         "unknown", "compile it again (specbuild compile) before tuning it")
    return record.limits.max_draft_len


def score(cell: Cell, goal: Goal) -> float | None:
    """Higher is better: output tokens/s for throughput, minus the median end-to-end latency for latency."""
    if goal == "throughput":
        return cell.tokens_per_second
    median = cell.e2e.get("p50")
    return None if median is None else -median


def pick(cells: Sequence[Cell], goal: Goal, mix: Mapping[str, float] | None = None) -> Cell:
    """The best setting for ``goal`` over the traffic ``mix`` (default: greedy alone), as its cell of the mix's
    largest profile: among the settings (K, adaptive, lookup, concurrency) whose every profile's cell finished every
    request and (greedy) answered as K=0 did, so a faster but wrong setting can never win, the highest score
    weighted by the profiles' shares."""
    mix = mix or {GREEDY: 1.0}
    by_setting: dict[tuple[Any, ...], dict[str, Cell]] = {}
    for cell in cells:
        by_setting.setdefault(cell.key[:4], {})[cell.sampling] = cell
    scores = {}
    for setting, profiles in by_setting.items():
        mixed = [profiles.get(name) for name in mix]
        if all(c is not None and c.requests and not c.errors and c.matches_baseline in (None, 1.0)
               and score(c, goal) is not None for c in mixed):
            scores[setting] = sum(share * score(c, goal) for share, c in zip(mix.values(), mixed))  # type: ignore
    if not scores:
        raise UsageError("no setting finished its requests cleanly, so none can be chosen",
                         "read the bench table above and the server log")
    best = max(scores, key=lambda setting: (scores[setting], -setting[0]))  # ties: the smaller K
    return by_setting[best][max(mix, key=lambda name: mix[name])]


def set_section_values(text: str, section: str, values: dict[str, Any]) -> str:
    """``text`` (a YAML mapping) with ``section.key`` set for each of ``values``, editing only those values
    (scalars, or collections written in flow style) so that the user's comments and layout stay; missing keys
    and sections are added."""
    root = yaml.compose(text) if text.strip() else None
    if root is not None and not isinstance(root, yaml.MappingNode):
        raise SpecError("the spec file does not hold a mapping at the top level", "see `specbuild init`")
    entries = dict((key.value, value) for key, value in root.value) if root is not None else {}
    block = entries.get(section)
    if block is None:
        lines = [f"{section}:"] + [f"  {key}: {yaml_scalar(value)}" for key, value in values.items()]
        return text + ("" if not text or text.endswith("\n") else "\n") + "\n".join(lines) + "\n"
    if not isinstance(block, yaml.MappingNode) or block.flow_style or not block.value:
        raise SpecError(f"{section!r} in the spec file is not a block mapping of keys",
                        f"write {section} as indented 'key: value' lines")
    items = {key.value: value for key, value in block.value}
    edits: list[tuple[int, int, str]] = []
    missing = []
    for key, value in values.items():
        node = items.get(key)
        if isinstance(node, yaml.ScalarNode) or (isinstance(node, yaml.CollectionNode) and node.flow_style):
            edits.append((node.start_mark.index, node.end_mark.index, yaml_scalar(value)))
        else:
            missing.append(f"{key}: {yaml_scalar(value)}")
    if missing:  # as the section's first lines: after its last key may come a nested block (prompt_lookup)
        first_key = block.value[0][0].start_mark
        at = first_key.index - first_key.column
        edits.append((at, at, "".join(f"{' ' * first_key.column}{line}\n" for line in missing)))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def load_schedule(cells: Sequence[Cell], goal: Goal, mix: Mapping[str, float] | None = None) -> dict[int, int]:
    """K per load from cells at several concurrencies: the best K for the traffic ``mix`` at each (:func:`pick`),
    never above the K chosen at a lower load (a K that rose with load would be measurement noise, and the orchestrator drafts less as load
    rises), as ``{concurrency: K}`` where K changes, from concurrency 1 (or the least measured) on."""
    schedule: dict[int, int] = {}
    for concurrency in sorted({cell.concurrency for cell in cells}):
        best = pick([cell for cell in cells if cell.concurrency == concurrency], goal, mix).k
        previous = list(schedule.values())[-1] if schedule else None
        if previous is None or best < previous:
            schedule[concurrency] = best
    return schedule


def measured_verify_cost(cells: Sequence[Cell]) -> dict[int, float]:
    """V(K) as the bench measured it through the server, per fixed K (adaptive cells vary K round by round), at least
    1: a verification cheaper than a step is the load drifting between cells (bench warns of it), not a cost."""
    return {cell.k: round(max(1.0, cell.verify_cost), 3) for cell in _fixed_k(cells)}


def measured_costs(cells: Sequence[Cell], mix: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The release's cost model as the bench measured it through the server (the spec's ``speculation`` keys):
    V(K) per fixed K and c as the medians over those cells (greedy where measured: costs of the machine, not of the
    traffic), the per-token acceptance as each profile's median weighted by its share of the traffic ``mix``
    (default: greedy alone); empty: none measured."""
    mix = mix or {GREEDY: 1.0}
    fixed = _fixed_k(cells)
    costed = [cell for cell in fixed if cell.sampling == GREEDY] or fixed
    acceptance = {name: [cell.per_token_acceptance or 0.0 for cell in fixed if cell.sampling == name] for name in mix}
    if not fixed or not all(acceptance.values()):
        return {}
    return {"verify_cost": measured_verify_cost(costed),
            "draft_cost": round(float(statistics.median(cell.cost_ratio or 0.0 for cell in costed)), 4),
            "measured_acceptance": round(sum(share * float(statistics.median(acceptance[name]))
                                             for name, share in mix.items()), 3)}


def _fixed_k(cells: Sequence[Cell]) -> list[Cell]:
    return [cell for cell in cells if cell.k and not cell.adaptive and cell.verify_cost is not None]


def write_choice(spec_path: str | Path, num_draft_tokens: int, adaptive: bool,
                 measured: dict[str, Any] | None = None, schedule: dict[int, int] | None = None,
                 traffic: Mapping[str, float] | None = None) -> None:
    """Set the choice (and the cost model measured, its V(K) over those measured before: :func:`measured_costs`;
    K per load, ``schedule``, replacing a ``busy_in_flight``; the traffic mix it was chosen for, where given) in the
    spec file (atomically), then check that the file still validates."""
    path = Path(spec_path)
    original = path.read_text(encoding="utf-8")
    current = load_spec(path).speculation
    values: dict[str, Any] = {"num_draft_tokens": num_draft_tokens, "adaptive": adaptive, **(measured or {}),
                              **({"traffic": dict(traffic)} if traffic is not None else {})}
    if values.get("verify_cost"):
        values["verify_cost"] = {**current.verify_cost, **values["verify_cost"]}
    if schedule is not None:
        values["draft_len_schedule"] = schedule
        if current.busy_in_flight is not None:  # its simplest case: the schedule replaces it
            values["busy_in_flight"] = None
    updated = set_section_values(original, "speculation", values)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(updated)
    try:
        load_spec(temporary)
    except BaseException:
        os.unlink(temporary)
        raise
    os.replace(temporary, path)


@dataclass
class TuneResult:
    report: Any  # bench_runner.BenchReport
    choice: Cell
    spec_path: Path
    compiled: Any  # compiler.CompileResult, None when --dry-run
    schedule: dict[int, int] | None = None  # K per load (tune_schedule), {concurrency: K}
    mix: dict[str, float] = field(default_factory=lambda: {GREEDY: 1.0})  # the traffic mix it was chosen for


def tune(spec_path: str | Path, goal: Goal, prompts: Sequence[Any], *, ks: Sequence[int] | None = None,
         adaptive: Sequence[bool] = (False, True), concurrency: int | None = None, max_tokens: int = 64,
         requests: int = 8, max_seconds: float = 300.0, url: str | None = None, write: bool = True,
         traffic: Mapping[str, float] | None = None, console: Any = None) -> TuneResult:
    """Benchmark the release of ``spec_path`` (on a server started on its repository, or the one at
    ``url``) under each profile of the traffic mix (``traffic``, else the spec's), choose the best setting for
    ``goal`` on that mix, and (``write``) make it the spec's and repository's default."""
    from specbuild import compiler
    from specbuild.bench.sweep import BenchPlan, bench_server, repository_tokenizer, run_bench

    spec = load_spec(spec_path)
    mix = _mix(spec, traffic)
    repository = Path(spec.outputs.repository_dir)
    max_draft_len = _checked_ks(repository, ks)
    plan = BenchPlan(ks=tuple(ks or candidate_ks(max_draft_len)), adaptive=tuple(adaptive),
                     lookup=(spec.speculation.prompt_lookup.enabled,),
                     concurrencies=(concurrency or (1 if goal == "latency" else min(4, spec.limits.max_batch_size)),),
                     max_tokens=max_tokens, requests=requests, max_seconds=max_seconds, samplings=tuple(mix))
    with bench_server(url, None if url else repository) as (grpc_url, metrics_url):
        report = run_bench(grpc_url, prompts, plan, metrics_url=metrics_url,
                           tokenizer_dir=repository_tokenizer(repository), console=console)
    choice = pick(report.cells, goal, mix)
    compiled = None
    if write:
        write_choice(spec_path, choice.k, choice.adaptive, measured_costs(report.cells, mix),
                     traffic=mix if traffic is not None else None)
        compiled = compiler.run(load_spec(spec_path), console=console)
    return TuneResult(report=report, choice=choice, spec_path=Path(spec_path), compiled=compiled, mix=mix)


def _mix(spec: Any, traffic: Mapping[str, float] | None) -> dict[str, float]:
    """The traffic mix to tune for: ``traffic`` (checked), else the spec's."""
    if traffic is None:
        return dict(spec.speculation.traffic)
    try:
        return checked_mix(traffic)
    except ValueError as exc:
        raise UsageError(str(exc), "e.g. --traffic greedy=0.5,t0.7=0.5") from None


def _checked_ks(repository: Path, ks: Sequence[int] | None) -> int:
    """The release's max_draft_len, after refusing a K in ``ks`` above it."""
    max_draft_len = release_max_draft_len(repository)
    too_long = [k for k in ks or () if k > max_draft_len]
    if too_long:
        raise UsageError(f"K={too_long[0]} is above the engine's max_draft_len ({max_draft_len})",
                         "choose K values up to max_draft_len, or rebuild with a larger one")
    return max_draft_len


def tune_schedule(spec_path: str | Path, goal: Goal, prompts: Sequence[Any], *, ks: Sequence[int] | None = None,
                  concurrencies: Sequence[int] = TUNED_LOADS, max_tokens: int = 64, requests: int = 8,
                  max_seconds: float = 300.0, write: bool = True, traffic: Mapping[str, float] | None = None,
                  console: Any = None) -> TuneResult:
    """Measure K per load: every fixed K at each of ``concurrencies`` (``requests`` per cell, at least one block
    of the level's concurrency; no cell runs on past ``max_seconds``), on a server started on a copy of the
    release packaged without its load policy (engines shared, so only packaging runs); the best for ``goal`` at
    each level makes the schedule (:func:`load_schedule`), and (``write``) it becomes the spec's and repository's,
    with the cost model measured at the lowest level. ``TuneResult.choice``: the best cell at the lowest level."""
    from specbuild import compiler
    from specbuild.bench.sweep import BenchPlan, BenchReport, bench_server, repository_tokenizer, run_bench

    spec = load_spec(spec_path)
    mix = _mix(spec, traffic)
    repository = Path(spec.outputs.repository_dir)
    max_draft_len = _checked_ks(repository, ks)
    candidates = tuple(ks or candidate_ks(max_draft_len))
    unloaded = spec.model_copy(update={
        "speculation": spec.speculation.model_copy(update={"busy_in_flight": 0, "draft_len_schedule": None})})
    reports = []
    with tempfile.TemporaryDirectory(prefix=".tune-", dir=repository.parent) as scratch:
        measuring = unloaded.model_copy(update={"outputs": unloaded.outputs.model_copy(
            update={"repository_dir": str(Path(scratch) / repository.name)})})
        measured_on = compiler.run(measuring, console=console).repository
        with bench_server(None, measured_on) as (grpc_url, metrics_url):
            for level in sorted(set(concurrencies)):
                plan = BenchPlan(ks=candidates, concurrencies=(level,), max_tokens=max_tokens,
                                 requests=max(requests, level), max_seconds=max_seconds,
                                 lookup=(spec.speculation.prompt_lookup.enabled,), samplings=tuple(mix))
                reports.append(run_bench(grpc_url, prompts, plan, metrics_url=metrics_url,
                                         tokenizer_dir=repository_tokenizer(measured_on), console=console))
    cells = [cell for report in reports for cell in report.cells]
    first = reports[0]
    report = BenchReport(plan=first.plan.model_copy(update={"concurrencies": tuple(sorted(set(concurrencies))),
                                                            "requests": requests}),
                         url=first.url, prompts=first.prompts, cells=cells, metrics=first.metrics,
                         environment=first.environment, warnings=[w for r in reports for w in r.warnings])
    schedule = load_schedule(cells, goal, mix)
    choice = pick(first.cells, goal, mix)
    compiled = None
    if write:
        write_choice(spec_path, choice.k, False, measured_costs(first.cells, mix), schedule,
                     traffic=mix if traffic is not None else None)
        compiled = compiler.run(load_spec(spec_path), console=console)
    return TuneResult(report=report, choice=choice, spec_path=Path(spec_path), compiled=compiled, schedule=schedule,
                      mix=mix)
