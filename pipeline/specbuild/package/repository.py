"""Render and validate the Triton model repository.

Every ``config.pbtxt`` is built as Triton's own ``ModelConfig`` protobuf message from typed values (no
templates, so no ``${placeholder}`` can survive) and written with ``text_format``. :func:`validate_repository`
parses every config back with the same message type and checks the ensemble's mappings against the
composing models' tensor names and types before a repository is declared done.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, TypeVar

from google.protobuf import text_format
from specbuild.package import model_config as mc

from specbuild.checkpoint.tokenizer_files import copy_tokenizer, folder_tokenizer_hash
from specbuild.errors import StageError
from specbuild.package import contract
from specbuild.package.backend_guides import guided_decoding_configured
from specbuild.package.backend_contract import (BLOCK_VERIFICATION, ENGINE_INPUTS, ENGINE_OUTPUTS, GUIDE_MASKS,
                                                 EngineModel,
                                                EngineParameters)
from specbuild.package.build_record import Engine
from specbuild.package.contract import OrchestratorParameters, PreprocessingParameters, Tensor
from specbuild.package.parameters import ModelParameters
from specbuild.package.vendor import vendor
from specbuild.spec import BuildSpec
from specbuild.speculation.cost import CostModel
from specbuild.speculation.schedule import DraftLenSchedule

# The ensemble's python models (preprocessing, orchestrator, postprocessing), shipped as files.
ENSEMBLE_MODELS_DIR = Path(__file__).resolve().parents[1] / "triton_models"


# --- config builders -----------------------------------------------------------------------------------
def tensor_io(message_type: Any, tensors: tuple[Tensor, ...]) -> list[Any]:
    items = []
    for item in tensors:
        kwargs = {"name": item.name, "data_type": mc.DataType.Value(item.dtype), "dims": list(item.dims)}
        if message_type is mc.ModelInput and item.optional:
            kwargs["optional"] = True
        items.append(message_type(**kwargs))
    return items


def python_model_config(name: str, spec: BuildSpec, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...],
                        parameters: ModelParameters | None, *, decoupled: bool = False,
                        instances: int = 1) -> mc.ModelConfig:
    config = mc.ModelConfig(
        name=name, backend="python", max_batch_size=spec.limits.max_batch_size,
        input=tensor_io(mc.ModelInput, inputs), output=tensor_io(mc.ModelOutput, outputs),
        instance_group=[mc.ModelInstanceGroup(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)],
    )
    if decoupled:
        config.model_transaction_policy.decoupled = True
    for key, value in (parameters.as_parameters() if parameters else {}).items():
        config.parameters[key].string_value = value
    return config


def engine_model_config(name: str, spec: BuildSpec, backend: str, parameters: EngineParameters,
                        instances: int, guide_masks: bool = False,
                        block_verification: bool = False) -> mc.ModelConfig:
    """An engine model's ``config.pbtxt``, the same for every runtime but its backend and parameter values.

    Non-decoupled (the orchestrator calls it with BLS and waits for the whole answer); CPU instances (the
    ``tensorrtllm`` backend places the engine on its GPUs itself); the tensors of the backend contract, per-request
    scalars reshaped to ``[]`` and variable-length inputs ragged, as the backend's own config declares them.
    """
    config = mc.ModelConfig(name=name, backend=backend, max_batch_size=spec.limits.max_batch_size)
    config.model_transaction_policy.decoupled = False
    config.dynamic_batching.SetInParent()
    config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    own = ((GUIDE_MASKS,) if guide_masks else ()) + ((BLOCK_VERIFICATION,) if block_verification else ())
    for tensor in ENGINE_INPUTS + own:
        entry = config.input.add(name=tensor.name, data_type=mc.DataType.Value(tensor.dtype), dims=tensor.dims,
                                 optional=tensor.optional)
        if tensor.dtype == "TYPE_STRING":
            entry.allow_ragged_batch = True  # the backend reads a guide's bytes as sent, without a reshape
        elif tensor.dims == (1,):
            entry.reshape.SetInParent()  # per-request scalars: the backend reads them without the [1] dim
        elif -1 in tensor.dims:
            entry.allow_ragged_batch = True  # requests of different lengths batch without padding
    for tensor in ENGINE_OUTPUTS:
        config.output.add(name=tensor.name, data_type=mc.DataType.Value(tensor.dtype), dims=tensor.dims)
    for key, value in parameters.as_parameters().items():
        config.parameters[key].string_value = value
    return config


def ensemble_config(spec: BuildSpec) -> mc.ModelConfig:
    """preprocessing -> orchestrator -> postprocessing, keeping NVIDIA's ensemble tensor names."""
    config = mc.ModelConfig(
        name=contract.ENSEMBLE_MODEL, platform="ensemble", max_batch_size=spec.limits.max_batch_size,
        input=tensor_io(mc.ModelInput, contract.ENSEMBLE_INPUTS),
        output=tensor_io(mc.ModelOutput, contract.ENSEMBLE_OUTPUTS),
    )
    public = {t.name for t in contract.ENSEMBLE_INPUTS}

    def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> mc.ModelEnsembling.Step:
        return mc.ModelEnsembling.Step(model_name=model, model_version=-1, input_map=inputs, output_map=outputs)

    pre_out = {t.name: f"_pre_{t.name}" for t in contract.PREPROCESSING_OUTPUTS}
    orchestrator_inputs = {t.name: t.name for t in contract.ORCHESTRATOR_INPUTS if t.name in public}
    orchestrator_inputs.update({
        "input_ids": pre_out["input_ids"], "input_length": pre_out["input_length"], "end_id": pre_out["end_id"],
        "stop_words_ids": pre_out["stop_words_ids"], "bad_words_ids": pre_out["bad_words_ids"],
        "echo_ids": pre_out["echo_ids"], "echo_length": pre_out["echo_length"],
    })
    public_outputs = {t.name for t in contract.ENSEMBLE_OUTPUTS}
    orchestrator_outputs = {t.name: (t.name if t.name in public_outputs else f"_orc_{t.name}")
                            for t in contract.ORCHESTRATOR_OUTPUTS}
    config.ensemble_scheduling.step.extend([
        step(contract.PREPROCESSING_MODEL, {t.name: t.name for t in contract.PREPROCESSING_INPUTS}, pre_out),
        step(contract.ORCHESTRATOR_MODEL, orchestrator_inputs, orchestrator_outputs),
        step(contract.POSTPROCESSING_MODEL,
             {t.name: orchestrator_outputs[t.name] for t in contract.POSTPROCESSING_INPUTS},
             {"text_output": "text_output"}),
    ])
    return config


def orchestrator_parameters(spec: BuildSpec, target: Engine, draft: Engine, load_schedule: DraftLenSchedule,
                            cost: CostModel, guided_decoding: bool = False, engine_guides: bool = False, *,
                            fast_logits: bool = False, tokenizer_hash: str) -> OrchestratorParameters:
    """Requests' defaults from the spec; limits from the engines' build records (what they can do: a request, the
    target's; a draft call, the draft's window);
    ``load_schedule`` the load policy (the spec's, or the runtime's default); ``cost`` the release's
    cost model (V(K) for every K a request may ask for); ``guided_decoding`` whether the engine models take guide
    masks, ``engine_guides`` whether the target engine applies NVIDIA's guide inputs itself, ``fast_logits``
    whether the draft's engine model passes its logits GPU to GPU (a handle in place of the values);
    ``tokenizer_hash`` the release tokenizer's, which capture records carry."""
    s, record, capture = spec.speculation, target.record, spec.capture
    return OrchestratorParameters(
        break_even=s.break_even, draft_cost=round(cost.draft_cost, 4),
        verify_costs=tuple(round(cost.verify(k), 4) for k in range(1, record.limits.max_draft_len + 1)),
        cost_measured=cost.measured, measured_acceptance=cost.acceptance,
        max_draft_len=record.limits.max_draft_len,
        num_draft_tokens=s.num_draft_tokens,
        use_draft_logits=s.acceptance == "draft-logits",
        verification=s.verification,
        adaptive_draft=s.adaptive,
        draft_len_schedule=str(load_schedule),
        prompt_lookup=s.prompt_lookup.enabled,
        lookup_max_ngram=s.prompt_lookup.max_ngram,
        lookup_min_ngram=s.prompt_lookup.min_ngram,
        lookup_draft_fallback=s.prompt_lookup.draft_fallback,
        fast_logits=fast_logits,
        max_input_len=record.limits.max_input_len,
        max_seq_len=record.limits.max_seq_len,
        draft_max_seq_len=draft.record.limits.engine_seq_len,
        draft_context=s.draft_context or 0,
        vocab_size=record.vocab_size,
        max_request_seconds=spec.triton.max_request_seconds,
        guided_decoding=guided_decoding,
        engine_guides=engine_guides,
        tokenizer_hash=tokenizer_hash,
        capture=capture.enabled,
        capture_max_file_mib=capture.max_file_mib,
        capture_max_file_hours=capture.max_file_hours,
        capture_retention_days=capture.retention_days,
    )


def orchestrator_config(spec: BuildSpec, target: Engine, draft: Engine, load_schedule: DraftLenSchedule,
                        cost: CostModel, guided_decoding: bool = False, engine_guides: bool = False, *,
                        fast_logits: bool = False, tokenizer_hash: str) -> mc.ModelConfig:
    return python_model_config(contract.ORCHESTRATOR_MODEL, spec, contract.ORCHESTRATOR_INPUTS,
                               contract.ORCHESTRATOR_OUTPUTS,
                               orchestrator_parameters(spec, target, draft, load_schedule, cost, guided_decoding,
                                                       engine_guides, fast_logits=fast_logits,
                                                       tokenizer_hash=tokenizer_hash),
                               decoupled=True, instances=spec.triton.orchestrator_instances)


# --- rendering -----------------------------------------------------------------------------------------
def write_config(model_dir: Path, config: mc.ModelConfig) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config), encoding="utf-8")


def ship_model_source(source: Path, model_dir: Path) -> None:
    """The model's source file as ``1/model.py``, with the specbuild modules it imports beside it."""
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, version_dir / "model.py")
    vendor(source, version_dir)


# transformers 5 saves generic fast tokenizers as "TokenizersBackend", a class transformers 4.57 (the TensorRT-LLM
# 1.2.x images') does not know; "PreTrainedTokenizerFast" is the same class in 5.x and known to both.
PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}
AnyPath = TypeVar("AnyPath", bound=PurePath)


def tokenizer_class_unportable(tokenizer_dir: Path) -> bool:
    """Whether the tokenizer's ``tokenizer_config.json`` names a class the image's transformers 4.57 does not know
    (:data:`PORTABLE_TOKENIZER_CLASSES`): then only the portable copy a release ships loads there."""
    config_file = tokenizer_dir / "tokenizer_config.json"
    if not config_file.is_file():
        return False
    return json.loads(config_file.read_text(encoding="utf-8")).get("tokenizer_class") in PORTABLE_TOKENIZER_CLASSES


def shipped_tokenizer(model_dir: AnyPath) -> AnyPath:
    """Where :func:`ship_tokenizer` puts a model's portable tokenizer copy (``model_dir`` here, or as a container
    sees it)."""
    return model_dir / "1" / "tokenizer"


def ship_tokenizer(tokenizer_dir: Path, model_dir: Path) -> None:
    """The target's tokenizer files into the model's folder, its class named so that every image loads it."""
    destination = shipped_tokenizer(model_dir)
    if not copy_tokenizer(tokenizer_dir, destination):
        raise StageError("package", f"no tokenizer files in {tokenizer_dir}",
                         "the target checkpoint must ship tokenizer.json or its tokenizer files")
    if tokenizer_class_unportable(destination):
        config_file = destination / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["tokenizer_class"] = PORTABLE_TOKENIZER_CLASSES[config["tokenizer_class"]]
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def tokenizer_end_id(tokenizer_dir: Path) -> int:
    """The tokenizer's eos id: the default ``end_id`` of requests. Read from the portable copy a release ships
    (a tokenizer saved by transformers 5 does not load as is in the image's transformers 4.57)."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as scratch:
        ship_tokenizer(tokenizer_dir, Path(scratch))
        tokenizer = AutoTokenizer.from_pretrained(str(shipped_tokenizer(Path(scratch))), trust_remote_code=False)
    if tokenizer.eos_token_id is None:
        raise StageError("package", f"the tokenizer in {tokenizer_dir} defines no eos token",
                         "set eos_token in tokenizer_config.json")
    return int(tokenizer.eos_token_id)


def render_repository(spec: BuildSpec, engines: Mapping[str, Engine], engine_models: Mapping[str, EngineModel],
                      tokenizer_dir: Path, output_dir: Path, load_schedule: DraftLenSchedule,
                      cost: CostModel) -> None:
    """Write the whole repository into ``output_dir`` (an empty folder; callers make it atomic): the ensemble, its
    python models, and the ``engine_models`` serving ``engines``."""
    target = engines[contract.TARGET_MODEL]
    target_parameters = engine_models[contract.TARGET_MODEL].parameters
    models = {
        contract.ENSEMBLE_MODEL: ensemble_config(spec),
        contract.PREPROCESSING_MODEL: python_model_config(
            contract.PREPROCESSING_MODEL, spec, contract.PREPROCESSING_INPUTS, contract.PREPROCESSING_OUTPUTS,
            PreprocessingParameters(max_input_len=target.record.limits.max_input_len,
                                    end_id=tokenizer_end_id(tokenizer_dir))),
        contract.ORCHESTRATOR_MODEL: orchestrator_config(
            spec, target, engines[contract.DRAFT_MODEL], load_schedule, cost, all(model.guide_masks for model in engine_models.values()),
            guided_decoding_configured(target_parameters.guided_decoding_backend,
                                       target_parameters.xgrammar_tokenizer_info_path),
            fast_logits=engine_models[contract.DRAFT_MODEL].parameters.speculative_decoding_fast_logits,
            tokenizer_hash=folder_tokenizer_hash(tokenizer_dir)),
        contract.POSTPROCESSING_MODEL: python_model_config(
            contract.POSTPROCESSING_MODEL, spec, contract.POSTPROCESSING_INPUTS, contract.POSTPROCESSING_OUTPUTS, None),
        **{role: engine_model_config(role, spec, model.backend, model.parameters, model.instances, model.guide_masks,
                                     model.block_verification)
           for role, model in engine_models.items()},
    }
    for name, config in models.items():
        write_config(output_dir / name, config)
    (output_dir / contract.ENSEMBLE_MODEL / "1").mkdir(exist_ok=True)
    for name in (contract.PREPROCESSING_MODEL, contract.ORCHESTRATOR_MODEL, contract.POSTPROCESSING_MODEL):
        ship_model_source(ENSEMBLE_MODELS_DIR / f"{name}_model.py", output_dir / name)
    for name in (contract.PREPROCESSING_MODEL, contract.ORCHESTRATOR_MODEL, contract.POSTPROCESSING_MODEL):
        ship_tokenizer(tokenizer_dir, output_dir / name)  # the orchestrator's compiles guides
    for role, model in engine_models.items():
        if model.source is not None:
            ship_model_source(model.source, output_dir / role)
        else:
            (output_dir / role / "1").mkdir(parents=True, exist_ok=True)
    problems = validate_repository(output_dir)
    if problems:
        raise StageError("package", "the rendered repository is inconsistent:\n  " + "\n  ".join(problems),
                         "this is a specbuild bug; please report it with the spec used")


# --- validation ----------------------------------------------------------------------------------------
def read_config(model_dir: Path) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(encoding="utf-8"), config)
    return config


def orchestrator_settings(repository: Path) -> OrchestratorParameters | None:
    """The orchestrator's parameters as the release in ``repository`` renders them (None: it has no orchestrator,
    as a runtime that speculates inside its engine)."""
    model_dir = repository / contract.ORCHESTRATOR_MODEL
    if not (model_dir / "config.pbtxt").is_file():
        return None
    values = {key: value.string_value for key, value in read_config(model_dir).parameters.items()}
    return OrchestratorParameters.from_parameters(values)


def _dims_compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def validate_repository(repository: Path, models: tuple[str, ...] = contract.MODEL_NAMES) -> list[str]:
    """Parse the ``config.pbtxt`` of each of ``models`` with Triton's ``ModelConfig`` and cross-check the ensemble.

    Returns the problems found (empty when the repository is consistent). A python model's ``model.py`` may be a
    link into the serving image (the LLM-API model's is).
    """
    problems: list[str] = []
    configs: dict[str, mc.ModelConfig] = {}
    for name in models:
        path = repository / name / "config.pbtxt"
        if not path.is_file():
            problems.append(f"{name}: config.pbtxt is missing")
            continue
        try:
            configs[name] = read_config(repository / name)
        except text_format.ParseError as exc:
            problems.append(f"{name}: config.pbtxt does not parse as ModelConfig: {exc}")
            continue
        if configs[name].name != name:
            problems.append(f"{name}: config name is {configs[name].name!r}")
        source = repository / name / "1" / "model.py"
        if configs[name].backend == "python" and not (source.is_file() or source.is_symlink()):
            problems.append(f"{name}: 1/model.py is missing")
    ensemble = configs.get(contract.ENSEMBLE_MODEL)
    if ensemble is None:
        return problems
    available = {t.name: (t.data_type, list(t.dims)) for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = configs.get(step.model_name)
        if model is None:
            problems.append(f"ensemble step {step.model_name!r}: no such model in the repository")
            continue
        model_inputs = {t.name: t for t in model.input}
        model_outputs = {t.name: t for t in model.output}
        for model_input, source in step.input_map.items():
            if model_input not in model_inputs:
                problems.append(f"ensemble -> {step.model_name}: {model_input!r} is not an input of the model")
            elif source not in available:
                problems.append(f"ensemble -> {step.model_name}.{model_input}: {source!r} is produced by no earlier step")
            else:
                dtype, dims = available[source]
                wanted = model_inputs[model_input]
                if dtype != wanted.data_type or not _dims_compatible(dims, list(wanted.dims)):
                    problems.append(f"ensemble -> {step.model_name}.{model_input}: {source!r} is "
                                    f"{mc.DataType.Name(dtype)}{dims}, the model wants "
                                    f"{mc.DataType.Name(wanted.data_type)}{list(wanted.dims)}")
        for name, tensor in model_inputs.items():
            if not tensor.optional and name not in step.input_map:
                problems.append(f"ensemble -> {step.model_name}: required input {name!r} is not mapped")
        for model_output, target in step.output_map.items():
            if model_output not in model_outputs:
                problems.append(f"{step.model_name} -> ensemble: {model_output!r} is not an output of the model")
                continue
            available[target] = (model_outputs[model_output].data_type, list(model_outputs[model_output].dims))
    for output in ensemble.output:
        produced = available.get(output.name)
        if produced is None:
            problems.append(f"ensemble output {output.name!r} is produced by no step")
        elif produced[0] != output.data_type:
            problems.append(f"ensemble output {output.name!r}: type {mc.DataType.Name(produced[0])} "
                            f"!= {mc.DataType.Name(output.data_type)}")
    return problems
