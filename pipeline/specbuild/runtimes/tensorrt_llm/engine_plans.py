"""The ``tensorrt-llm`` runtime's plans: HF checkpoint -> TensorRT-LLM checkpoint (``convert_plan``) -> engine
(``build_plan``), as typed values built from a :class:`~specbuild.spec.BuildSpec` (pure, deterministic, JSON-able:
what ``--dry-run`` prints, :func:`format_plan`); :mod:`specbuild.runtimes.tensorrt_llm.runtime` runs them. Names
follow the TensorRT-LLM 1.2.x engine flow (``tensorrt_llm/commands/build.py``, ``models/__init__.py``)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild.errors import CheckpointError, SpecError
from specbuild.runtimes.trtllm_image import EngineDtype, resolve_dtype
from specbuild.spec import BuildSpec, Role

TENSORRT_LLM_SERIES = "1.2"
LOGITS_DTYPE = "float32"  # engine logits; the Triton config's logits tensors are TYPE_FP32 to match


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
    dtype = resolve_dtype(model.dtype, role, checkpoint_dtype)
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
    """Plan the engine build of one model from its converted checkpoint, at that model's limits (the draft's at its
    own window: the orchestrator sends it only what fits)."""
    limits = spec.limits.of(role)
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




def _call(name: str, kwargs: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in kwargs.items())})"


def format_plan(plan: EnginePlan) -> str:
    """What ``compile --dry-run`` prints for one model: every rank, the Python calls and the equivalent CLI."""
    conv, bld = plan.convert, plan.build
    return "\n".join([
        f"{conv.role}: {conv.architecture} -> {conv.model_class}, {conv.dtype}, {len(conv.mappings)} rank(s), "
        f"TensorRT-LLM {TENSORRT_LLM_SERIES}.x in {conv.image}",
        f"  convert {conv.checkpoint} -> {conv.output_dir}",
        *(f"    rank {m.rank}: {conv.model_class}.from_hugging_face(dtype={conv.dtype!r}, "
          f"mapping={_call('Mapping', asdict(m))}).save_checkpoint(save_config={m.rank == 0})"
          for m in conv.mappings),
        f"    $ {shlex.join(conv.argv)}",
        f"  build {bld.checkpoint_dir} -> {bld.output_dir} ({bld.world_size} engine(s), logits {bld.logits_dtype})",
        f"    {_call('BuildConfig', bld.build_config)}",
        f"      plugin_config={_call('PluginConfig', bld.plugin_config)}",
        f"    $ {shlex.join(bld.argv)}",
    ])
