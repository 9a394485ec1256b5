"""The one interface every runtime implements: how a release is built, and how it is served.

A :class:`Runtime` answers, for compile: which architectures it runs, the dtype it builds each model in, its
pipeline's steps, the conversion and build of a model (planned first, for ``--dry-run``; executed second), the
build record of an engine it has only planned, the engine models the repository serves them with, the spec
settings it cannot honour, and what a finished release holds. A runtime without engines (TensorRT-LLM's LLM API
loads the checkpoints itself) has no convert and build steps, renders a repository of its own and serves the
checkpoints. For serving, it answers: what a launch may change, whether a compiled release matches the layout it
is launched with, the launch plan (a container of its image, or the Triton server bundled with specbuild), the
pod of a deployment, and, where it has one, a CPU rehearsal. The compile pipeline, ``check``, the repository
renderer, ``serve`` and ``deploy`` ask the runtime of a spec (:mod:`specbuild.runtimes.registry`) and never
branch on its name. Each runtime's heavy dependencies (TensorRT-LLM, torch) are imported only when it runs.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from specbuild.errors import StageError, UsageError, VerificationError
from specbuild.package.build_record import BUILD_INFO, BuildLimits, BuildRecord, Engine
from specbuild.package.contract import ORCHESTRATOR_MODEL
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, LAUNCH_SETTINGS, BundledPlan, LaunchPlan
from specbuild.spec import ROLES
from specbuild.spec_section import RuntimeSettings
from specbuild.speculation.modes import VerificationMode
from specbuild.speculation.schedule import DraftLenSchedule

if TYPE_CHECKING:
    from specbuild.checkpoint.info import CheckpointInfo
    from specbuild.package.backend_contract import EngineModel
    from specbuild.package.manifest import Release
    from specbuild.runtimes.pod_plans import DeployOptions, PodPlan, ReleaseFootprint
    from specbuild.spec import BuildSpec, Role

Step = Literal["check", "convert", "build", "package"]
STEPS: tuple[Step, ...] = ("check", "convert", "build", "package")
# What a runtime's reads are declared for: its steps, and "plan", the build records it plans for engines not
# built here (packaged alone: ``planned_record``).
ReadsOf = Literal["check", "convert", "build", "package", "plan"]

# The spec fields the default repository renderer reads (:meth:`Runtime.render_repository`: the load policy, and
# package/repository.py's ensemble, orchestrator and preprocessing configs), besides the engine models'. Of the
# capture section, the orchestrator reads all but claim_size (deploy's alone: no compile step reads it).
RENDER_READS: tuple[str, ...] = (
    "speculation.acceptance", "speculation.adaptive", "speculation.busy_in_flight",
    "speculation.draft_len_schedule", "speculation.num_draft_tokens", "speculation.prompt_lookup",
    "triton.max_request_seconds", "triton.orchestrator_instances", "speculation.break_even", "speculation.draft_cost",
    "speculation.verify_cost", "speculation.measured_acceptance", "speculation.verification",
    "speculation.draft_context",
    "capture.enabled", "capture.max_file_mib", "capture.max_file_hours", "capture.retention_days")


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
    """What the check step found that engine configs need: the memory plan's KV split and token caps, and the
    models' cost ratio (the release's cost model where nothing was measured)."""

    kv_fractions: Mapping[str, float]
    kv_tokens: Mapping[str, int]
    cost_ratio: float | None = None  # a draft token's multiply-adds over a target token's: c where none was measured


@dataclass(frozen=True)
class ReleaseContents:
    """What a finished release holds besides its repository, as its manifest records it."""

    engines: Path | None  # the engines folder it serves; None: none (not built here, or a runtime without engines)
    checkpoints: dict[str, str] = field(default_factory=dict)  # the checkpoints it serves in their place, by role
    build_info: dict[str, BuildRecord] | None = None  # each engine's build record (planned, without engines)
    servable: bool = True  # False: packaged without the engines it needs (for inspection only)


class Runtime(abc.ABC):
    """One way to build and serve the target and draft; see the module notes."""

    name: ClassVar[str]
    # Its part of the build spec (:mod:`specbuild.runtimes.settings`): its sections, its rank for ``runtime: auto``
    # and its load policy's default.
    settings: ClassVar[RuntimeSettings]
    steps: ClassVar[tuple[Step, ...]] = STEPS  # its compile pipeline, in order
    # Verification rules the runtime can run, preferred first (speculation.acceptance falls back to the first).
    acceptances: ClassVar[tuple[str, ...]] = ("draft-logits", "token-match")
    # How its target judges draft logits (speculation.verification): TensorRT-LLM's engines verify them themselves,
    # token by token; specbuild's own rules (speculation.rules) also verify the drafted block as a whole.
    verifications: ClassVar[tuple[VerificationMode, ...]] = ("token",)
    # The Triton model that answers each request and exports the requests in flight (stats.IN_FLIGHT, under its
    # name as label ``model``): what autoscaling follows.
    serving_model: ClassVar[str] = ORCHESTRATOR_MODEL
    # The p95 time to first token (seconds) above which the release's alert fires unless ``deploy --ttft-p95`` sets
    # another: a GPU release answers within a few hundred milliseconds when it keeps up with its load.
    ttft_p95_seconds: ClassVar[float] = 2.0
    # The spec keys a launch of a compiled release may set (``serve``/``deploy --set``); the rest is compiled in.
    launch_settings: ClassVar[frozenset[str]] = LAUNCH_SETTINGS
    # The spec fields (dotted; a section: all of its fields) this runtime's methods read in each step: its spec
    # findings in check, convert, build, its engine models or own renderer in package, planned_record in plan.
    # The compiler adds what its shared code reads (compiler.SHARED_READS) and hashes them into each step's
    # fingerprint, so a step that reads a field it does not declare would be skipped when that field changes.
    reads: ClassVar[Mapping[ReadsOf, tuple[str, ...]]] = {}
    # Whether its draft engines run a head over a sub-vocabulary (a draft checkpoint's head_vocabulary.json);
    # where not, it serves the draft's full head and check says so (a warning naming the runtime that cuts it).
    sub_vocabulary_heads: ClassVar[bool] = False
    # Whether the image's transformers (4.57, TensorRT-LLM 1.2.x) reads the user's checkpoint folders as they are,
    # not a copy specbuild wrote: check then refuses a config.json whose RoPE that transformers would misread.
    reads_checkpoints_in_image: ClassVar[bool] = False

    # --- compiling ---------------------------------------------------------------------------------------
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

    def engine_model(self, spec: BuildSpec, engine: Engine, repository: Path,
                     context: PackageContext) -> EngineModel:
        """How the engine model serving ``engine`` from ``repository`` is configured (backend, parameters,
        instances, python model)."""
        raise self._no_engines()

    def draft_positions(self, spec: BuildSpec, role: Role) -> int:
        """The drafted tokens the engine of ``role`` verifies per round at most: the target's ``max_draft_len``
        (requests choose up to it), none for the draft."""
        return spec.speculation.max_draft_len if role == "target" else 0

    def record_limits(self, spec: BuildSpec, role: Role) -> BuildLimits:
        """What the engine of ``role`` is built for: the spec's (resolved) limits for that model (the draft's own
        window, :meth:`~specbuild.spec.LimitsSpec.of`) and its draft positions."""
        limits = spec.limits.of(role)
        return BuildLimits(max_batch_size=limits.max_batch_size, max_input_len=limits.max_input_len,
                           max_seq_len=limits.max_seq_len, max_draft_len=self.draft_positions(spec, role))

    def load_policy(self, spec: BuildSpec) -> DraftLenSchedule:
        """The load policy: ``speculation.draft_len_schedule``, else ``busy_in_flight`` (this runtime's default
        when unset) as its simplest schedule."""
        return spec.speculation.load_schedule(self.settings.load_default.in_flight)

    def _no_engines(self) -> UsageError:
        return UsageError(f"the {self.name} runtime builds no engines", "run `specbuild compile` (check and package)")

    @abc.abstractmethod
    def planned_record(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo) -> BuildRecord:
        """The build record the engine of ``role`` would get: what packaging needs to render the repository for
        engines not built here (for a runtime without engines: the model's limits)."""

    def memory_device(self, spec: BuildSpec) -> Literal["GPU", "CPU"]:
        """Where the models' memory is (what the memory plan is checked against): a GPU by default."""
        return "GPU"

    def spec_findings(self, spec: BuildSpec) -> list[SpecFinding]:
        """Spec settings this runtime cannot honour (``check`` reports them with the pair's findings)."""
        return []

    def served_logits_width(self, logits_width: int, tp_size: int) -> int:
        """How many logits a model with an output head ``logits_width`` wide returns when split over ``tp_size``
        GPUs (what draft-logits acceptance compares): the checkpoint's width, unless the runtime pads it."""
        return logits_width

    def built_engines(self, spec: BuildSpec) -> dict[Role, Engine] | None:
        """The engines in ``outputs.engines_dir`` when both are built for this runtime, else None (nothing built
        there). Engines of another runtime are refused: packaging them would mix runtimes."""
        engines = Path(spec.outputs.engines_dir)
        if not any((engines / role / BUILD_INFO).is_file() for role in ROLES):
            return None
        try:
            built = {role: Engine(engines / role, BuildRecord.read(engines / role)) for role in ROLES}
        except VerificationError as exc:
            raise StageError("package", exc.message, f"rebuild the engines with `specbuild build` ({exc.fix})") from None
        for engine in built.values():
            if engine.record.runtime != self.name:
                raise StageError("package", f"{engine.path} holds a {engine.record.runtime} engine, but the spec's "
                                 f"runtime is {self.name}", "run `specbuild compile` for this runtime, or set "
                                 "outputs.engines_dir to the folder of its engines")
        return built

    def planned_engines(self, spec: BuildSpec, checkpoints: Mapping[Role, CheckpointInfo]) -> dict[Role, Engine]:
        """What packaging needs of engines that are not built here: the build records this runtime would write."""
        engines = Path(spec.outputs.engines_dir)
        return {role: Engine(engines / role, self.planned_record(spec, role, checkpoint))
                for role, checkpoint in checkpoints.items()}

    def packaged_engines(self, spec: BuildSpec, checkpoints: Mapping[Role, CheckpointInfo], *,
                         package_only: bool) -> dict[Role, Engine]:
        """The engines the repository is rendered for: those built in ``outputs.engines_dir``, or, packaged alone
        where none are built (``specbuild package`` without a GPU), those this runtime would build."""
        built = self.built_engines(spec)
        if built is None and package_only:
            return self.planned_engines(spec, checkpoints)
        return built or {}

    def release_contents(self, spec: BuildSpec, checkpoints: Mapping[Role, CheckpointInfo]) -> ReleaseContents:
        """What the packaged release holds besides its repository: the built engines, when they are."""
        built = self.built_engines(spec)
        if built is None:
            return ReleaseContents(engines=None, servable=False)
        return ReleaseContents(engines=Path(spec.outputs.engines_dir),
                               build_info={role: engine.record for role, engine in built.items()})

    def render_repository(self, spec: BuildSpec, engines: Mapping[str, Engine], tokenizer_dir: Path,
                          output_dir: Path, context: PackageContext) -> None:
        """Write the whole Triton repository into ``output_dir``: by default the engine-model layout of
        :func:`specbuild.package.repository.render_repository`."""
        from specbuild.package.repository import render_repository

        models = {role: self.engine_model(spec, engine, output_dir, context) for role, engine in engines.items()}
        render_repository(spec, engines, models, tokenizer_dir, output_dir, self.load_policy(spec),
                          spec.speculation.cost_model(context.cost_ratio))

    # --- serving -----------------------------------------------------------------------------------------
    def check_compiled_layout(self, repository: Path, spec: BuildSpec) -> None:
        """Refuse a release whose compiled configs disagree with the layout ``spec`` launches it with (naming the
        model and the key); by default nothing compiled depends on the layout."""

    @abc.abstractmethod
    def launch_plan(self, spec: BuildSpec, repository: Path, engines: Path, checkpoints: Mapping[str, Path], *,
                    gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan | BundledPlan:
        """How the release of ``spec`` in ``repository`` (its ``engines``, or the ``checkpoints`` it serves)
        starts: a container of this runtime's image, refused where it needs more than ``gpus`` GPUs, or the
        Triton server bundled with specbuild."""

    @abc.abstractmethod
    def pod_plan(self, spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
        """The serving container of each replica of a deployment (``specbuild deploy``)."""

    def rehearsal_repository(self, release: Release, destination: Path) -> Path:
        """A copy of ``release``'s repository in ``destination`` that the bundled Triton server serves on a CPU, in
        place of the GPU image: for runtimes with a CPU stand-in."""
        raise UsageError(f"{release.repository} is a {self.name} release; only releases whose runtime serves the "
                         "checkpoints through TensorRT-LLM's LLM API have a CPU stand-in",
                         "serve a torch release with `specbuild serve`, or compile with --runtime tensorrt-llm-llmapi")
