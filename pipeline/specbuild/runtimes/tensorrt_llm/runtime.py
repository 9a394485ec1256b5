"""The ``tensorrt-llm`` runtime: HF checkpoint -> TensorRT-LLM checkpoint -> engine, and its Triton config.

Everything is planned first (:mod:`specbuild.runtimes.tensorrt_llm.engine_plans`), as typed values built from a
:class:`~specbuild.spec.BuildSpec` (pure, deterministic, JSON-able: what ``--dry-run`` prints), and executed second
here behind lazy imports, so
specbuild imports, plans and tests without TensorRT-LLM. Names follow the TensorRT-LLM 1.2.x engine flow
(``tensorrt_llm/commands/build.py``, ``builder.py``, ``plugin/plugin.py``, ``models/__init__.py``,
``examples/draft_target_model/README.md``) and the ``tensorrtllm`` backend's model config
(tensorrtllm_backend v0.19.0 ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``).

Rules encoded here (TensorRT-LLM 1.2 ``examples/draft_target_model/README.md`` and ``tensorrt_llm/commands/build.py``):

* target engine: ``speculative_decoding_mode=draft_tokens_external`` and ``max_draft_len``;
  draft engine: a plain engine, with ``gather_generation_logits`` only for ``draft-logits`` acceptance;
* both: paged KV cache and paged context FMHA (KV-cache block reuse makes re-sending the sequence each
  round cheap), ``gemm_plugin=auto``, beam width 1, logits in float32 (the Triton config declares FP32);
* never ``gather_context_logits`` (an error together with ``max_draft_len > 0``);
* fp16/bf16 only, no quantization; GPU SM >= 8.0 at build time.

Guided decoding is the backend's own (:mod:`specbuild.package.backend_guides`): the target engine model gets
``guided_decoding_backend: xgrammar`` and the tokenizer info file packaging writes beside its config; the draft
none. The 1.2.x C++ executor does not combine guided decoding with external draft tokens: its guided decoder
(``cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp``) keeps one token bitmask per sequence slot per step and
advances its matcher by the request's last token (``getLastTokens(0)``), one per step, so drafted positions would
go unmasked and accepted tokens unfed; nothing refuses the combination (``trtGptModelInflightBatching.cpp`` runs
the guided decoder whenever it is configured). Its matcher starts at each request's first new token, too. So the
orchestrator runs a guided request on the target alone, its whole answer in one call with NVIDIA's guide inputs
(``OrchestratorParameters.engine_guides``), counted in ``specbuild_guided_target_only_requests_total``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from specbuild.errors import SpecbuildError, UsageError
from specbuild.package.backend_contract import EngineModel, EngineParameters
from specbuild.package.backend_guides import TOKENIZER_INFO_FILE, XGRAMMAR, write_tokenizer_info
from specbuild.package.build_record import BuildLimits, BuildRecord, Engine, GpuInfo
from specbuild.package.contract import ORCHESTRATOR_MODEL, TARGET_MODEL
from specbuild.package.repository import shipped_tokenizer
from specbuild.runtimes.interface import RENDER_READS, ModelPlan, PackageContext, SpecFinding
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, LaunchPlan
from specbuild.runtimes.names import TENSORRT_LLM
from specbuild.runtimes.tensorrt_llm.engine_plans import (SUPPORTED_ARCHITECTURES, TENSORRT_LLM_SERIES, BuildPlan,
                                                           ConvertPlan, EnginePlan, build_plan, convert_plan,
                                                           format_plan)
from specbuild.runtimes.tensorrt_llm.launch import check_engine_configs, launch_plan, model_devices
from specbuild.runtimes.tensorrt_llm.settings import TENSORRT_LLM_SETTINGS
from specbuild.runtimes.trtllm_image import ImageRuntime, installed_package_dir, resolve_dtype
from specbuild.spec import BuildSpec, Role

if TYPE_CHECKING:
    from specbuild.checkpoint.info import CheckpointInfo

MIN_SM = (8, 0)
TENSORRTLLM_BACKEND = "tensorrtllm"  # the Triton backend that serves the engines
_PLAN_JSON = TypeAdapter(EnginePlan)


# --- execution (needs TensorRT-LLM 1.2.x and a CUDA GPU) -----------------------------------------------
def require_tensorrt_llm(image: str) -> ModuleType:
    """Import ``tensorrt_llm`` or say how to get it; refuse series other than 1.2 (engines left main in 1.3)."""
    fix = (f"run specbuild inside the NGC image {image} (it ships TensorRT-LLM {TENSORRT_LLM_SERIES}.x), "
           "or use --runtime torch, or add --dry-run to only print the plan")
    try:
        import tensorrt_llm
    except (ImportError, OSError) as exc:
        raise SpecbuildError(f"the tensorrt-llm runtime needs the tensorrt_llm package, which cannot be imported "
                             f"here ({exc})", fix) from None
    version = str(getattr(tensorrt_llm, "__version__", "unknown"))
    if version.split(".")[:2] != TENSORRT_LLM_SERIES.split("."):
        raise SpecbuildError(f"TensorRT-LLM {version} is installed; the engine flow needs {TENSORRT_LLM_SERIES}.x", fix)
    return tensorrt_llm


def check_sm(name: str, major: int, minor: int) -> None:
    """Draft-target engines need compute capability 8.0 or newer (Ampere+)."""
    if (major, minor) < MIN_SM:
        raise SpecbuildError(
            f"GPU {name} has compute capability {major}.{minor}; TensorRT-LLM draft-target engines need "
            f"{MIN_SM[0]}.{MIN_SM[1]} or newer",
            "build on an Ampere or newer GPU (A100, L4, L40S, H100, ...), or use --runtime torch",
        )


def _gpu_info() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise SpecbuildError("no CUDA GPU is visible; TensorRT-LLM builds engines on the GPU they will run on",
                             "run on a machine with a GPU (docker run --gpus all ...), or use --runtime torch")
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    check_sm(name, major, minor)
    return {"name": name, "sm": f"{major}.{minor}", "cuda": torch.version.cuda}


def convert(plan: ConvertPlan, into: str | Path | None = None) -> Path:
    """Run ``plan``: ``from_hugging_face`` + ``save_checkpoint`` per rank into ``into`` (or ``plan.output_dir``)."""
    require_tensorrt_llm(plan.image)
    import tensorrt_llm.models as trtllm_models
    from tensorrt_llm.mapping import Mapping

    model_class = getattr(trtllm_models, plan.model_class)
    output = Path(into or plan.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    for mapping in plan.mappings:
        model = model_class.from_hugging_face(plan.checkpoint, plan.dtype, mapping=Mapping(**asdict(mapping)))
        model.save_checkpoint(str(output), save_config=mapping.rank == 0)
        del model  # one rank's weights in memory at a time
    return output


def build(plan: BuildPlan, into: str | Path | None = None) -> Path:
    """Run ``plan``: ``build()`` + ``Engine.save`` per rank, then ``build_info.json``; returns the engine folder."""
    trtllm = require_tensorrt_llm(plan.image)
    gpu = _gpu_info()
    import tensorrt
    from tensorrt_llm.builder import BuildConfig
    from tensorrt_llm.builder import build as build_engine
    from tensorrt_llm.models import MODEL_MAP, PretrainedConfig
    from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode
    from tensorrt_llm.plugin import PluginConfig

    config = PretrainedConfig.from_json_file(str(Path(plan.checkpoint_dir) / "config.json"))
    if config.mapping.world_size != plan.world_size:
        raise UsageError(f"{plan.checkpoint_dir} was converted for {config.mapping.world_size} rank(s), the plan "
                         f"builds {plan.world_size}", "convert the checkpoint again with the current spec")
    config.logits_dtype = plan.logits_dtype
    kwargs = dict(plan.build_config)
    if "speculative_decoding_mode" in kwargs:
        kwargs["speculative_decoding_mode"] = SpeculativeDecodingMode[kwargs["speculative_decoding_mode"].upper()]
    build_config = BuildConfig(**kwargs, plugin_config=PluginConfig(**plan.plugin_config))
    output = Path(into or plan.output_dir)
    for rank in range(plan.world_size):
        rank_config = copy.deepcopy(config)
        rank_config.set_rank(rank)
        model = MODEL_MAP[config.architecture].from_checkpoint(plan.checkpoint_dir, config=rank_config)
        build_engine(model, build_config).save(str(output))
        del model
    toolchain = {"tensorrt_llm": str(trtllm.__version__), "tensorrt": str(tensorrt.__version__),
                 "cuda": str(gpu.pop("cuda"))}
    engine_record(plan.role, output, toolchain, GpuInfo(**gpu)).write(output)
    return output


def engine_record(role: Role, engine_dir: Path, toolchain: dict[str, str], gpu: GpuInfo) -> BuildRecord:
    """The build record of the engine TensorRT-LLM wrote into ``engine_dir``, from its ``config.json`` (TensorRT-LLM's
    format: ``build_config`` and ``pretrained_config``; ``trtllm-build`` adds the draft positions to the target's
    ``max_seq_len`` itself)."""
    config = json.loads((engine_dir / "config.json").read_text(encoding="utf-8"))
    build_config, pretrained = config["build_config"], config["pretrained_config"]
    limits = BuildLimits.from_engine_seq_len(
        int(build_config["max_seq_len"]), max_draft_len=int(build_config.get("max_draft_len") or 0),
        max_batch_size=int(build_config["max_batch_size"]), max_input_len=int(build_config["max_input_len"]))
    return BuildRecord(runtime=TENSORRT_LLM, role=role, dtype=pretrained["dtype"], vocab_size=pretrained["vocab_size"],
                       architecture=pretrained["architecture"], limits=limits,
                       generation_logits=bool(build_config.get("gather_generation_logits")), toolchain=toolchain,
                       gpu=gpu)


# --- the runtime ---------------------------------------------------------------------------------------
def engine_flow_installed() -> bool:
    """Whether the installed TensorRT-LLM still has the engine flow: ``tensorrt_llm/builder.py`` went with
    ``trtllm-build`` in TensorRT-LLM PR #15918 (July 2026)."""
    package = installed_package_dir()
    return package is not None and (package / "builder.py").is_file()


# What build_plan reads: each model's ranks, the engine's draft settings, the image named when TensorRT-LLM is missing.
BUILD_READS = ("target.tp_size", "target.pp_size", "draft.tp_size", "draft.pp_size", "speculation.acceptance",
               "speculation.max_draft_len", "triton.image")


class TensorRTLLMRuntime(ImageRuntime):
    """TensorRT-LLM 1.2.x engines served by Triton's ``tensorrtllm`` backend (a CUDA GPU, the NGC image)."""

    name = TENSORRT_LLM
    settings = TENSORRT_LLM_SETTINGS
    reads = {"check": ("triton.tensorrt_llm",), "convert": ("target", "draft", "triton.image"),
             "build": BUILD_READS, "plan": (*BUILD_READS, "target.dtype", "draft.dtype"),
             "package": (*RENDER_READS, "target.tp_size", "target.pp_size", "draft.tp_size", "draft.pp_size", "launch",
                         "triton.engine_mount", "triton.repository_mount", "triton.kv_cache_free_gpu_mem_fraction")}

    def available(self) -> bool:
        return engine_flow_installed()

    def spec_findings(self, spec: BuildSpec) -> list[SpecFinding]:
        if spec.triton.tensorrt_llm == TENSORRT_LLM_SERIES:
            return []
        return [SpecFinding("tensorrt-llm-line", f"triton.tensorrt_llm is {spec.triton.tensorrt_llm}, whose "
                            "TensorRT-LLM has no engine flow (removed in July 2026)",
                            f"use --runtime tensorrt-llm-llmapi, or an image with TensorRT-LLM {TENSORRT_LLM_SERIES}.x "
                            f"and --set triton.tensorrt_llm={TENSORRT_LLM_SERIES}")]

    def unsupported(self, architecture: str) -> str | None:
        if architecture in SUPPORTED_ARCHITECTURES:
            return None
        return (f"TensorRT-LLM {TENSORRT_LLM_SERIES}.x's engine flow does not convert {architecture} here "
                f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})")

    def engine_dtype(self, requested: str, role: Role, checkpoint_dtype: str | None) -> str:
        return resolve_dtype(requested, role, checkpoint_dtype)

    def plan(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, converted: Path,
             engine: Path) -> ModelPlan:
        plan = EnginePlan(convert_plan(spec, role, checkpoint.architecture, converted,
                                       checkpoint_dtype=checkpoint.torch_dtype),
                          build_plan(spec, role, converted, engine))
        return ModelPlan(role, _PLAN_JSON.dump_python(plan, mode="json"), format_plan(plan))

    def convert(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, output: Path) -> None:
        convert(convert_plan(spec, role, checkpoint.architecture, output, checkpoint_dtype=checkpoint.torch_dtype),
                into=output)

    def build(self, spec: BuildSpec, role: Role, converted: Path, output: Path) -> None:
        build(build_plan(spec, role, converted, output), into=output)

    def planned_record(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo) -> BuildRecord:
        plan = build_plan(spec, role, Path("."), Path("."))
        return BuildRecord(runtime=self.name, role=role,
                           dtype=self.engine_dtype(getattr(spec, role).dtype, role, checkpoint.torch_dtype),
                           vocab_size=checkpoint.vocab_size, architecture=checkpoint.architecture,
                           limits=self.record_limits(spec, role),
                           generation_logits=bool(plan.build_config.get("gather_generation_logits")))

    def engine_model(self, spec: BuildSpec, engine: Engine, repository: Path,
                     context: PackageContext) -> EngineModel:
        """The ``tensorrtllm`` backend, one instance (it places the engine on its GPUs itself). Engines at
        ``engine_mount`` inside the container; the KV-cache split of the memory plan (or the spec's total, split
        the same way), capped at the planned KV tokens (each fraction applies to the memory free when that engine
        loads, so the cap keeps the first one honest); devices from the launch layout."""
        total = spec.triton.kv_cache_free_gpu_mem_fraction
        fraction = context.kv_fractions[engine.role]
        if total is not None:
            fraction = total * fraction / max(1e-9, sum(context.kv_fractions.values()))
        devices = model_devices(spec)[engine.role]
        guided = engine.role == TARGET_MODEL  # guided requests run on the target alone (the module notes)
        return EngineModel(TENSORRTLLM_BACKEND, EngineParameters(
            gpt_model_path=f"{spec.triton.engine_mount.rstrip('/')}/{engine.role}",
            guided_decoding_backend=XGRAMMAR if guided else "",
            xgrammar_tokenizer_info_path=f"{spec.triton.repository_mount.rstrip('/')}/{TARGET_MODEL}/"
                                         f"{TOKENIZER_INFO_FILE}" if guided else "",
            kv_cache_free_gpu_mem_fraction=round(fraction, 4),
            max_tokens_in_paged_kv_cache=context.kv_tokens[engine.role],
            enable_chunked_context=True,  # long prompts in chunks; needs the paged context FMHA engines are built with
            exclude_input_in_output=True,  # only new tokens; requests may override per call
            gpu_device_ids=devices.gpu_device_ids,
            participant_ids=devices.participant_ids,
            speculative_decoding_fast_logits=devices.fast_logits,
        ))

    def render_repository(self, spec: BuildSpec, engines: Mapping[str, Engine], tokenizer_dir: Path,
                          output_dir: Path, context: PackageContext) -> None:
        """The engine-model repository, and the target's tokenizer info beside its config (what its
        ``xgrammar_tokenizer_info_path`` names inside the container), made from the portable tokenizer copy the
        release ships (one saved by transformers 5 does not load as it is in the image's transformers 4.57)."""
        super().render_repository(spec, engines, tokenizer_dir, output_dir, context)
        write_tokenizer_info(shipped_tokenizer(output_dir / ORCHESTRATOR_MODEL), output_dir / TARGET_MODEL)

    def check_compiled_layout(self, repository: Path, spec: BuildSpec) -> None:
        check_engine_configs(repository, spec)

    def launch_plan(self, spec: BuildSpec, repository: Path, engines: Path, checkpoints: Mapping[str, Path], *,
                    gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
        return launch_plan(spec, repository, engines, gpus=gpus, shm_gib=shm_gib)
