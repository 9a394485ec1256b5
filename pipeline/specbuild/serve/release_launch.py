"""Launching a compiled release as it was compiled (``serve REPO``, ``deploy REPO``), whatever its runtime.

A launch may choose only what its runtime lets it (:attr:`Runtime.launch_settings`: where the release is served,
its host, ports and image); anything else differs from what the engine configs or ``model.yaml`` were compiled
for, and is refused with the fix. The runtime then checks the compiled configs against the launch
(:meth:`Runtime.check_compiled_layout`) and answers with the plan (:meth:`Runtime.launch_plan`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specbuild.errors import SpecError, UsageError
from specbuild.package.manifest import read_release, refuse_modified_release
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, BundledPlan, LaunchPlan
from specbuild.runtimes.registry import runtime_for
from specbuild.spec import BuildSpec, TritonSpec


def release_launch_spec(release: BuildSpec, overrides: dict[str, Any]) -> BuildSpec:
    """The spec to launch a compiled release with: the release's own, with ``overrides`` (dotted keys) applied
    only where its runtime lets a launch choose. Anything else that differs from the release (tp/pp, the launch
    layout, engine mounts, ...) is refused, naming the fix: the release was compiled for its values."""
    allowed = runtime_for(release.runtime).launch_settings
    data = release.model_dump(mode="json")
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        current = data.get(section, {}).get(name) if name else data.get(section)
        if current == value:
            continue
        if key not in allowed:
            raise SpecError(f"the release was compiled with {key}={current!r}, the launch asks for {value!r}",
                            f"launch it as compiled, or compile again with --set {key}={value}")
        data[section][name] = value
    return BuildSpec.model_validate(data)


def release_launch_plan(repository: str | Path, overrides: dict[str, Any], *, verify_files: bool = True,
                        gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan | BundledPlan:
    """The launch plan of the compiled release in ``repository`` (its manifest says how it was compiled), with
    ``overrides`` allowed only where a launch may choose; the release is verified first unless told not to."""
    release = read_release(repository)
    if verify_files:
        refuse_modified_release(release.repository)
    spec = release_launch_spec(release.spec, overrides)
    runtime = runtime_for(spec.runtime)
    runtime.check_compiled_layout(release.repository, spec)
    return runtime.launch_plan(spec, release.repository, release.engines, release.checkpoints, gpus=gpus,
                               shm_gib=shm_gib)


def rehearsal_plan(repository: str | Path, overrides: dict[str, Any], destination: Path) -> BundledPlan:
    """The CPU rehearsal of the release in ``repository``, written into ``destination`` and served by the bundled
    Triton server at the addresses the launch chooses (the release is verified first)."""
    release = read_release(repository)
    spec = release_launch_spec(release.spec, overrides)
    rehearsal = runtime_for(spec.runtime).rehearsal_repository(release, destination)
    return BundledPlan.of(spec.triton, rehearsal, openai=False)


def repository_plan(repository: str | Path, overrides: dict[str, Any]) -> BundledPlan:
    """A model repository without a release manifest, served as it is by the bundled Triton server (Triton only:
    the OpenAI-compatible API needs a release's orchestrator); ``overrides``: the launch's ``triton.*`` keys."""
    settings: dict[str, Any] = {}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if section != "triton" or not name:
            raise UsageError(f"{repository} has no release manifest, so {key} cannot be set",
                             "serve a release that `specbuild compile` wrote, or set only where it is served")
        settings[name] = value
    try:
        triton = TritonSpec.model_validate(settings)
    except ValidationError as exc:
        raise SpecError(f"invalid launch settings: {exc.errors()[0]['msg']}", "pass valid hosts and ports") from None
    return BundledPlan.of(triton, Path(repository), openai=False)
