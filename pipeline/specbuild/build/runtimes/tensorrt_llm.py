"""The ``tensorrt-llm`` runtime: HF checkpoint -> TensorRT-LLM checkpoint -> engine, and its Triton config.

Everything here is planned first, as typed values built from a :class:`~specbuild.spec.BuildSpec`
(pure, deterministic, JSON-able: what ``--dry-run`` prints), and executed second behind lazy imports, so
specbuild imports, plans and tests without TensorRT-LLM. Names follow the TensorRT-LLM 1.2.x engine flow
(``tensorrt_llm/commands/build.py``, ``builder.py``, ``plugin/plugin.py``, ``models/__init__.py``,
``examples/draft_target_model/README.md``) and the ``tensorrtllm`` backend's model config
(tensorrtllm_backend v0.19.0 ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``).

Rules encoded here (see ``/work/shared/reference/trtllm-engine-flow.md``):

* target engine: ``speculative_decoding_mode=draft_tokens_external`` and ``max_draft_len``;
  draft engine: a plain engine, with ``gather_generation_logits`` only for ``draft-logits`` acceptance;
* both: paged KV cache and paged context FMHA (KV-cache block reuse makes re-sending the sequence each
  round cheap), ``gemm_plugin=auto``, beam width 1, logits in float32 (the Triton config declares FP32);
* never ``gather_context_logits`` (an error together with ``max_draft_len > 0``);
* fp16/bf16 only, no quantization; GPU SM >= 8.0 at build time.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import TypeAdapter

from specbuild.package import contract
from specbuild.errors import CheckpointError, SpecbuildError, SpecError, UsageError
from specbuild.spec import BuildSpec
from specbuild.build.runtimes import BUILD_INFO

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

Role = Literal["target", "draft"]
EngineDtype = Literal["float16", "bfloat16"]
SchedulerPolicy = Literal["guaranteed_no_evict", "max_utilization"]

ROLES: tuple[Role, ...] = ("target", "draft")
TENSORRT_LLM_SERIES = "1.2"
LOGITS_DTYPE = "float32"  # engine logits; the Triton config's logits tensors are TYPE_FP32 to match
MIN_SM = (8, 0)


@dataclass(frozen=True)
class ModelFamily:
    """A TensorRT-LLM model class with ``from_hugging_face`` and the folder of its ``convert_checkpoint.py``."""

    model_class: str
    example_dir: str  # relative to a TensorRT-LLM 1.2 source checkout
    pipeline_parallel: bool = True


_LLAMA = ModelFamily("LLaMAForCausalLM", "examples/models/core/llama")
_QWEN = ModelFamily("QWenForCausalLM", "examples/models/core/qwen")
_PHI = ModelFamily("PhiForCausalLM", "examples/models/core/phi", pipeline_parallel=False)
_PHI3 = ModelFamily("Phi3ForCausalLM", "examples/models/core/phi", pipeline_parallel=False)
_GPT = ModelFamily("GPTForCausalLM", "examples/models/core/gpt")
_FALCON = ModelFamily("FalconForCausalLM", "examples/models/contrib/falcon")

# HF ``architectures[0]`` -> family: MODEL_MAP entries whose example converts with ``from_hugging_face``
# and the common ``--model_dir/--output_dir/--dtype/--tp_size/--pp_size`` flags. Gemma is left out: its
# example uses another flow (``--world_size``, ``--output_model_dir``, no pipeline parallelism).
SUPPORTED_ARCHITECTURES: dict[str, ModelFamily] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "MixtralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _QWEN,
    "Qwen3ForCausalLM": _QWEN,
    "PhiForCausalLM": _PHI,
    "Phi3ForCausalLM": _PHI3,
    "GPT2LMHeadModel": _GPT,
    "GPTBigCodeForCausalLM": _GPT,
    "Starcoder2ForCausalLM": _GPT,
    "FalconForCausalLM": _FALCON,
    "RWForCausalLM": _FALCON,
}


# --- plans ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankMapping:
    """The arguments of ``tensorrt_llm.Mapping`` for one rank."""

    world_size: int
    rank: int
    tp_size: int
    pp_size: int


@dataclass(frozen=True)
class ConvertPlan:
    """HF checkpoint -> TensorRT-LLM checkpoint (``config.json`` + ``rank{N}.safetensors``)."""

    role: Role
    checkpoint: str
    architecture: str
    model_class: str
    dtype: EngineDtype
    output_dir: str
    mappings: tuple[RankMapping, ...]
    image: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class BuildPlan:
    """TensorRT-LLM checkpoint -> engine (``config.json`` + ``rank{N}.engine`` + ``build_info.json``).

    ``build_config`` holds the ``BuildConfig`` keyword arguments (``speculative_decoding_mode`` by its
    ``trtllm-build`` name), ``plugin_config`` the ``PluginConfig`` ones.
    """

    role: Role
    checkpoint_dir: str
    output_dir: str
    world_size: int
    build_config: dict[str, Any]
    plugin_config: dict[str, Any]
    logits_dtype: str
    image: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class EnginePlan:
    """Both steps for one model."""

    convert: ConvertPlan
    build: BuildPlan


def resolve_dtype(spec: BuildSpec, role: Role, checkpoint_dtype: str | None) -> EngineDtype:
    """The engine dtype: the spec's, or for ``auto`` the checkpoint's ``torch_dtype``.

    ``auto`` follows ``convert_checkpoint.py --dtype auto``: a float32 (or unrecorded) checkpoint becomes
    float16. float32 engines are refused: this runtime builds fp16/bf16 engines only.
    """
    requested = getattr(spec, role).dtype
    if requested == "float32":
        raise SpecError(
            f"{role}.dtype is float32, which the tensorrt-llm runtime does not build (fp16/bf16 engines only)",
            f"set {role}.dtype to bfloat16, float16 or auto, or use --runtime torch for float32",
        )
    if requested != "auto":
        return requested
    found = (checkpoint_dtype or "float32").removeprefix("torch.")
    if found in ("float16", "bfloat16"):
        return found
    if found == "float32":
        return "float16"
    raise CheckpointError(
        f"the {role} checkpoint's config.json records torch_dtype {checkpoint_dtype!r}, which is not a float type",
        f"set {role}.dtype to bfloat16 or float16 explicitly",
    )


def model_family(architecture: str, role: Role) -> ModelFamily:
    try:
        return SUPPORTED_ARCHITECTURES[architecture]
    except KeyError:
        raise CheckpointError(
            f"the {role} checkpoint's architecture {architecture!r} is not one the tensorrt-llm runtime converts",
            f"use one of {', '.join(sorted(SUPPORTED_ARCHITECTURES))}, or use --runtime torch",
        ) from None


def rank_mappings(spec: BuildSpec, role: Role) -> tuple[RankMapping, ...]:
    model = getattr(spec, role)
    return tuple(RankMapping(model.world_size, rank, model.tp_size, model.pp_size) for rank in range(model.world_size))


def _flag(name: str, value: Any) -> str:
    return f"--{name}={value}"


def convert_plan(spec: BuildSpec, role: Role, architecture: str, output_dir: str | Path, *,
                 checkpoint_dtype: str | None = None) -> ConvertPlan:
    """Plan the conversion of ``spec.<role>.checkpoint`` (HF ``architectures[0]`` = ``architecture``)."""
    model = getattr(spec, role)
    family = model_family(architecture, role)
    if model.pp_size > 1 and not family.pipeline_parallel:
        raise SpecError(
            f"{role}.pp_size is {model.pp_size}, but TensorRT-LLM converts {architecture} without pipeline parallelism",
            f"set {role}.pp_size: 1 (use tp_size to split the model over GPUs)",
        )
    dtype = resolve_dtype(spec, role, checkpoint_dtype)
    output = str(output_dir)
    argv = ("python3", f"{family.example_dir}/convert_checkpoint.py",
            _flag("model_dir", model.checkpoint), _flag("output_dir", output), _flag("dtype", dtype),
            _flag("tp_size", model.tp_size), _flag("pp_size", model.pp_size), _flag("workers", 1))
    return ConvertPlan(role=role, checkpoint=model.checkpoint, architecture=architecture,
                       model_class=family.model_class, dtype=dtype, output_dir=output,
                       mappings=rank_mappings(spec, role), image=spec.triton.image, argv=argv)


def _build_argv(checkpoint_dir: str, output_dir: str, build_config: dict[str, Any]) -> tuple[str, ...]:
    argv = ["trtllm-build", _flag("checkpoint_dir", checkpoint_dir), _flag("output_dir", output_dir),
            _flag("gemm_plugin", "auto"), _flag("use_paged_context_fmha", "enable"), _flag("kv_cache_type", "paged"),
            _flag("logits_dtype", LOGITS_DTYPE)]
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width"):
        argv.append(_flag(name, build_config[name]))
    if "speculative_decoding_mode" in build_config:
        argv += [_flag("speculative_decoding_mode", build_config["speculative_decoding_mode"]),
                 _flag("max_draft_len", build_config["max_draft_len"])]
    if build_config.get("gather_generation_logits"):
        argv.append("--gather_generation_logits")
    return tuple(argv)


def build_plan(spec: BuildSpec, role: Role, checkpoint_dir: str | Path, output_dir: str | Path) -> BuildPlan:
    """Plan the engine build of one model from its converted checkpoint."""
    limits = spec.limits
    build_config: dict[str, Any] = {
        "max_batch_size": limits.max_batch_size,
        "max_input_len": limits.max_input_len,
        "max_seq_len": limits.max_seq_len,  # build() adds max_draft_len to it for the target by itself
        "max_beam_width": 1,  # beam search does not combine with draft-target decoding
    }
    if role == "target":
        build_config["speculative_decoding_mode"] = "draft_tokens_external"
        build_config["max_draft_len"] = spec.speculation.max_draft_len
    elif spec.speculation.acceptance == "draft-logits":
        build_config["gather_generation_logits"] = True
    plugin_config = {"gemm_plugin": "auto", "paged_kv_cache": True, "use_paged_context_fmha": True}
    checkpoint, output = str(checkpoint_dir), str(output_dir)
    return BuildPlan(role=role, checkpoint_dir=checkpoint, output_dir=output,
                     world_size=getattr(spec, role).world_size, build_config=build_config,
                     plugin_config=plugin_config, logits_dtype=LOGITS_DTYPE, image=spec.triton.image,
                     argv=_build_argv(checkpoint, output, build_config))


def default_dirs(spec: BuildSpec, role: Role) -> tuple[Path, Path]:
    """Default folders for a role: checkpoint in ``build/tensorrt-llm/<role>``, engine in ``engines/<role>``."""
    return Path(spec.outputs.build_dir) / "tensorrt-llm" / role, Path(spec.outputs.engines_dir) / role


def engine_plan(spec: BuildSpec, role: Role, architecture: str, *, checkpoint_dtype: str | None = None) -> EnginePlan:
    """Convert + build for one role, in the default folders."""
    checkpoint_dir, engine_dir = default_dirs(spec, role)
    return EnginePlan(convert_plan(spec, role, architecture, checkpoint_dir, checkpoint_dtype=checkpoint_dtype),
                      build_plan(spec, role, checkpoint_dir, engine_dir))


_PLAN_JSON = TypeAdapter(EnginePlan)


def plan_as_dict(plans: Sequence[EnginePlan]) -> dict[str, Any]:
    """What ``compile --dry-run --json`` emits for this runtime."""
    return {
        "runtime": "tensorrt-llm",
        "tensorrt_llm": f"{TENSORRT_LLM_SERIES}.x",
        "models": {plan.convert.role: _PLAN_JSON.dump_python(plan, mode="json") for plan in plans},
    }


def _call(name: str, kwargs: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in kwargs.items())})"


def format_plan(plans: Sequence[EnginePlan]) -> str:
    """What ``compile --dry-run`` prints for this runtime: every rank, the Python calls and the equivalent CLI."""
    lines = [f"tensorrt-llm runtime (TensorRT-LLM {TENSORRT_LLM_SERIES}.x, run in {plans[0].convert.image})"
             if plans else "tensorrt-llm runtime: nothing to build"]
    for plan in plans:
        conv, bld = plan.convert, plan.build
        lines += [
            "",
            f"{conv.role}: {conv.architecture} -> {conv.model_class}, {conv.dtype}, {len(conv.mappings)} rank(s)",
            f"  convert {conv.checkpoint} -> {conv.output_dir}",
            *(f"    rank {m.rank}: {conv.model_class}.from_hugging_face(dtype={conv.dtype!r}, "
              f"mapping={_call('Mapping', asdict(m))}).save_checkpoint(save_config={m.rank == 0})"
              for m in conv.mappings),
            f"    $ {shlex.join(conv.argv)}",
            f"  build {bld.checkpoint_dir} -> {bld.output_dir} ({bld.world_size} engine(s), logits {bld.logits_dtype})",
            f"    {_call('BuildConfig', bld.build_config)}",
            f"      plugin_config={_call('PluginConfig', bld.plugin_config)}",
            f"    $ {shlex.join(bld.argv)}",
        ]
    return "\n".join(lines)


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
    engine_config = json.loads((output / "config.json").read_text(encoding="utf-8"))
    info = {"runtime": "tensorrt-llm", "role": plan.role, "tensorrt_llm": trtllm.__version__,
            "tensorrt": tensorrt.__version__, "cuda": gpu.pop("cuda"), "gpu": gpu,
            "build_config": engine_config.get("build_config", {}),
            "dtype": engine_config.get("pretrained_config", {}).get("dtype"),
            "vocab_size": engine_config.get("pretrained_config", {}).get("vocab_size")}
    (output / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return output


# --- Triton model config for the tensorrtllm backend ---------------------------------------------------
def _optional_str(value: int | None) -> str | None:
    return None if value is None else str(value)


def _id_list(name: str, ids: list[int] | None) -> str | None:
    if ids is None:
        return None
    if not ids or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
        raise UsageError(f"{name} must be a non-empty list of non-negative integers, got {ids!r}",
                         f"pass e.g. {name}=[0] or [0, 1]")
    return ",".join(str(i) for i in ids)


def engine_model_config(
    spec: BuildSpec,
    role: Role,
    *,
    engine_path: str,
    kv_cache_free_gpu_mem_fraction: float,
    gpu_device_ids: list[int] | None = None,
    participant_ids: list[int] | None = None,
    max_tokens_in_paged_kv_cache: int | None = None,
    max_attention_window_size: int | None = None,
    batch_scheduler_policy: SchedulerPolicy = "guaranteed_no_evict",
    fast_logits: bool = False,
) -> ModelConfig:
    """The ``config.pbtxt`` of one engine model as a ``model_config_pb2.ModelConfig`` message.

    Non-decoupled (the orchestrator calls it with BLS and waits for the whole answer); one CPU instance
    (the backend places the engine on its GPUs itself); the inputs/outputs of ``contract.ENGINE_*``.
    ``engine_path`` is the engine folder as the server sees it (e.g. ``/engines/target``).
    ``fast_logits`` (draft logits passed GPU to GPU) only works in orchestrator mode with
    ``participant_ids`` on both models, so it is refused without them.
    """
    from tritonclient.grpc import model_config_pb2 as mc

    if not engine_path.startswith("/"):
        raise UsageError(f"engine_path {engine_path!r} must be absolute, as the server sees it",
                         f"use e.g. {spec.triton.engine_mount}/{role}")
    if not 0 < kv_cache_free_gpu_mem_fraction < 1:
        raise UsageError(f"kv_cache_free_gpu_mem_fraction is outside (0, 1): {kv_cache_free_gpu_mem_fraction}",
                         "split the GPU's free memory between draft and target, e.g. 0.1 and 0.8")
    if fast_logits and not participant_ids:
        raise UsageError("speculative_decoding_fast_logits needs participant_ids (orchestrator mode)",
                         "pass participant_ids for both models, or leave fast logits off")
    for name, value in (("max_tokens_in_paged_kv_cache", max_tokens_in_paged_kv_cache),
                        ("max_attention_window_size", max_attention_window_size)):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be positive, got {value}", f"leave {name} unset to use the engine's limit")

    config = mc.ModelConfig(name=role, backend="tensorrtllm", max_batch_size=spec.limits.max_batch_size)
    config.model_transaction_policy.decoupled = False
    config.dynamic_batching.SetInParent()
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    for tensor in contract.ENGINE_INPUTS:
        entry = config.input.add(name=tensor.name, data_type=mc.DataType.Value(tensor.dtype), dims=tensor.dims,
                                 optional=tensor.optional)
        if tensor.dims == (1,):
            entry.reshape.SetInParent()  # per-request scalars: the backend reads them without the [1] dim
        elif -1 in tensor.dims:
            entry.allow_ragged_batch = True  # requests of different lengths batch without padding
    for tensor in contract.ENGINE_OUTPUTS:
        config.output.add(name=tensor.name, data_type=mc.DataType.Value(tensor.dtype), dims=tensor.dims)

    parameters: dict[str, str | None] = {
        "gpt_model_path": engine_path,
        "gpt_model_type": "inflight_fused_batching",
        "batch_scheduler_policy": batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": f"{kv_cache_free_gpu_mem_fraction:.6g}",
        "enable_kv_cache_reuse": "true",  # each round re-sends the whole sequence; reuse makes that cheap
        "exclude_input_in_output": "true",  # only new tokens; requests may override per call
        "enable_chunked_context": "true",  # long prompts in chunks; needs the paged context FMHA we build with
        "max_tokens_in_paged_kv_cache": _optional_str(max_tokens_in_paged_kv_cache),
        "max_attention_window_size": _optional_str(max_attention_window_size),
        "gpu_device_ids": _id_list("gpu_device_ids", gpu_device_ids),
        "participant_ids": _id_list("participant_ids", participant_ids),
        "speculative_decoding_fast_logits": "true" if fast_logits else "false",
    }
    for key, value in parameters.items():
        if value is not None:
            config.parameters[key].string_value = value
    return config
