"""Runtimes: how a release's engines are converted, built and served, behind one interface.

A :class:`Runtime` knows which architectures it runs, the dtype it builds each model in, the conversion and
build of a model (planned first, for ``--dry-run``; executed second), the build record of an engine it has
only planned, the parameters of the engine models the repository serves them with, and the spec settings it
cannot honour. A runtime that builds no engines (``builds_engines`` false: TensorRT-LLM's LLM API loads the
checkpoints itself) renders a repository of its own and is never asked to convert or build. The compile
pipeline, ``check`` and the repository renderer ask the runtime of a spec (:func:`runtime_for`) and never
branch on its name. Each runtime's heavy dependencies (TensorRT-LLM, torch) are imported only when it runs.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from specbuild.errors import UsageError
from specbuild.package.contract import ORCHESTRATOR_MODEL

if TYPE_CHECKING:
    from specbuild.checkpoint.info import CheckpointInfo
    from specbuild.package.backend_contract import EngineModel
    from specbuild.package.repository import EngineInfo
    from specbuild.spec import BuildSpec, Role

@dataclass(frozen=True)
class ModelPlan:
    """What compile does for one model: a JSON-able description and the lines ``--dry-run`` prints."""

    role: Role
    data: dict[str, Any]
    text: str


@dataclass(frozen=True)
class SpecFinding:
    """A spec setting a runtime cannot honour: ``blocking`` ones make the pair check fail, others warn."""

    code: str
    message: str
    fix: str | None = None
    blocking: bool = True


@dataclass(frozen=True)
class PackageContext:
    """What the check step found that engine configs need: the memory plan's KV split and token caps."""

    kv_fractions: Mapping[str, float]
    kv_tokens: Mapping[str, int]


class Runtime(abc.ABC):
    """One way to run the target and draft engines; see the module notes."""

    name: ClassVar[str]
    auto_priority: ClassVar[int]  # ``runtime: auto`` takes the available runtime with the highest
    # Releases run in the runtime's container image (launch plans; serve --dry-run prints the commands), not on
    # the Triton server bundled with specbuild.
    container_launch: ClassVar[bool]
    # Compile converts and builds engines (else the stages are check and package, and the release serves the
    # checkpoints themselves).
    builds_engines: ClassVar[bool] = True
    # Verification rules the runtime can run, preferred first (speculation.acceptance falls back to the first).
    acceptances: ClassVar[tuple[str, ...]] = ("draft-logits", "token-match")
    # The Triton model that answers each request and exports the requests in flight (stats.IN_FLIGHT, under its
    # name as label ``model``): what autoscaling follows.
    serving_model: ClassVar[str] = ORCHESTRATOR_MODEL
    # The load policy's default (speculation.busy_in_flight): from this many requests in flight, rounds draft
    # nothing. On a GPU, verification is nearly free until the batch fills the GPU: NVIDIA measures draft-target
    # at about 2x at batch 1 and about 1x at batch 16 (docs/benchmarks.md).
    busy_in_flight: ClassVar[int] = 16

    @abc.abstractmethod
    def available(self) -> bool:
        """Whether this machine can convert and build with this runtime."""

    @abc.abstractmethod
    def unsupported(self, architecture: str) -> str | None:
        """Why this runtime cannot run a model of HF ``architecture`` (None when it can)."""

    @abc.abstractmethod
    def engine_dtype(self, requested: str, role: Role, checkpoint_dtype: str | None) -> str:
        """The dtype the engine of ``role`` is built and run in, for the spec's ``requested`` dtype (``auto``
        included) and the checkpoint's stored one; a :class:`~specbuild.errors.SpecError` if it cannot be."""

    @abc.abstractmethod
    def plan(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, converted: Path,
             engine: Path) -> ModelPlan:
        """Conversion and build of one model, without running them."""

    def convert(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, output: Path) -> None:
        """HF checkpoint -> the runtime's checkpoint in ``output`` (runtimes that build engines)."""
        raise self._no_engines()

    def build(self, spec: BuildSpec, role: Role, converted: Path, output: Path) -> None:
        """Converted checkpoint -> engine folder ``output`` (with its ``build_info.json``)."""
        raise self._no_engines()

    def engine_model(self, spec: BuildSpec, engine: EngineInfo, repository: Path,
                     context: PackageContext) -> EngineModel:
        """How the engine model serving ``engine`` from ``repository`` is configured (backend, parameters,
        instances, python model)."""
        raise self._no_engines()

    def load_policy(self, spec: BuildSpec) -> int:
        """The load policy's threshold: ``speculation.busy_in_flight``, or this runtime's default when unset."""
        configured = spec.speculation.busy_in_flight
        return self.busy_in_flight if configured is None else configured

    def _no_engines(self) -> UsageError:
        return UsageError(f"the {self.name} runtime builds no engines", "run `specbuild compile` (check and package)")

    @abc.abstractmethod
    def planned_build_info(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo) -> dict[str, Any]:
        """The ``build_info.json`` the engine of ``role`` would get: what packaging needs to render the
        repository for engines not built here (for a runtime without engines: the model's limits)."""

    def spec_findings(self, spec: BuildSpec) -> list[SpecFinding]:
        """Spec settings this runtime cannot honour (``check`` reports them with the pair's findings)."""
        return []

    def render_repository(self, spec: BuildSpec, engines: Mapping[str, EngineInfo], tokenizer_dir: Path,
                          output_dir: Path, context: PackageContext) -> None:
        """Write the whole Triton repository into ``output_dir``: by default the engine-model layout of
        :func:`specbuild.package.repository.render_repository`."""
        from specbuild.package.repository import render_repository

        models = {role: self.engine_model(spec, engine, output_dir, context) for role, engine in engines.items()}
        render_repository(spec, engines, models, tokenizer_dir, output_dir, self.load_policy(spec))
