"""A small incremental runner for the steps of ``specbuild compile``.

Each :class:`Stage` declares its inputs (JSON values and Paths, hashed by content), one output folder and
an action that fills a temporary folder. The runner skips a stage when its fingerprint and its output's
file hashes equal those recorded after its last successful run; otherwise it runs the action inside
:func:`~specbuild.stages.atomic.atomic_output_dir` and records the new stamp only after the rename. A stage's
fingerprint includes the output hashes of every stage before it in the list, so a changed upstream output
re-runs everything downstream, while an upstream re-run that reproduces identical files does not.
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from specbuild.errors import SpecbuildError, StageError, UsageError
from specbuild.stages.atomic import atomic_output_dir, atomic_write_text
from specbuild.stages.hashing import HashCache, digest_json, fingerprint, hash_tree
from specbuild.terminal import make_console

STATE_FORMAT = "specbuild.stages/v2"  # v2: records keyed by scope

Status = Literal["ok", "skipped", "failed"]


class ProgressCallback(Protocol):
    def __call__(self, message: str, fraction: float | None = None) -> None: ...


@dataclass(frozen=True)
class Stage:
    """One step: ``action(tmp_dir)`` (or ``action(tmp_dir, progress=...)``) fills ``tmp_dir``.

    ``inputs``: JSON values and Paths (a Path counts by its content). ``exclude``: relative paths inside
    the output that a later step writes (e.g. ``manifest.json``), left out of the output's hashes. The
    action may return a JSON-able dict (e.g. a report); it is stored and handed back when the stage is
    skipped.
    """

    name: str
    inputs: dict[str, Any]
    output: Path
    action: Callable[..., dict[str, Any] | None]
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class StageResult:
    name: str
    status: Status
    seconds: float
    fingerprint: str
    output: Path
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3),
                "fingerprint": self.fingerprint, "output": str(self.output), "detail": self.detail,
                "data": self.data}


def _accepts_progress(action: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(action).parameters
    except (TypeError, ValueError):
        return False
    return "progress" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _describe_changes(recorded: dict[str, str], current: dict[str, str]) -> str:
    changed = sorted(path for path in recorded.keys() | current.keys() if recorded.get(path) != current.get(path))
    shown = ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")
    return f"output changed since the last run ({len(changed)} file{'s' * (len(changed) != 1)}: {shown})"


class _Display:
    """Rich spinners per stage and a summary table on ``console``; silent when ``console`` is None."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self._progress = (
            Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<10}"), TextColumn("{task.description}"),
                     BarColumn(), TimeElapsedColumn(), console=console)
            if console is not None else None
        )

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        if self._progress is None:
            yield
            return
        with self._progress:
            yield

    def start(self, name: str, message: str) -> tuple[TaskID | None, ProgressCallback]:
        if self._progress is None:
            return None, lambda message, fraction=None: None
        task = self._progress.add_task(message, stage=name, total=None)

        def report(message: str, fraction: float | None = None) -> None:
            self._progress.update(task, description=message,
                                  **({"total": 1.0, "completed": fraction} if fraction is not None else {}))

        return task, report

    def finish(self, task: TaskID | None, result: StageResult) -> None:
        if self._progress is None or task is None:
            return
        style = {"ok": "green", "skipped": "cyan", "failed": "red"}[result.status]
        self._progress.update(task, description=f"[{style}]{result.detail}[/]", total=1.0,
                              completed=1.0)
        self._progress.stop_task(task)

    def summary(self, results: Sequence[StageResult]) -> None:
        if self.console is None or not results:
            return
        table = Table(title="specbuild stages", title_justify="left")
        for column in ("stage", "status", "time", "detail"):
            table.add_column(column, justify="right" if column == "time" else "left")
        style = {"ok": "green", "skipped": "cyan", "failed": "bold red"}
        for result in results:
            table.add_row(result.name, f"[{style[result.status]}]{result.status}[/]", f"{result.seconds:.1f}s",
                          result.detail)
        self.console.print(table)


class StageRunner:
    """Runs stages in order, skipping those whose inputs and outputs are unchanged since their last success.

    State (stamps, a file-hash cache, the last failure's traceback) lives in ``state_file``, which must not
    be inside any stage's output. ``scope`` keeps separate records for pipelines that share the state file
    (compile keeps one per runtime, so a failed ``tensorrt-llm`` run does not make ``torch`` redo its
    steps; a shared output that another scope rewrote still re-runs, because its files no longer match).
    ``results`` holds what ran so far, also after a :class:`StageError`.
    """

    def __init__(self, state_file: str | Path, *, scope: str = "", force: bool = False,
                 console: Console | None = None, json_mode: bool = False) -> None:
        self.state_file = Path(state_file).resolve()
        self.scope = scope
        self.force = force
        self.results: list[StageResult] = []
        self._display = _Display(None if json_mode else (console or make_console()))

    # --- state ------------------------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return {"format": STATE_FORMAT, "stages": {}, "hash_cache": {}}
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            return {"format": STATE_FORMAT, "stages": {}, "hash_cache": {}}
        return state

    def _save(self, state: dict[str, Any], cache: HashCache) -> None:
        state["hash_cache"] = cache.to_json()
        atomic_write_text(self.state_file, json.dumps(state, indent=1, sort_keys=True))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.state_file.with_name(self.state_file.name + ".lock")
        with open(lock_path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UsageError(f"another specbuild run is using {self.state_file}",
                                 "wait for it to finish (or use other output folders)") from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _check_layout(self, stages: Sequence[Stage]) -> None:
        names = [stage.name for stage in stages]
        if len(set(names)) != len(names):
            raise UsageError(f"stage names repeat: {names}", "give every stage its own name")
        outputs = [stage.output.resolve() for stage in stages]
        for index, output in enumerate(outputs):
            if self.state_file.is_relative_to(output):
                raise UsageError(f"the state file {self.state_file} is inside the output {output} of stage "
                                 f"{names[index]!r}, which is replaced on every run",
                                 "keep the state file outside every stage output")
            for other_index, other in enumerate(outputs):
                if other_index != index and output.is_relative_to(other):
                    raise UsageError(f"output {output} of stage {names[index]!r} is inside output {other} of "
                                     f"stage {names[other_index]!r}", "give each stage its own output folder")

    def _record_key(self, stage: Stage) -> str:
        return f"{self.scope}/{stage.name}" if self.scope else stage.name

    # --- running ----------------------------------------------------------------------------------------
    def run(self, stages: Sequence[Stage]) -> list[StageResult]:
        """Run or skip each stage in order; raises :class:`StageError` at the first failure."""
        self._check_layout(stages)
        self.results = []
        with self._locked():
            state = self._load()
            cache = HashCache(state.get("hash_cache"))
            upstream: dict[str, str] = {}
            try:
                with self._display.live():
                    for stage in stages:
                        upstream[stage.name] = digest_json(self._run_one(stage, upstream, state, cache))
            finally:
                self._display.summary(self.results)
        return self.results

    def _reason_to_run(self, stage: Stage, stage_fingerprint: str, record: dict[str, Any] | None,
                       cache: HashCache) -> tuple[str | None, dict[str, str]]:
        """Why the stage must run (None: it may be skipped), and its current output hashes when skipped."""
        if self.force:
            return "forced", {}
        if record is None:
            return "first run", {}
        if record.get("status") != "ok":
            return "last run failed", {}
        if record.get("fingerprint") != stage_fingerprint:
            return "inputs changed", {}
        if record.get("output") != str(stage.output.resolve()) or not stage.output.is_dir():
            return "output missing or moved", {}
        current = hash_tree(stage.output, symlinks="record", exclude=stage.exclude, cache=cache)
        if current != record.get("files"):
            return _describe_changes(record.get("files", {}), current), {}
        return None, current

    def _run_one(self, stage: Stage, upstream: dict[str, str], state: dict[str, Any],
                 cache: HashCache) -> dict[str, str]:
        """Run or skip one stage, append its result to ``results``; returns its output's file hashes."""
        stage_fingerprint = fingerprint({"stage": stage.name, "inputs": stage.inputs, "upstream": upstream},
                                        cache=cache)
        key = self._record_key(stage)
        record = state["stages"].get(key)
        reason, files = self._reason_to_run(stage, stage_fingerprint, record, cache)
        if reason is None:
            result = StageResult(stage.name, "skipped", 0.0, stage_fingerprint, stage.output,
                                 "skipped: inputs unchanged", record.get("data", {}))
            task, _ = self._display.start(stage.name, result.detail)
            self._finish(task, result)
            self._save(state, cache)
            return files

        task, report = self._display.start(stage.name, f"running ({reason})")
        started = time.perf_counter()
        try:
            extra = {"progress": report} if _accepts_progress(stage.action) else {}
            with atomic_output_dir(stage.output) as scratch:
                data = stage.action(scratch, **extra)
            files = hash_tree(stage.output, symlinks="record", exclude=stage.exclude, cache=cache)
        except BaseException as exc:
            seconds = time.perf_counter() - started
            error = self._as_stage_error(stage.name, key, exc)
            detail = "interrupted" if isinstance(exc, KeyboardInterrupt) else (error.message if error else str(exc))
            state["stages"][key] = {
                "status": "failed", "fingerprint": stage_fingerprint, "seconds": round(seconds, 3),
                "finished_at": _now(), "error": detail,
                "traceback": "".join(traceback.format_exception(exc)),
            }
            self._save(state, cache)
            self._finish(task, StageResult(stage.name, "failed", seconds, stage_fingerprint, stage.output, detail))
            if error is None:
                raise
            raise error from exc
        seconds = time.perf_counter() - started
        data = dict(data or {})
        state["stages"][key] = {
            "status": "ok", "fingerprint": stage_fingerprint, "seconds": round(seconds, 3), "finished_at": _now(),
            "output": str(stage.output.resolve()), "files": files, "data": data,
        }
        self._save(state, cache)
        self._finish(task, StageResult(stage.name, "ok", seconds, stage_fingerprint, stage.output, f"ran: {reason}",
                                       data))
        return files

    def _finish(self, task: TaskID | None, result: StageResult) -> None:
        self.results.append(result)
        self._display.finish(task, result)

    def _as_stage_error(self, name: str, key: str, exc: BaseException) -> StageError | None:
        """The StageError to raise for ``exc``; None for interrupts and exits, which propagate unchanged."""
        if isinstance(exc, StageError):
            return exc
        if isinstance(exc, SpecbuildError):
            return StageError(name, exc.message, exc.fix)
        if isinstance(exc, Exception):
            return StageError(name, f"{type(exc).__name__}: {exc}",
                              f"see the traceback under stages[\"{key}\"].traceback in {self.state_file}; "
                              "if it is a specbuild bug, report it with that traceback")
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
