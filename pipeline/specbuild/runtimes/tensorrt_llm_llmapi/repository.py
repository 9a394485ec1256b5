"""The Triton repository of a ``tensorrt-llm-llmapi`` release.

Three models, each config built as Triton's ``ModelConfig`` from typed values:

* ``ensemble``: specbuild's public inputs and outputs (:data:`specbuild.package.contract.ENSEMBLE_INPUTS`/
  ``ENSEMBLE_OUTPUTS``, the same as every runtime's), routed to and from the adapter unchanged;
* ``llmapi_adapter``: a decoupled python model mapping them onto the LLM-API model and its answers back
  (:mod:`specbuild.runtimes.tensorrt_llm_llmapi.requests`), shipped with its specbuild import closure and the
  target's tokenizer;
* ``tensorrt_llm``: TensorRT-LLM's LLM-API model, its config rendered from
  :data:`specbuild.runtimes.tensorrt_llm_llmapi.contract.LLMAPI_INPUTS`/``LLMAPI_OUTPUTS``, its ``1/model.yaml``
  from the typed :class:`~specbuild.runtimes.tensorrt_llm_llmapi.model_yaml.ModelYaml`, and its
  ``model.py``/``helpers.py`` linked to the copies the NGC image ships (``/app/all_models/llmapi``), never copied
  into the release.

The same LLM arguments go to ``trtllm-serve.yaml`` at the repository's root, for ``trtllm-serve
--extra_llm_api_options`` (the flag both lines have).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from specbuild.package import model_config as mc

from specbuild.errors import StageError
from specbuild.package import contract
from specbuild.package.build_record import Engine
from specbuild.package.repository import (
    python_model_config,
    ship_model_source,
    ship_tokenizer,
    shipped_tokenizer,
    tensor_io,
    tokenizer_class_unportable,
    tokenizer_end_id,
    validate_repository,
    write_config,
)
from specbuild.runtimes.tensorrt_llm_llmapi.contract import (
    ADAPTER_MODEL,
    IMAGE_MODEL_DIR,
    IMAGE_MODEL_FILES,
    LLMAPI_INPUTS,
    LLMAPI_MODEL,
    LLMAPI_MODEL_NAMES,
    LLMAPI_OUTPUTS,
    MODEL_YAML,
    SERVE_CONFIG,
    LLMAPIAdapterParameters,
)
from specbuild.runtimes.tensorrt_llm_llmapi.launch import container_checkpoint
from specbuild.runtimes.tensorrt_llm_llmapi.lines import DRAFT_KEY, LINES, LineRules, load_keys
from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml, ServeConfig, TritonConfig, to_yaml
from specbuild.runtimes.trtllm_image import MAX_NUM_TOKENS
from specbuild.spec import BuildSpec
from specbuild.speculation.schedule import DraftLenSchedule

if TYPE_CHECKING:
    from specbuild.runtimes.interface import PackageContext

ADAPTER_SOURCE = Path(__file__).parent / "adapter_model.py"  # the adapter's python model


def ensemble_config(spec: BuildSpec) -> mc.ModelConfig:
    """The public interface, every input and output routed to and from the adapter under its own name."""
    config = mc.ModelConfig(
        name=contract.ENSEMBLE_MODEL, platform="ensemble", max_batch_size=spec.limits.max_batch_size,
        input=tensor_io(mc.ModelInput, contract.ENSEMBLE_INPUTS),
        output=tensor_io(mc.ModelOutput, contract.ENSEMBLE_OUTPUTS))
    config.ensemble_scheduling.step.add(
        model_name=ADAPTER_MODEL, model_version=-1,
        input_map={t.name: t.name for t in contract.ENSEMBLE_INPUTS},
        output_map={t.name: t.name for t in contract.ENSEMBLE_OUTPUTS})
    return config


def llmapi_model_config(model_yaml: ModelYaml) -> mc.ModelConfig:
    """The LLM-API model's config: ``max_batch_size`` and ``decoupled`` written as ``triton_config`` says (the
    launcher disables auto-complete, which would otherwise copy them), one CPU instance (the LLM places itself)."""
    triton = model_yaml.triton_config
    config = mc.ModelConfig(name=LLMAPI_MODEL, backend="python", max_batch_size=triton.max_batch_size,
                            input=tensor_io(mc.ModelInput, LLMAPI_INPUTS),
                            output=tensor_io(mc.ModelOutput, LLMAPI_OUTPUTS),
                            instance_group=[mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)])
    config.model_transaction_policy.decoupled = triton.decoupled
    return config


def speculative_config(spec: BuildSpec, line: LineRules, schedule: DraftLenSchedule
                       ) -> dict[str, object] | None:
    """``speculative_config`` as ``line`` dispatches it, or None for K=0 (the target alone: nothing to draft)."""
    k = spec.speculation.num_draft_tokens
    if k == 0:
        return None
    config = {"decoding_type": line.decoding_type, "max_draft_len": k,
              DRAFT_KEY: container_checkpoint(spec, contract.DRAFT_MODEL),
              **load_keys(schedule, k, spec.limits.max_batch_size, line)}
    refused = line.refusals(config)
    if refused:  # spec_findings refuses what a user can cause, so this is a bug
        raise StageError("package", f"TensorRT-LLM {line.tensorrt_llm} would refuse the rendered speculative_config:"
                         "\n  " + "\n  ".join(refused), "this is a specbuild bug; please report it with the spec")
    return config


def portable_tokenizer(spec: BuildSpec, tokenizer_dir: Path) -> str | None:
    """The adapter's portable tokenizer copy as the container sees it, where the target's own tokenizer does not load
    in the image's transformers (``LLM()`` loads the model folder's tokenizer otherwise); else None."""
    if not tokenizer_class_unportable(tokenizer_dir):
        return None
    return str(shipped_tokenizer(PurePosixPath(spec.triton.repository_mount) / ADAPTER_MODEL))


def llm_arguments(spec: BuildSpec, target: Engine, context: PackageContext, schedule: DraftLenSchedule,
                  tokenizer: str | None = None) -> dict[str, object]:
    """The ``LLM()`` arguments of the release. KV cache: the memory plan's share of both models (or the spec's
    total), capped at the planned tokens each model holds; ``schedule``: the runtime's load policy;
    ``tokenizer``: :func:`portable_tokenizer`."""
    limits = spec.limits
    fraction = spec.triton.kv_cache_free_gpu_mem_fraction or sum(context.kv_fractions.values())
    return {
        "tokenizer": tokenizer,
        "trust_remote_code": spec.security.trust_remote_code, "dtype": target.record.dtype,
        "tensor_parallel_size": spec.target.tp_size, "pipeline_parallel_size": spec.target.pp_size,
        "max_batch_size": limits.max_batch_size, "max_input_len": limits.max_input_len,
        "max_seq_len": target.record.limits.max_seq_len, "max_num_tokens": MAX_NUM_TOKENS,
        "kv_cache_config": {"free_gpu_memory_fraction": round(fraction, 4),
                            "max_tokens": context.kv_tokens[contract.TARGET_MODEL]},
        "speculative_config": speculative_config(spec, LINES[spec.triton.tensorrt_llm], schedule),
    }


def model_yaml(spec: BuildSpec, target: Engine, context: PackageContext, schedule: DraftLenSchedule,
               tokenizer: str | None = None) -> ModelYaml:
    return ModelYaml(model=container_checkpoint(spec, contract.TARGET_MODEL),
                     **llm_arguments(spec, target, context, schedule, tokenizer),
                     triton_config=TritonConfig(max_batch_size=0, decoupled=True))


def serve_config(spec: BuildSpec, target: Engine, context: PackageContext, schedule: DraftLenSchedule,
                 tokenizer: str | None = None) -> ServeConfig:
    return ServeConfig(**llm_arguments(spec, target, context, schedule, tokenizer))


def _header(spec: BuildSpec, reader: str) -> str:
    return (f"specbuild release {spec.name!r} (runtime {spec.runtime}, TensorRT-LLM {spec.triton.tensorrt_llm}): "
            f"{reader}.\nPaths are the container's: the checkpoints are mounted at {spec.triton.checkpoint_mount}. "
            "Written from typed values; package again rather than edit.")


def model_yaml_text(spec: BuildSpec, target: Engine, context: PackageContext, schedule: DraftLenSchedule,
                    tokenizer: str | None = None) -> str:
    """``tensorrt_llm/1/model.yaml`` as the release holds it."""
    return to_yaml(model_yaml(spec, target, context, schedule, tokenizer),
                   _header(spec, "read by TensorRT-LLM's LLM-API model (model.py beside it)"))


def serve_config_text(spec: BuildSpec, target: Engine, context: PackageContext, schedule: DraftLenSchedule,
                      tokenizer: str | None = None) -> str:
    """``trtllm-serve.yaml`` as the release holds it."""
    flag = LINES[spec.triton.tensorrt_llm].serve_flag
    command = f"trtllm-serve {container_checkpoint(spec, contract.TARGET_MODEL)} {flag} {SERVE_CONFIG}"
    return to_yaml(serve_config(spec, target, context, schedule, tokenizer),
                   _header(spec, f"the same LLM arguments for `{command}` (TensorRT-LLM's server, without Triton)"))


def _link_image_model(version_dir: Path) -> None:
    """``model.py`` and ``helpers.py`` as links to the image's copies; they resolve inside the container only."""
    for name in IMAGE_MODEL_FILES:
        os.symlink(f"{IMAGE_MODEL_DIR}/{name}", version_dir / name)


def render_repository(spec: BuildSpec, engines: Mapping[str, Engine], tokenizer_dir: Path, output_dir: Path,
                      context: PackageContext, schedule: DraftLenSchedule) -> None:
    """Write the whole repository into ``output_dir`` (an empty folder; callers make it atomic);
    ``schedule``: the runtime's load policy."""
    target = engines[contract.TARGET_MODEL]
    tokenizer = portable_tokenizer(spec, tokenizer_dir)
    adapter = LLMAPIAdapterParameters(num_draft_tokens=spec.speculation.num_draft_tokens,
                                      end_id=tokenizer_end_id(tokenizer_dir),
                                      streams=LINES[spec.triton.tensorrt_llm].streams,
                                      max_request_seconds=spec.triton.max_request_seconds,
                                      tensorrt_llm=spec.triton.tensorrt_llm,
                                      draft_max_seq_len=engines[contract.DRAFT_MODEL].record.limits.max_seq_len)
    models = {
        contract.ENSEMBLE_MODEL: ensemble_config(spec),
        ADAPTER_MODEL: python_model_config(ADAPTER_MODEL, spec, contract.ENSEMBLE_INPUTS, contract.ENSEMBLE_OUTPUTS,
                                           adapter, decoupled=True, instances=spec.triton.orchestrator_instances),
        LLMAPI_MODEL: llmapi_model_config(model_yaml(spec, target, context, schedule, tokenizer)),
    }
    for name, config in models.items():
        write_config(output_dir / name, config)
    (output_dir / contract.ENSEMBLE_MODEL / "1").mkdir()
    ship_model_source(ADAPTER_SOURCE, output_dir / ADAPTER_MODEL)
    ship_tokenizer(tokenizer_dir, output_dir / ADAPTER_MODEL)
    llmapi_version = output_dir / LLMAPI_MODEL / "1"
    llmapi_version.mkdir()
    (llmapi_version / MODEL_YAML).write_text(model_yaml_text(spec, target, context, schedule, tokenizer),
                                             encoding="utf-8")
    _link_image_model(llmapi_version)
    (output_dir / SERVE_CONFIG).write_text(serve_config_text(spec, target, context, schedule, tokenizer),
                                           encoding="utf-8")
    problems = validate_repository(output_dir, LLMAPI_MODEL_NAMES)
    if problems:
        raise StageError("package", "the rendered repository is inconsistent:\n  " + "\n  ".join(problems),
                         "this is a specbuild bug; please report it with the spec used")

