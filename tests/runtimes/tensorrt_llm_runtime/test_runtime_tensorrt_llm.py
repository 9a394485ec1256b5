"""The tensorrt-llm runtime without TensorRT-LLM: plans, argv, Triton engine configs, and the errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
import shlex
import sys
import types
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from specbuild.runtimes.interface import PackageContext
from specbuild.runtimes.tensorrt_llm import engine_plans
from specbuild.runtimes.tensorrt_llm import runtime as trt
from specbuild.errors import CheckpointError, SpecbuildError, SpecError, UsageError
from specbuild.package.backend_contract import ENGINE_INPUTS, ENGINE_OUTPUTS, EngineParameters
from specbuild.package.build_record import BuildLimits, BuildRecord, Engine, GpuInfo
from specbuild.package.repository import engine_model_config
from specbuild.spec import BuildSpec

HAS_TENSORRT_LLM = importlib.util.find_spec("tensorrt_llm") is not None


def make_spec(*, tp: int = 1, pp: int = 1, draft_tp: int = 1, acceptance: str = "draft-logits",
              dtype: str = "auto", max_draft_len: int = 8, launch: dict[str, Any] | None = None,
              **limits: int) -> BuildSpec:
    return BuildSpec.model_validate({
        "launch": launch or {},
        "runtime": "tensorrt-llm",
        "target": {"checkpoint": "/models/target", "dtype": dtype, "tp_size": tp, "pp_size": pp},
        "draft": {"checkpoint": "/models/draft", "dtype": dtype, "tp_size": draft_tp},
        "speculation": {"max_draft_len": max_draft_len, "num_draft_tokens": 4, "acceptance": acceptance},
        "limits": {"max_batch_size": 4, "max_input_len": 3200, "max_seq_len": 4800, **limits},
        "outputs": {"build_dir": "/work/build", "engines_dir": "/work/engines"},
    })


def engine_plan(spec: BuildSpec, role: str, architecture: str = "LlamaForCausalLM",
                checkpoint_dtype: str | None = "bfloat16") -> engine_plans.EnginePlan:
    converted = f"{spec.outputs.build_dir}/tensorrt-llm/{role}"
    return engine_plans.EnginePlan(engine_plans.convert_plan(spec, role, architecture, converted, checkpoint_dtype=checkpoint_dtype),
                          engine_plans.build_plan(spec, role, converted, f"{spec.outputs.engines_dir}/{role}"))


def plans(spec: BuildSpec, architecture: str = "LlamaForCausalLM", checkpoint_dtype: str | None = "bfloat16"):
    return [engine_plan(spec, role, architecture, checkpoint_dtype) for role in ("target", "draft")]


# --- build plans: the exact BuildConfig kwargs and trtllm-build argv -----------------------------------
COMMON_BUILD_ARGV = ["--gemm_plugin=auto", "--use_paged_context_fmha=enable", "--kv_cache_type=paged",
                     "--logits_dtype=float32", "--max_batch_size=4", "--max_input_len=3200", "--max_seq_len=4800",
                     "--max_beam_width=1"]
PLUGINS = {"gemm_plugin": "auto", "paged_kv_cache": True, "use_paged_context_fmha": True}
LIMITS = {"max_batch_size": 4, "max_input_len": 3200, "max_seq_len": 4800, "max_beam_width": 1}
LIMITS_OF_A_REQUEST = {key: value for key, value in LIMITS.items() if key != "max_beam_width"}


@pytest.mark.parametrize("acceptance", ["token-match", "draft-logits"])
def test_target_build_has_draft_tokens_external_and_max_draft_len(acceptance: str) -> None:
    plan = engine_plans.build_plan(make_spec(acceptance=acceptance), "target", "/work/build/t", "/work/engines/target")
    assert plan.build_config == {**LIMITS, "speculative_decoding_mode": "draft_tokens_external", "max_draft_len": 8}
    assert plan.plugin_config == PLUGINS
    assert list(plan.argv) == ["trtllm-build", "--checkpoint_dir=/work/build/t", "--output_dir=/work/engines/target",
                               *COMMON_BUILD_ARGV,
                               "--speculative_decoding_mode=draft_tokens_external", "--max_draft_len=8"]


def test_draft_build_gathers_generation_logits_only_for_draft_logits() -> None:
    with_logits = engine_plans.build_plan(make_spec(acceptance="draft-logits"), "draft", "/c", "/e")
    token_match = engine_plans.build_plan(make_spec(acceptance="token-match"), "draft", "/c", "/e")
    assert with_logits.build_config == {**LIMITS, "gather_generation_logits": True}
    assert list(with_logits.argv) == ["trtllm-build", "--checkpoint_dir=/c", "--output_dir=/e", *COMMON_BUILD_ARGV,
                                      "--gather_generation_logits"]
    assert token_match.build_config == LIMITS
    assert list(token_match.argv) == ["trtllm-build", "--checkpoint_dir=/c", "--output_dir=/e", *COMMON_BUILD_ARGV]


@pytest.mark.parametrize("acceptance", ["token-match", "draft-logits"])
def test_no_speculative_flags_on_draft_and_no_context_logits_anywhere(acceptance: str) -> None:
    for plan in plans(make_spec(acceptance=acceptance, max_draft_len=10)):
        build = plan.build
        assert "gather_context_logits" not in build.build_config
        assert not any("context_logits" in arg for arg in build.argv)
        speculative = [arg for arg in build.argv if arg.startswith(("--speculative", "--max_draft_len"))]
        if build.role == "target":
            assert speculative == ["--speculative_decoding_mode=draft_tokens_external", "--max_draft_len=10"]
            assert "--gather_generation_logits" not in build.argv
        else:
            assert speculative == []


def test_limits_come_from_the_spec_and_max_seq_len_is_not_raised_by_the_plan() -> None:
    # build() itself adds max_draft_len to the target's max_seq_len; adding it here too would double it
    plan = engine_plans.build_plan(make_spec(max_batch_size=16, max_input_len=100, max_seq_len=300), "target", "/c", "/e")
    assert (plan.build_config["max_batch_size"], plan.build_config["max_input_len"],
            plan.build_config["max_seq_len"]) == (16, 100, 300)
    assert plan.world_size == 1 and plan.logits_dtype == "float32"


def test_each_engine_is_built_at_its_own_model_s_window() -> None:
    """The target at the release's limits, the draft at its own window (the orchestrator sends it only what fits)."""
    spec = make_spec(max_input_len=3200, max_seq_len=4800, draft_max_seq_len=2048)
    target, draft = (engine_plans.build_plan(spec, role, "/c", "/e").build_config for role in ("target", "draft"))
    assert (target["max_input_len"], target["max_seq_len"]) == (3200, 4800)
    assert (draft["max_input_len"], draft["max_seq_len"]) == (2047, 2048) and "max_draft_len" not in draft
    assert "--max_seq_len=2048" in engine_plans.build_plan(spec, "draft", "/c", "/e").argv


# --- convert plans: mappings per rank, dtype, argv ----------------------------------------------------
@pytest.mark.parametrize(("tp", "pp", "expected"), [
    (1, 1, [(1, 0, 1, 1)]),
    (2, 1, [(2, 0, 2, 1), (2, 1, 2, 1)]),
    (4, 1, [(4, 0, 4, 1), (4, 1, 4, 1), (4, 2, 4, 1), (4, 3, 4, 1)]),
    (1, 2, [(2, 0, 1, 2), (2, 1, 1, 2)]),
    (2, 2, [(4, 0, 2, 2), (4, 1, 2, 2), (4, 2, 2, 2), (4, 3, 2, 2)]),
])
def test_one_mapping_per_rank(tp: int, pp: int, expected: list[tuple[int, int, int, int]]) -> None:
    plan = engine_plans.convert_plan(make_spec(tp=tp, pp=pp), "target", "LlamaForCausalLM", "/work/build/t",
                            checkpoint_dtype="bfloat16")
    assert [(m.world_size, m.rank, m.tp_size, m.pp_size) for m in plan.mappings] == expected
    assert list(plan.argv) == ["python3", "examples/models/core/llama/convert_checkpoint.py",
                               "--model_dir=/models/target", "--output_dir=/work/build/t", "--dtype=bfloat16",
                               f"--tp_size={tp}", f"--pp_size={pp}", "--workers=1"]


@pytest.mark.parametrize(("architecture", "model_class", "script"), [
    ("LlamaForCausalLM", "LLaMAForCausalLM", "examples/models/core/llama/convert_checkpoint.py"),
    ("MistralForCausalLM", "LLaMAForCausalLM", "examples/models/core/llama/convert_checkpoint.py"),
    ("Qwen2ForCausalLM", "QWenForCausalLM", "examples/models/core/qwen/convert_checkpoint.py"),
    ("Qwen3ForCausalLM", "QWenForCausalLM", "examples/models/core/qwen/convert_checkpoint.py"),
    ("Phi3ForCausalLM", "Phi3ForCausalLM", "examples/models/core/phi/convert_checkpoint.py"),
    ("GPT2LMHeadModel", "GPTForCausalLM", "examples/models/core/gpt/convert_checkpoint.py"),
    ("FalconForCausalLM", "FalconForCausalLM", "examples/models/contrib/falcon/convert_checkpoint.py"),
])
def test_architecture_maps_to_model_class_and_script(architecture: str, model_class: str, script: str) -> None:
    plan = engine_plans.convert_plan(make_spec(), "draft", architecture, "/o", checkpoint_dtype="float16")
    assert (plan.model_class, plan.argv[1], plan.dtype) == (model_class, script, "float16")


@pytest.mark.parametrize(("requested", "recorded", "expected"), [
    ("auto", "bfloat16", "bfloat16"),
    ("auto", "float16", "float16"),
    ("auto", "torch.bfloat16", "bfloat16"),
    ("auto", "float32", "float16"),  # as convert_checkpoint.py --dtype auto does
    ("auto", None, "float16"),
    ("bfloat16", "float16", "bfloat16"),  # an explicit dtype wins over the checkpoint's
    ("float16", "bfloat16", "float16"),
])
def test_dtype_resolution(requested: str, recorded: str | None, expected: str) -> None:
    spec = make_spec(dtype=requested)
    assert trt.resolve_dtype(requested, "target", recorded) == expected
    assert trt.TensorRTLLMRuntime().engine_dtype(requested, "target", recorded) == expected
    assert engine_plans.convert_plan(spec, "target", "LlamaForCausalLM", "/o", checkpoint_dtype=recorded).dtype == expected


def test_float32_is_refused_with_the_fix() -> None:
    with pytest.raises(SpecError) as caught:
        engine_plans.convert_plan(make_spec(dtype="float32"), "draft", "LlamaForCausalLM", "/o", checkpoint_dtype="float32")
    assert "draft.dtype is float32" in caught.value.message
    assert "--runtime torch" in caught.value.fix and "bfloat16" in caught.value.fix


def test_non_float_checkpoint_dtype_is_a_checkpoint_error() -> None:
    with pytest.raises(CheckpointError, match="'int8'"):
        trt.resolve_dtype("auto", "target", "int8")


def test_unknown_architecture_names_the_supported_ones() -> None:
    with pytest.raises(CheckpointError) as caught:
        engine_plans.convert_plan(make_spec(), "target", "MambaForCausalLM", "/o")
    assert "'MambaForCausalLM'" in caught.value.message and "target" in caught.value.message
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Phi3ForCausalLM", "--runtime torch"):
        assert name in caught.value.fix


def test_phi_refuses_pipeline_parallelism() -> None:
    with pytest.raises(SpecError, match="pp_size is 2"):
        engine_plans.convert_plan(make_spec(pp=2), "target", "PhiForCausalLM", "/o", checkpoint_dtype="float16")


# --- what --dry-run prints and --json emits ------------------------------------------------------------
def test_plan_json_covers_both_models_and_all_ranks() -> None:
    data = {plan.convert.role: trt._PLAN_JSON.dump_python(plan, mode="json")
            for plan in plans(make_spec(tp=2, pp=2, draft_tp=2))}
    assert json.loads(json.dumps(data)) == data
    target, draft = data["target"], data["draft"]
    assert [m["rank"] for m in target["convert"]["mappings"]] == [0, 1, 2, 3]
    assert [m["rank"] for m in draft["convert"]["mappings"]] == [0, 1]
    assert target["convert"]["output_dir"] == target["build"]["checkpoint_dir"] == "/work/build/tensorrt-llm/target"
    assert draft["build"]["output_dir"] == "/work/engines/draft"
    assert target["build"]["world_size"] == 4 and draft["build"]["world_size"] == 2


def test_format_plan_shows_every_rank_and_runnable_commands() -> None:
    for plan in plans(make_spec(tp=2)):
        text = engine_plans.format_plan(plan)
        assert "TensorRT-LLM 1.2.x in nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3" in text
        commands = [shlex.split(line.split("$ ", 1)[1]) for line in text.splitlines() if "$ " in line]
        assert commands == [list(plan.convert.argv), list(plan.build.argv)]
    target_text = engine_plans.format_plan(plans(make_spec(tp=2))[0])
    assert "Mapping(world_size=2, rank=1, tp_size=2, pp_size=1)" in target_text
    assert "speculative_decoding_mode='draft_tokens_external', max_draft_len=8" in target_text


def test_plans_are_deterministic() -> None:
    assert plans(make_spec(tp=4)) == plans(make_spec(tp=4))


# --- execution guards ------------------------------------------------------------------------------------
@pytest.mark.skipif(HAS_TENSORRT_LLM, reason="tensorrt_llm is installed here")
def test_missing_tensorrt_llm_says_so_and_names_the_fixes() -> None:
    plan = engine_plan(make_spec(), "target")
    for run in (lambda: trt.convert(plan.convert), lambda: trt.build(plan.build)):
        with pytest.raises(SpecbuildError) as caught:
            run()
        assert "tensorrt_llm" in caught.value.message
        assert "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3" in caught.value.fix
        assert "--runtime torch" in caught.value.fix and "--dry-run" in caught.value.fix


def test_other_tensorrt_llm_series_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", types.SimpleNamespace(__version__="1.3.0rc2"))
    with pytest.raises(SpecbuildError, match=r"TensorRT-LLM 1\.3\.0rc2 is installed; the engine flow needs 1\.2\.x"):
        trt.require_tensorrt_llm("img")


@pytest.mark.parametrize(("major", "minor", "ok"), [(7, 5, False), (7, 0, False), (8, 0, True), (8, 9, True),
                                                      (9, 0, True), (12, 0, True)])
def test_sm_check(major: int, minor: int, ok: bool) -> None:
    if ok:
        trt.check_sm("GPU", major, minor)
    else:
        with pytest.raises(SpecbuildError, match=rf"Tesla T4 has compute capability {major}\.{minor}"):
            trt.check_sm("Tesla T4", major, minor)


# --- the Triton engine model config --------------------------------------------------------------------
CONTEXT = PackageContext(kv_fractions={"target": 0.7, "draft": 0.2}, kv_tokens={"target": 38400, "draft": 38400})


def engine_info(role: str = "target") -> Engine:
    return Engine(Path(f"/work/engines/{role}"), BuildRecord(
        runtime="tensorrt-llm", role=role, dtype="bfloat16", vocab_size=400, architecture="LlamaForCausalLM",
        limits=BuildLimits(max_batch_size=16, max_seq_len=4800, max_input_len=3200, max_draft_len=8)))


def engine_config(role: str = "target", spec: BuildSpec | None = None) -> mc.ModelConfig:
    spec = spec or make_spec()
    runtime = trt.TensorRTLLMRuntime()
    model = runtime.engine_model(spec, engine_info(role), "/work/triton_repo", CONTEXT)
    return engine_model_config(role, spec, model.backend, model.parameters, model.instances)


def parameters(config: mc.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def test_engine_config_round_trips_through_text_format() -> None:
    config = engine_config(spec=make_spec(tp=2, launch={"fast_logits": True}))
    parsed = text_format.Parse(text_format.MessageToString(config), type(config)())
    assert parsed == config


@pytest.mark.parametrize("role", ["target", "draft"])
def test_engine_config_shape(role: str) -> None:
    config = engine_config(role)
    assert (config.name, config.backend, config.max_batch_size) == (role, "tensorrtllm", 4)
    assert config.model_transaction_policy.decoupled is False
    assert [(group.count, group.kind) for group in config.instance_group] == [(1, mc.ModelInstanceGroup.KIND_CPU)]
    assert [(t.name, mc.DataType.Name(t.data_type), tuple(t.dims), t.optional) for t in config.input] == [
        (t.name, t.dtype, t.dims, t.optional) for t in ENGINE_INPUTS]
    assert [(t.name, mc.DataType.Name(t.data_type), tuple(t.dims)) for t in config.output] == [
        (t.name, t.dtype, t.dims) for t in ENGINE_OUTPUTS]
    inputs = {t.name: t for t in config.input}
    assert inputs["input_lengths"].HasField("reshape") and list(inputs["input_lengths"].reshape.shape) == []
    assert inputs["input_ids"].allow_ragged_batch and inputs["draft_logits"].allow_ragged_batch
    assert not inputs["input_ids"].optional and inputs["draft_input_ids"].optional


def test_engine_config_parameters_golden() -> None:
    assert parameters(engine_config()) == {
        "gpt_model_path": "/engines/target",
        "gpt_model_type": "inflight_fused_batching",
        "tokenizer_dir": "",
        "xgrammar_tokenizer_info_path": "/triton_repo/target/xgrammar_tokenizer_info.json",  # the backend's own
        "guided_decoding_backend": "xgrammar",  # guided decoding, on the target only (test_trtllm_guided.py)
        "max_beam_width": "1",
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": "0.7",  # the memory plan's split
        "max_tokens_in_paged_kv_cache": "38400",
        "enable_kv_cache_reuse": "true",
        "exclude_input_in_output": "true",
        "enable_chunked_context": "true",
        "gpu_device_ids": "0",
        "speculative_decoding_fast_logits": "false",
    }


# What the 1.2.x backend reads outside any try/catch (model_instance_state.cc: getBatchingTypeFromParams,
# getGuidedDecodingConfigFromParams) and gpt_model_path, whose absence leaves no decoder engine to load.
BACKEND_REQUIRED = {"gpt_model_type", "gpt_model_path", "tokenizer_dir", "xgrammar_tokenizer_info_path",
                    "guided_decoding_backend"}


def test_every_parameter_the_backend_requires_is_rendered_and_required_when_parsed() -> None:
    rendered = parameters(engine_config())
    assert BACKEND_REQUIRED <= set(rendered)
    for key in BACKEND_REQUIRED:
        with pytest.raises(SpecError, match=f"Cannot find parameter with name: {key}"):
            EngineParameters.from_parameters({k: v for k, v in rendered.items() if k != key})
    assert EngineParameters.from_parameters(rendered).as_parameters() == rendered


def test_engine_parameters_follow_the_launch_layout() -> None:
    spec = make_spec(tp=2, launch={"fast_logits": True, "placement": "separate"})
    target, draft = parameters(engine_config("target", spec)), parameters(engine_config("draft", spec))
    assert (target["gpu_device_ids"], target["participant_ids"]) == ("0,1", "2,3")
    assert (draft["gpu_device_ids"], draft["participant_ids"]) == ("2", "1")
    assert target["speculative_decoding_fast_logits"] == draft["speculative_decoding_fast_logits"] == "true"


def test_the_spec_s_kv_fraction_is_split_as_the_memory_plan_splits_it() -> None:
    spec = make_spec()
    spec = spec.model_copy(update={"triton": spec.triton.model_copy(update={"kv_cache_free_gpu_mem_fraction": 0.45})})
    assert parameters(engine_config("target", spec))["kv_cache_free_gpu_mem_fraction"] == "0.35"
    assert parameters(engine_config("draft", spec))["kv_cache_free_gpu_mem_fraction"] == "0.1"


def test_logits_tensors_match_the_engine_logits_dtype() -> None:
    # the backend takes its logits dtype from the generation_logits output; the engine is built with float32
    config = engine_config()
    tensors = {t.name: t for t in [*config.input, *config.output]}
    assert engine_plans.LOGITS_DTYPE == "float32"
    assert mc.DataType.Name(tensors["draft_logits"].data_type) == "TYPE_FP32"
    assert mc.DataType.Name(tensors["generation_logits"].data_type) == "TYPE_FP32"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kv_cache_free_gpu_mem_fraction": 1.0}, r"outside \(0, 1\)"),
    ({"kv_cache_free_gpu_mem_fraction": 0.0}, r"outside \(0, 1\)"),
    ({"speculative_decoding_fast_logits": True}, "needs participant_ids"),
    ({"gpu_device_ids": ()}, "non-empty list"),
    ({"gpu_device_ids": (0, -1)}, "non-negative"),
    ({"max_tokens_in_paged_kv_cache": 0}, "must be positive"),
])
def test_engine_parameters_reject_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineParameters(gpt_model_path="/engines/target", **kwargs)


def test_unparsable_optional_parameters_fall_back_as_the_backend_does() -> None:
    warnings: list[str] = []
    parsed = EngineParameters.from_parameters({**parameters(engine_config()), "enable_kv_cache_reuse": "yes",
                                               "max_tokens_in_paged_kv_cache": "${max_tokens}"}, warnings)
    assert parsed.enable_kv_cache_reuse is True and parsed.max_tokens_in_paged_kv_cache is None
    assert len(warnings) == 2 and any("Cannot convert yes to a boolean" in line for line in warnings)
    with pytest.raises(SpecError, match="gpt_model_type"):
        EngineParameters.from_parameters({**parameters(engine_config()), "gpt_model_type": "${batching_strategy}"})


# Request inputs of the 1.2.x tensorrtllm backend (TensorRT-LLM triton_backend/inflight_batcher_llm/src/utils.h,
# InputFieldsNames; config.pbtxt of all_models/inflight_batcher_llm/tensorrt_llm) a draft-target engine model can be
# sent. ``random_seed`` and ``min_length`` are not among them: renamed to ``seed``/``min_tokens`` (tensorrtllm_backend
# PR #749), and Triton refuses inputs a config does not declare.
BACKEND_INPUTS = {
    "input_ids", "input_lengths", "request_output_len", "draft_input_ids", "draft_logits",
    "draft_acceptance_threshold", "end_id", "pad_id", "stop_words_list", "bad_words_list", "embedding_bias",
    "beam_width", "temperature", "runtime_top_k", "runtime_top_p", "runtime_top_p_decay",
    "runtime_top_p_reset_ids", "len_penalty", "early_stopping", "repetition_penalty", "min_tokens",
    "beam_search_diversity_rate", "presence_penalty", "frequency_penalty", "seed", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "exclude_input_in_output", "stop",
    "streaming", "num_return_sequences", "guided_decoding_guide_type", "guided_decoding_guide",
}
BACKEND_OUTPUTS = {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits",
                   "generation_logits", "batch_index", "sequence_index", "acceptance_rate",
                   "total_accepted_draft_tokens", "total_draft_tokens"}


def test_contract_engine_inputs_are_backend_inputs() -> None:
    assert {t.name for t in ENGINE_INPUTS} <= BACKEND_INPUTS
    assert {"seed", "min_tokens"} <= {t.name for t in ENGINE_INPUTS}


def test_contract_engine_outputs_are_backend_outputs() -> None:
    assert {t.name for t in ENGINE_OUTPUTS} <= BACKEND_OUTPUTS


# --- execution against a stand-in with the TensorRT-LLM 1.2 names (checks specbuild's calls, not TensorRT-LLM)
FAKE_TENSORRT_LLM = {
    "tensorrt/__init__.py": '__version__ = "10.13.0"\n',
    "tensorrt_llm/__init__.py": '__version__ = "1.2.1"\nCALLS = []\n',
    "tensorrt_llm/mapping.py": (
        "class Mapping:\n"
        "    def __init__(self, world_size, rank, tp_size, pp_size):\n"
        "        self.world_size, self.rank, self.tp_size, self.pp_size = world_size, rank, tp_size, pp_size\n"),
    "tensorrt_llm/plugin/__init__.py": (
        "class PluginConfig(dict):\n    def __init__(self, **kw): super().__init__(kw)\n"),
    "tensorrt_llm/models/modeling_utils.py": (
        "import enum\nclass SpeculativeDecodingMode(enum.IntFlag):\n    NONE = 1\n    DRAFT_TOKENS_EXTERNAL = 2\n"),
    "tensorrt_llm/models/__init__.py": (
        "import json, pathlib, types\nimport tensorrt_llm\n"
        "class PretrainedConfig(types.SimpleNamespace):\n"
        "    @classmethod\n"
        "    def from_json_file(cls, path):\n"
        "        data = json.loads(pathlib.Path(path).read_text())\n"
        "        return cls(architecture=data['architecture'], logits_dtype=None,\n"
        "                   mapping=types.SimpleNamespace(world_size=data['mapping']['world_size'], rank=0))\n"
        "    def set_rank(self, rank): self.mapping.rank = rank\n"
        "class LLaMAForCausalLM:\n"
        "    def __init__(self, config): self.config = config\n"
        "    @classmethod\n"
        "    def from_hugging_face(cls, hf_dir, dtype, mapping):\n"
        "        tensorrt_llm.CALLS.append(('from_hugging_face', hf_dir, dtype, mapping.rank, mapping.tp_size))\n"
        "        return cls(mapping)\n"
        "    def save_checkpoint(self, out, save_config):\n"
        "        pathlib.Path(out, f'rank{self.config.rank}.safetensors').write_text('w')\n"
        "        if save_config:\n"
        "            pathlib.Path(out, 'config.json').write_text(json.dumps({'architecture': 'LlamaForCausalLM',\n"
        "                'mapping': {'world_size': self.config.world_size}}))\n"
        "    @classmethod\n"
        "    def from_checkpoint(cls, ckpt_dir, config):\n"
        "        tensorrt_llm.CALLS.append(('from_checkpoint', config.mapping.rank, config.logits_dtype))\n"
        "        return cls(config)\n"
        "MODEL_MAP = {'LlamaForCausalLM': LLaMAForCausalLM}\n"),
    "tensorrt_llm/builder.py": (
        "import json, pathlib\nimport tensorrt_llm\n"
        "class BuildConfig:\n"
        "    def __init__(self, plugin_config, **kw): self.kw, self.plugin_config = kw, plugin_config\n"
        "class Engine:\n"
        "    def __init__(self, model, bc): self.model, self.bc = model, bc\n"
        "    def save(self, out):\n"
        "        rank = self.model.config.mapping.rank\n"
        "        pathlib.Path(out).mkdir(parents=True, exist_ok=True)\n"
        "        pathlib.Path(out, f'rank{rank}.engine').write_text('e')\n"
        "        mode = self.bc.kw.get('speculative_decoding_mode')\n"
        "        cfg = {**self.bc.kw, 'speculative_decoding_mode': mode and mode.name,\n"
        "               'max_seq_len': self.bc.kw['max_seq_len'] + self.bc.kw.get('max_draft_len', 0),\n"
        "               'plugin_config': dict(self.bc.plugin_config)}\n"
        "        pathlib.Path(out, 'config.json').write_text(json.dumps({'build_config': cfg, 'pretrained_config': \n"
        "            {'architecture': 'LlamaForCausalLM', 'dtype': 'bfloat16', 'vocab_size': 400}}))\n"
        "def build(model, bc):\n"
        "    tensorrt_llm.CALLS.append(('build', model.config.mapping.rank))\n"
        "    return Engine(model, bc)\n"),
}


@pytest.fixture
def fake_tensorrt_llm(tmp_path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "site"
    for relative, text in FAKE_TENSORRT_LLM.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    monkeypatch.syspath_prepend(str(root))
    for name in [n for n in sys.modules if n.split(".")[0] in ("tensorrt_llm", "tensorrt")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(trt, "_gpu_info", lambda: {"name": "NVIDIA H100", "sm": "9.0", "cuda": "12.9"})
    import tensorrt_llm

    yield tensorrt_llm.CALLS
    for name in [n for n in sys.modules if n.split(".")[0] in ("tensorrt_llm", "tensorrt")]:
        del sys.modules[name]


def test_convert_then_build_every_rank_and_record_build_info(fake_tensorrt_llm, tmp_path) -> None:
    spec = make_spec(tp=2)
    plan = engine_plans.EnginePlan(
        engine_plans.convert_plan(spec, "target", "LlamaForCausalLM", tmp_path / "ckpt", checkpoint_dtype="bfloat16"),
        engine_plans.build_plan(spec, "target", tmp_path / "ckpt", tmp_path / "engine"))
    scratch = tmp_path / "scratch-ckpt"
    assert trt.convert(plan.convert, into=scratch) == scratch
    assert sorted(p.name for p in scratch.iterdir()) == ["config.json", "rank0.safetensors", "rank1.safetensors"]
    scratch.rename(tmp_path / "ckpt")
    engine = trt.build(plan.build)
    assert fake_tensorrt_llm == [
        ("from_hugging_face", "/models/target", "bfloat16", 0, 2),
        ("from_hugging_face", "/models/target", "bfloat16", 1, 2),
        ("from_checkpoint", 0, "float32"), ("build", 0), ("from_checkpoint", 1, "float32"), ("build", 1)]
    assert sorted(p.name for p in engine.iterdir()) == [
        "build_info.json", "config.json", "rank0.engine", "rank1.engine"]
    assert BuildRecord.read(engine) == BuildRecord(
        runtime="tensorrt-llm", role="target", dtype="bfloat16", vocab_size=400, architecture="LlamaForCausalLM",
        limits=BuildLimits(**{**LIMITS_OF_A_REQUEST, "max_draft_len": 8}),
        toolchain={"tensorrt_llm": "1.2.1", "tensorrt": "10.13.0", "cuda": "12.9"},
        gpu=GpuInfo(name="NVIDIA H100", sm="9.0"))
    # the engine's own config.json keeps TensorRT-LLM's format: its max_seq_len counts the draft positions
    engine_config = json.loads((engine / "config.json").read_text())["build_config"]
    assert engine_config["max_seq_len"] == LIMITS["max_seq_len"] + 8


def test_build_refuses_a_checkpoint_converted_for_other_ranks(fake_tensorrt_llm, tmp_path) -> None:
    trt.convert(engine_plans.convert_plan(make_spec(tp=2), "target", "LlamaForCausalLM", tmp_path / "ckpt"))
    with pytest.raises(UsageError, match="converted for 2 rank"):
        trt.build(engine_plans.build_plan(make_spec(tp=1), "target", tmp_path / "ckpt", tmp_path / "engine"))
    assert not (tmp_path / "engine").exists()
