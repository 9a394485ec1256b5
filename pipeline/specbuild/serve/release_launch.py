"""Launching a compiled release as it was compiled (``serve REPO`` / ``deploy REPO`` for GPU releases).

A launch may choose only where the release is served (:data:`LAUNCH_SETTINGS`: host, ports, image, mounts);
anything else differs from what the engine configs or ``model.yaml`` were compiled for, and is refused with
the fix. The plans themselves are :mod:`specbuild.serve.launch`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbuild.runtimes.registry import runtime_for
from specbuild.runtimes.tensorrt_llm_llmapi.launch import container_checkpoint
from specbuild.errors import SpecError
from specbuild.package.contract import DRAFT_MODEL, TARGET_MODEL
from specbuild.serve.launch import DEFAULT_SHM_GIB, LaunchPlan, model_devices, release_plan, require_trtllm
from specbuild.spec import BuildSpec

# Settings a launch may choose; everything else is the release's and is compiled into it.
LAUNCH_SETTINGS = frozenset({"triton.host", "triton.http_port", "triton.grpc_port", "triton.metrics_port",
                             "triton.openai_port", "triton.image", "triton.repository_mount"})


def release_launch_spec(release: BuildSpec, overrides: dict[str, Any]) -> BuildSpec:
    """The spec to launch a compiled release with: the release's own, with ``overrides`` (dotted keys) applied
    only where a launch may choose (:data:`LAUNCH_SETTINGS`). Anything else that differs from the release
    (tp/pp, the launch layout, engine mounts, ...) is refused, naming the fix: the engine configs were compiled
    for the release's values."""
    require_trtllm(release)
    return apply_launch_settings(release, overrides)


def apply_launch_settings(release: BuildSpec, overrides: dict[str, Any]) -> BuildSpec:
    """``release`` with ``overrides`` applied where a launch may choose (:data:`LAUNCH_SETTINGS`), any other
    difference refused: for every runtime (:func:`release_launch_spec` adds the GPU launch's own checks)."""
    data = release.model_dump(mode="json")
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        current = data.get(section, {}).get(name) if name else data.get(section)
        if current == value:
            continue
        if key not in LAUNCH_SETTINGS:
            raise SpecError(f"the release was compiled with {key}={current!r}, the launch asks for {value!r}",
                            f"launch it as compiled, or compile again with --set {key}={value}")
        data[section][name] = value
    return BuildSpec.model_validate(data)


def check_compiled_layout(repository: Path, spec: BuildSpec) -> None:
    """Refuse a release whose compiled configs do not match the layout it is launched with (see
    :func:`check_engine_configs` and :func:`check_llmapi_config`), naming the model and the key."""
    if runtime_for(spec.runtime).builds_engines:
        check_engine_configs(repository, spec)
    else:
        check_llmapi_config(repository, spec)


def check_llmapi_config(repository: Path, spec: BuildSpec) -> None:
    """The LLM-API model's ``model.yaml`` must read back through its typed model and name the checkpoints and
    the parallel layout this launch mounts and reserves GPUs for."""
    from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml, parse
    from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_MODEL, MODEL_YAML

    path = repository / LLMAPI_MODEL / "1" / MODEL_YAML
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc}", "package the release again (specbuild package)") from None
    config = parse(ModelYaml, text, str(path))
    compared = {  # key: (model.yaml's value, what the launch mounts and reserves GPUs for)
        "model": (config.model, container_checkpoint(spec, TARGET_MODEL)),
        "speculative_model": (config.speculative_config.speculative_model, container_checkpoint(spec, DRAFT_MODEL)),
        "tensor_parallel_size": (config.tensor_parallel_size, spec.target.tp_size),
        "pipeline_parallel_size": (config.pipeline_parallel_size, spec.target.pp_size),
    }
    problems = [f"{key} is {found!r}, the launch needs {needed!r}" for key, (found, needed) in compared.items()
                if found != needed]
    if problems:
        raise SpecError(f"{path} does not match the launch:\n  " + "\n  ".join(problems),
                        "package the release again (specbuild package) rather than editing model.yaml")


def check_engine_configs(repository: Path, spec: BuildSpec) -> None:
    """Refuse engine configs whose devices differ from the launch layout: a missing ``participant_ids`` would make
    TensorRT-LLM drop fast logits without a word, or hang waiting for ranks; this names the model and the key."""
    from specbuild.package.backend_contract import EngineParameters
    from specbuild.package.repository import read_config

    problems = []
    for role, devices in model_devices(spec).items():
        config = read_config(repository / role)
        rendered = EngineParameters.from_parameters({k: v.string_value for k, v in config.parameters.items()})
        expected = {"gpu_device_ids": devices.gpu_device_ids, "participant_ids": devices.participant_ids,
                    "speculative_decoding_fast_logits": devices.fast_logits}
        for key, value in expected.items():
            if getattr(rendered, key) != value:
                problems.append(f"{role}: {key} is {getattr(rendered, key)!r}, the launch layout needs {value!r}")
    if problems:
        raise SpecError("the release's engine configs do not match its launch layout:\n  " + "\n  ".join(problems),
                        "package the release again (specbuild package) rather than editing its configs")


def release_launch_plan(repository: str | Path, overrides: dict[str, Any], *, verify_files: bool = True,
                        gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
    """The launch plan of the compiled release in ``repository`` (its manifest says how it was compiled), with
    ``overrides`` allowed only where a launch may choose; the release is verified first unless told not to."""
    from specbuild.errors import VerificationError
    from specbuild.package.manifest import read_release, verify

    release = read_release(repository)
    if verify_files:
        report = verify(release.manifest)
        if not report.ok:
            raise VerificationError(f"the release differs from its manifest: {report.summary()}",
                                    f"{report.fix} (`specbuild verify` lists the files)")
    spec = release_launch_spec(release.spec, overrides)
    check_compiled_layout(release.repository, spec)
    return release_plan(spec, release.repository, release.engines, release.checkpoints, gpus=gpus, shm_gib=shm_gib)
