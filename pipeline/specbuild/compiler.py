"""The compile pipeline: check -> convert -> build -> package -> manifest, as importable functions.

Each step is a :class:`~specbuild.stages.runner.Stage`: skipped when its inputs (and upstream outputs) hash as in
the last successful run, written into a temporary folder and renamed on success. ``compile`` runs them
all; ``convert`` and ``build`` run the prefix of the pipeline that ends with them (so a ``build`` after a
changed spec re-converts first); ``package`` checks and packages without building (the engines already
built, or, where none are, those the runtime would build). ``plan`` describes what would run, without running
it. Everything that depends on the runtime is asked of it (:mod:`specbuild.runtimes.interface`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specbuild.errors import IncompatibleError, SpecbuildError, StageError, UsageError
from specbuild.package.build_record import RECORD_FORMAT
from specbuild.package.traffic_draft import TrafficProvenance, read_traffic_provenance
from specbuild.package.vendor import source_digest
from specbuild.check.pair_report import SPEC_READS as CHECK_READS
from specbuild.doctor.facts import ship_doctor
from specbuild.runtimes.interface import STEPS, PackageContext, ReleaseContents, Step
from specbuild.runtimes.registry import resolved, runtime_for
from specbuild.spec import ROLES, BuildSpec, LimitsSpec, OutputsSpec, Role
from specbuild.stages.reads import expand, spec_inputs
from specbuild.stages.runner import Stage, StageResult, StageRunner

if TYPE_CHECKING:
    from specbuild.checkpoint.info import CheckpointInfo
    from specbuild.package.build_record import Engine

STATE_FILE = ".specbuild-state.json"

# The spec fields this module's share of each step reads, besides the runtime's (Runtime.reads): every action asks
# for the runtime by name; convert and package read the checkpoints (_checkpoints), package the engines folder.
CHECKPOINT_READS = ("target.checkpoint", "draft.checkpoint", "security")
SHARED_READS: dict[Step, tuple[str, ...]] = {
    "check": ("runtime", *CHECK_READS),
    "convert": ("runtime", *CHECKPOINT_READS),
    "build": ("runtime",),
    "package": ("runtime", *CHECKPOINT_READS, "outputs.engines_dir"),
}


@dataclass
class CompileResult:
    spec: BuildSpec
    steps: list[StageResult]
    repository: Path
    engines: Path
    engines_built: bool = True
    checkpoints: dict[str, str] = field(default_factory=dict)  # served in place of engines (a runtime without them)
    manifest: Path | None = None
    check: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "runtime": self.spec.runtime,
            "repository": str(self.repository),
            "engines": str(self.engines),
            "engines_built": self.engines_built,
            "manifest": str(self.manifest) if self.manifest else None,
            "steps": [step.to_json() for step in self.steps],
        }


def _dirs(spec: BuildSpec) -> tuple[Path, Path, Path]:
    o = spec.outputs
    return Path(o.build_dir), Path(o.engines_dir), Path(o.repository_dir)


def _checkpoints(spec: BuildSpec) -> dict[Role, CheckpointInfo]:
    from specbuild.checkpoint.info import read_checkpoint

    return {role: read_checkpoint(getattr(spec, role).checkpoint, allow_pickle=spec.security.allow_pickle,
                                  trust_remote_code=spec.security.trust_remote_code) for role in ROLES}


def _check_action(spec: BuildSpec, output: Path) -> dict[str, Any]:
    from specbuild.check.pair_report import check
    from specbuild.package.manifest import checkpoint_identity

    report = check(spec.target.checkpoint, spec.draft.checkpoint, spec)
    data = report.to_dict()
    (output / "check.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    if not report.compatible:
        reasons = "; ".join(reason.message for reason in report.reasons)
        fixes = "; ".join(reason.fix for reason in report.reasons if reason.fix)
        raise IncompatibleError(f"target and draft cannot be paired: {reasons}", fixes or None)
    return {
        "compatibility": data,
        "inputs": {role: checkpoint_identity(getattr(spec, role).checkpoint) for role in ROLES},
        "kv_fractions": {"target": report.memory.target_kv_fraction, "draft": report.memory.draft_kv_fraction},
        "kv_tokens": {role: getattr(report.memory, role).kv_tokens for role in ROLES},
        "limits": report.limits.model_dump(),
    }


def with_checked_limits(spec: BuildSpec, check: dict[str, Any]) -> BuildSpec:
    """``spec`` with the limits its check resolved from the checkpoints: what convert, build, package and the
    manifest work with."""
    return spec.model_copy(update={"limits": LimitsSpec.model_validate(check["limits"])})


def _convert_action(spec: BuildSpec, output: Path, progress: Any) -> None:
    runtime = runtime_for(spec.runtime)
    for role, checkpoint in _checkpoints(spec).items():
        progress(f"converting {role}")
        runtime.convert(spec, role, checkpoint, output / role)


def _build_action(spec: BuildSpec, converted: Path, output: Path, progress: Any) -> None:
    runtime = runtime_for(spec.runtime)
    for role in ROLES:
        progress(f"building {role}")
        runtime.build(spec, role, converted / role, output / role)


def _package_action(spec: BuildSpec, check: dict[str, Any], engines: dict[Role, Engine], output: Path) -> None:
    context = PackageContext(kv_fractions=check["kv_fractions"], kv_tokens=check["kv_tokens"],
                             cost_ratio=check["compatibility"].get("cost_ratio"))
    runtime_for(spec.runtime).render_repository(spec, engines, Path(spec.target.checkpoint), output, context)
    ship_doctor(spec, output)


def stage_reads(spec: BuildSpec, step: Step, *, package_only: bool = False) -> frozenset[str]:
    """The spec fields ``step`` reads for ``spec``'s runtime (leaf paths): what its fingerprint hashes. Packaged
    alone, the package step also plans the build records of engines not built here."""
    runtime = runtime_for(spec.runtime)
    plan = runtime.reads.get("plan", ()) if step == "package" and package_only else ()
    return expand((*SHARED_READS[step], *runtime.reads.get(step, ()), *plan))


def stages(spec: BuildSpec, runner: StageRunner, upto: Step = "package", *,
           package_only: bool = False) -> list[Stage]:
    """The pipeline's stages from ``check`` through ``upto``; later stages read the check's findings from
    ``runner.results`` (also when the check itself was skipped). ``package_only``: check, then package the
    engines already in ``outputs.engines_dir``, or, where none are built, the engines the runtime would build
    (a release without engines, for inspection: see :func:`run`). A runtime that builds no engines has no
    convert and build stages: check and package are its whole pipeline. Each stage's inputs are the spec fields
    it reads (:func:`stage_reads`); the limits a check resolves reach later stages through its output
    (check.json), which their fingerprints include."""
    build_dir, engines_dir, repository = _dirs(spec)
    runtime = runtime_for(spec.runtime)
    converted = build_dir / spec.runtime

    def inputs(step: Step) -> dict[str, Any]:
        return spec_inputs(spec, stage_reads(spec, step, package_only=package_only))

    def check_data() -> dict[str, Any]:
        return runner.results[0].data

    def checked() -> BuildSpec:
        return with_checked_limits(spec, check_data())

    def engines() -> dict[Role, Engine]:
        return runtime.packaged_engines(checked(), _checkpoints(spec), package_only=package_only)

    check = Stage("check", inputs("check"), build_dir / "check", lambda tmp: _check_action(spec, tmp))
    # Packaged alone, engines built elsewhere count by their content (in compile, the build stage's output counts
    # upstream); the code a repository ships copies of counts too.
    built_elsewhere = package_only and "build" in runtime.steps and engines_dir.is_dir()
    package = Stage("package", {**inputs("package"), "engines": engines_dir.resolve() if built_elsewhere else None,
                                "specbuild": source_digest()},
                    repository, lambda tmp: _package_action(checked(), check_data(), engines(), tmp),
                    exclude=("manifest.json",))
    if package_only:
        return [check, package]
    by_step = {
        "check": check,
        "convert": Stage("convert", inputs("convert"), converted,
                         lambda tmp, progress: _convert_action(checked(), tmp, progress)),
        "build": Stage("build", {**inputs("build"), "record": RECORD_FORMAT},  # a new record format rebuilds
                       engines_dir, lambda tmp, progress: _build_action(checked(), converted, tmp, progress)),
        "package": package,
    }
    return [by_step[step] for step in runtime.steps if STEPS.index(step) <= STEPS.index(upto)]


def check_outputs(spec: BuildSpec) -> None:
    """Refuse output folders that hold an input checkpoint or the working directory: each step replaces
    its output folder whole, so such a folder would be deleted with everything in it."""
    build_dir, engines, repository = _dirs(spec)
    outputs = {"build_dir": build_dir, "engines_dir": engines, "repository_dir": repository}
    protected = {f"the {role} checkpoint": Path(getattr(spec, role).checkpoint) for role in ROLES}
    protected["the current directory"] = Path.cwd()
    for field_name, output in outputs.items():
        replaced = [output / "check", output / spec.runtime] if field_name == "build_dir" else [output]
        for folder in (path.resolve() for path in replaced):
            for what, path in protected.items():
                if path.resolve().is_relative_to(folder):
                    raise UsageError(f"outputs.{field_name} ({output}) would replace {folder}, which holds {what} "
                                     f"({path}): compile replaces its output folders whole",
                                     f"point outputs.{field_name} at a folder of its own (default: "
                                     f"{OutputsSpec.model_fields[field_name].default}/)")


def run(spec: BuildSpec, upto: Step = "package", *, force: bool = False, json_mode: bool = False,
        console: Console | None = None, write_manifest: bool = True, package_only: bool = False) -> CompileResult:
    """Run the pipeline through ``upto`` (``compile`` = through ``package``, then the manifest).

    ``package_only`` (``specbuild package``): check and package without converting or building. On a machine
    that cannot build for the runtime (e.g. no TensorRT-LLM), the repository is rendered for the engines the
    runtime would build, and the manifest marks the release as having no engines: ``verify``, ``serve`` and
    ``deploy`` refuse it; pipelines and tests can inspect exactly what a GPU host would get.
    """
    spec = resolved(spec)
    check_outputs(spec)
    traffic = read_traffic_provenance(spec.draft.checkpoint)  # refused before any stage runs if malformed
    build_dir, engines, repository = _dirs(spec)
    runner = StageRunner(build_dir / STATE_FILE, scope=spec.runtime, force=force, console=console,
                         json_mode=json_mode)
    results = runner.run(stages(spec, runner, upto, package_only=package_only))
    check_data = results[0].data
    spec = with_checked_limits(spec, check_data)
    if upto != "package":
        return CompileResult(spec=spec, steps=results, repository=repository, engines=engines, check=check_data)
    contents = runtime_for(spec.runtime).release_contents(spec, _checkpoints(spec))
    result = CompileResult(spec=spec, steps=results, repository=repository, engines=engines,
                           engines_built=contents.servable, checkpoints=contents.checkpoints, check=check_data)
    if write_manifest:
        result.manifest = _write_manifest(spec, results, check_data, contents, traffic)
    return result


def _write_manifest(spec: BuildSpec, results: list[StageResult], check_data: dict[str, Any],
                    contents: ReleaseContents, traffic: TrafficProvenance | None = None) -> Path:
    """The manifest of the release: its repository, and the engines or checkpoints it serves; with ``traffic``, what
    the traffic-trained draft learnt from (``extra.traffic_trained_draft``)."""
    from specbuild.package import manifest

    _, _, repository = _dirs(spec)
    try:
        return manifest.write_manifest(
            repository, contents.engines, spec=spec, inputs=check_data.get("inputs", {}), steps=results,
            compatibility=check_data.get("compatibility"),
            extra={"build_info": None if contents.build_info is None
                   else {role: record.model_dump(mode="json") for role, record in contents.build_info.items()},
                   **({"traffic_trained_draft": traffic.manifest_record()} if traffic is not None else {})},
            checkpoints=contents.checkpoints or None,
        )
    except SpecbuildError as exc:
        raise StageError("manifest", exc.message, exc.fix) from exc
    except OSError as exc:  # e.g. the disk filled up: the repository is whole, only its manifest is missing
        raise StageError("manifest", f"cannot write {repository / manifest.MANIFEST_NAME}: {exc}",
                         "free disk space or fix the folder's permissions, then run compile again "
                         "(finished steps are skipped)") from exc


# --- dry run -------------------------------------------------------------------------------------------
def plan(spec: BuildSpec) -> dict[str, Any]:
    """What ``compile`` would do, without doing it (nothing is written): the runtime's conversion and build of
    each model (for ``tensorrt-llm`` the exact commands and build configs per rank), at the limits the
    checkpoints give where the spec leaves them open."""
    from specbuild.check.pair_report import spec_for_checkpoints

    spec = resolved(spec)
    build_dir, engines, repository = _dirs(spec)
    runtime = runtime_for(spec.runtime)
    checkpoints = _checkpoints(spec)
    spec = spec_for_checkpoints(spec, checkpoints["target"], checkpoints["draft"])
    plans = [runtime.plan(spec, role, checkpoint, build_dir / spec.runtime / role, engines / role)
             for role, checkpoint in checkpoints.items()]
    return {"name": spec.name, "runtime": spec.runtime, "engines": str(engines), "repository": str(repository),
            "steps": [*runtime.steps, "manifest"],
            "models": {item.role: item.data for item in plans},
            "text": "\n\n".join([f"{spec.runtime} runtime: {spec.name}"] + [item.text for item in plans])}
