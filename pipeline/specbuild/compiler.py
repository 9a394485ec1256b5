"""The compile pipeline: check -> convert -> build -> package -> manifest, as importable functions.

Each step is a :class:`~specbuild.build.stages.Stage`: skipped when its inputs (and upstream outputs) hash as in
the last successful run, written into a temporary folder and renamed on success. ``compile`` runs them
all; ``convert``, ``build`` and ``package`` run the prefix of the pipeline that ends with them (so a
``build`` after a changed spec re-converts first). ``plan`` describes what would run, without running it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from specbuild.errors import IncompatibleError, StageError, UsageError
from specbuild.build.runtimes import BUILD_INFO
from specbuild.spec import BuildSpec, LimitsSpec, OutputsSpec
from specbuild.build.stages import Stage, StageResult, StageRunner

StepName = Literal["check", "convert", "build", "package"]
STEPS: tuple[StepName, ...] = ("check", "convert", "build", "package")
ROLES = ("target", "draft")
STATE_FILE = ".specbuild-state.json"


@dataclass
class CompileResult:
    spec: BuildSpec
    steps: list[StageResult]
    repository: Path
    engines: Path
    manifest: Path | None = None
    check: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "runtime": self.spec.runtime,
            "repository": str(self.repository),
            "engines": str(self.engines),
            "manifest": str(self.manifest) if self.manifest else None,
            "steps": [step.to_json() for step in self.steps],
        }


def _dirs(spec: BuildSpec) -> tuple[Path, Path, Path]:
    o = spec.outputs
    return Path(o.build_dir), Path(o.engines_dir), Path(o.repository_dir)


def _check_action(spec: BuildSpec, output: Path) -> dict[str, Any]:
    from specbuild.check.report import check
    from specbuild.package.manifest import checkpoint_identity

    report = check(spec.target.checkpoint, spec.draft.checkpoint, spec, gpu_memory_gib=spec.triton.gpu_memory_gib)
    data = report.to_dict()
    (output / "check.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    if not report.compatible:
        reasons = "; ".join(reason.message for reason in report.reasons)
        fixes = "; ".join(reason.fix for reason in report.reasons if reason.fix)
        raise IncompatibleError(f"target and draft cannot be paired: {reasons}", fixes or None)
    return {
        "compatibility": data,
        "inputs": {role: checkpoint_identity(getattr(spec, role).checkpoint) for role in ROLES},
        "architectures": {role: getattr(report, role).architecture for role in ROLES},
        "dtypes": {role: getattr(report, role).torch_dtype for role in ROLES},
        "kv_fractions": {"target": report.memory.target_kv_fraction, "draft": report.memory.draft_kv_fraction},
        "kv_tokens": {role: getattr(report.memory, role).kv_tokens for role in ROLES},
        "limits": report.limits.model_dump(),
    }


def with_checked_limits(spec: BuildSpec, check: dict[str, Any]) -> BuildSpec:
    """``spec`` with the limits its check resolved from the checkpoints: what convert, build, package and the
    manifest work with."""
    return spec.model_copy(update={"limits": LimitsSpec.model_validate(check["limits"])})


def _convert_action(spec: BuildSpec, check: dict[str, Any], output: Path, progress: Any) -> None:
    for role in ROLES:
        progress(f"converting {role}")
        if spec.runtime == "torch":
            from specbuild.build.runtimes import torch as torch_runtime

            torch_runtime.convert(spec, role, output / role)
        else:
            from specbuild.build.runtimes import tensorrt_llm

            plan = tensorrt_llm.convert_plan(spec, role, check["architectures"][role], output / role,
                                             checkpoint_dtype=check["dtypes"][role])
            tensorrt_llm.convert(plan, into=output / role)


def _build_action(spec: BuildSpec, converted: Path, output: Path, progress: Any) -> None:
    for role in ROLES:
        progress(f"building {role}")
        if spec.runtime == "torch":
            from specbuild.build.runtimes import torch as torch_runtime

            torch_runtime.build(spec, role, converted / role, output / role)
        else:
            from specbuild.build.runtimes import tensorrt_llm

            plan = tensorrt_llm.build_plan(spec, role, converted / role, output / role)
            tensorrt_llm.build(plan, into=output / role)


def _package_action(spec: BuildSpec, check: dict[str, Any], engines: Path, output: Path) -> None:
    from specbuild.package.repository import EngineInfo, render_repository

    target = EngineInfo.read(engines / "target", "target")
    draft = EngineInfo.read(engines / "draft", "draft")
    factory = None
    if spec.runtime == "tensorrt-llm":
        factory = tensorrt_llm_engine_configs(spec, check["kv_fractions"], check["kv_tokens"])
    render_repository(spec, target, draft, Path(spec.target.checkpoint), output, engine_config=factory)


def tensorrt_llm_engine_configs(spec: BuildSpec, kv_fractions: dict[str, float], kv_tokens: dict[str, int]):
    """Engine configs for the ``tensorrtllm`` backend: engines at ``engine_mount`` inside the container,
    the KV-cache split from the memory plan (or the spec), capped at the planned KV tokens (each fraction
    applies to the memory free when that engine loads, so the token cap keeps the first one honest),
    devices from the launch plan."""
    from specbuild.serve.launch import model_devices
    from specbuild.build.runtimes.tensorrt_llm import engine_model_config

    devices = model_devices(spec)

    def make(spec: BuildSpec, engine: Any, repository: Path):
        fraction = spec.triton.kv_cache_free_gpu_mem_fraction
        role_fraction = kv_fractions[engine.role] if fraction is None else fraction * (
            kv_fractions[engine.role] / max(1e-9, sum(kv_fractions.values())))
        placement = devices[engine.role]
        return engine_model_config(
            spec, engine.role, engine_path=f"{spec.triton.engine_mount.rstrip('/')}/{engine.role}",
            kv_cache_free_gpu_mem_fraction=round(role_fraction, 4),
            gpu_device_ids=list(placement.gpu_device_ids) or None,
            participant_ids=None if placement.participant_ids is None else list(placement.participant_ids),
            fast_logits=placement.fast_logits,
            max_tokens_in_paged_kv_cache=kv_tokens[engine.role],
        )

    return make


def stages(spec: BuildSpec, runner: StageRunner, upto: StepName = "package") -> list[Stage]:
    """The pipeline's stages from ``check`` through ``upto``; later stages read the check's findings from
    ``runner.results`` (also when the check itself was skipped)."""
    build_dir, engines, repository = _dirs(spec)
    converted = build_dir / spec.runtime
    models = {role: getattr(spec, role) for role in ROLES}
    # What engines are built for; the default K and adaptive K only change the orchestrator's config.
    engine_speculation = spec.speculation.model_dump(include={"max_draft_len", "acceptance"})

    def check_data() -> dict[str, Any]:
        return runner.results[0].data

    def checked() -> BuildSpec:
        return with_checked_limits(spec, check_data())

    # Stages after the check hash the limits as the user set them: the resolved ones are in the check's
    # output (check.json), which every later stage's fingerprint includes.
    all_stages = [
        Stage("check", {"models": models, "target": Path(spec.target.checkpoint), "draft": Path(spec.draft.checkpoint),
                        "engine_speculation": engine_speculation, "limits": spec.limits, "security": spec.security,
                        "gpu_memory_gib": spec.triton.gpu_memory_gib, "runtime": spec.runtime},
              build_dir / "check", lambda tmp: _check_action(spec, tmp)),
        Stage("convert", {"runtime": spec.runtime, "models": models, "security": spec.security},
              converted, lambda tmp, progress: _convert_action(checked(), check_data(), tmp, progress)),
        Stage("build", {"runtime": spec.runtime, "models": models, "engine_speculation": engine_speculation,
                        "limits": spec.limits},
              engines, lambda tmp, progress: _build_action(checked(), converted, tmp, progress)),
        Stage("package", {"spec": spec.model_dump(mode="json", exclude={"outputs"}),
                          "engines": str(engines.resolve()), "repository": str(repository.resolve())},
              repository, lambda tmp: _package_action(checked(), check_data(), engines, tmp),
              exclude=("manifest.json",)),
    ]
    return all_stages[: STEPS.index(upto) + 1]


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


def run(spec: BuildSpec, upto: StepName = "package", *, force: bool = False, json_mode: bool = False,
        console: Console | None = None, write_manifest: bool = True) -> CompileResult:
    """Run the pipeline through ``upto`` (``compile`` = through ``package``, then the manifest)."""
    spec = spec.resolved()
    check_outputs(spec)
    build_dir, engines, repository = _dirs(spec)
    runner = StageRunner(build_dir / STATE_FILE, scope=spec.runtime, force=force, console=console,
                         json_mode=json_mode)
    results = runner.run(stages(spec, runner, upto))
    check_data = results[0].data
    spec = with_checked_limits(spec, check_data)
    result = CompileResult(spec=spec, steps=results, repository=repository, engines=engines, check=check_data)
    if upto == "package" and write_manifest:
        result.manifest = _write_manifest(spec, results, check_data)
    return result


def _write_manifest(spec: BuildSpec, results: list[StageResult], check_data: dict[str, Any]) -> Path:
    from specbuild.package import manifest
    from specbuild.errors import SpecbuildError

    _, engines, repository = _dirs(spec)
    try:
        return manifest.write_manifest(
            repository, engines, spec=spec, inputs=check_data.get("inputs", {}), steps=results,
            compatibility=check_data.get("compatibility"),
            extra={"build_info": {role: _read_json(engines / role / BUILD_INFO) for role in ROLES}},
        )
    except SpecbuildError as exc:
        raise StageError("manifest", exc.message, exc.fix) from exc
    except OSError as exc:  # e.g. the disk filled up: the repository is whole, only its manifest is missing
        raise StageError("manifest", f"cannot write {repository / manifest.MANIFEST_NAME}: {exc}",
                         "free disk space or fix the folder's permissions, then run compile again "
                         "(finished steps are skipped)") from exc


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --- dry run -------------------------------------------------------------------------------------------
def plan(spec: BuildSpec) -> dict[str, Any]:
    """What ``compile`` would do, without doing it: for ``tensorrt-llm`` the exact conversion and
    ``trtllm-build`` commands and build configs per rank; for ``torch`` the folders and build fields."""
    from specbuild.check.checkpoints import read_checkpoint
    from specbuild.check.report import spec_for_checkpoints

    spec = spec.resolved()
    build_dir, engines, repository = _dirs(spec)
    infos = {role: read_checkpoint(getattr(spec, role).checkpoint, allow_pickle=spec.security.allow_pickle,
                                   trust_remote_code=spec.security.trust_remote_code) for role in ROLES}
    spec = spec_for_checkpoints(spec, infos["target"], infos["draft"])
    summary: dict[str, Any] = {"name": spec.name, "runtime": spec.runtime, "engines": str(engines),
                               "repository": str(repository), "steps": list(STEPS) + ["manifest"]}
    if spec.runtime == "tensorrt-llm":
        from specbuild.build.runtimes import tensorrt_llm

        plans = [tensorrt_llm.EnginePlan(
            tensorrt_llm.convert_plan(spec, role, infos[role].architecture, build_dir / spec.runtime / role,
                                      checkpoint_dtype=infos[role].torch_dtype),
            tensorrt_llm.build_plan(spec, role, build_dir / spec.runtime / role, engines / role),
        ) for role in ROLES]
        summary["engines_plan"] = tensorrt_llm.plan_as_dict(plans)
        summary["text"] = tensorrt_llm.format_plan(plans)
    else:
        from specbuild.build.runtimes import torch as torch_runtime

        summary["engines_plan"] = {role: {"checkpoint": getattr(spec, role).checkpoint,
                                          "converted": str(build_dir / spec.runtime / role),
                                          "engine": str(engines / role),
                                          "dtype": torch_runtime.resolve_dtype(spec, role),
                                          "build_config": torch_runtime.build_config(spec, role)}
                                   for role in ROLES}
        summary["text"] = "\n".join(
            f"{role}: {item['checkpoint']} -> {item['converted']} -> {item['engine']} "
            f"(dtype {item['dtype']}, {json.dumps(item['build_config'])})"
            for role, item in summary["engines_plan"].items())
    return summary
