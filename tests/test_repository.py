"""Contract tests of the rendered Triton repository: every config parses with Triton's own ModelConfig,
the ensemble's mappings agree with the composing models, and both runtimes give the same public interface."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from checkpoint_factory import Checkpoints, checkpoints  # noqa: F401 - session fixture
from specbuild.package import contract
from specbuild import compiler
from specbuild.package.repository import EngineInfo, read_config, render_repository, validate_repository
from specbuild.spec import load_spec
from test_pipeline import make_spec


@pytest.fixture(scope="module")
def torch_release(tmp_path_factory: pytest.TempPathFactory, checkpoints: Checkpoints) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("torch_release")
    return compiler.run(make_spec(root, checkpoints.target, checkpoints.draft), json_mode=True).repository


def test_every_config_parses_and_cross_checks(torch_release: Path) -> None:
    assert validate_repository(torch_release) == []
    for name in contract.MODEL_NAMES:
        text = (torch_release / name / "config.pbtxt").read_text()
        assert "${" not in text
        config = mc.ModelConfig()
        text_format.Parse(text, config)  # rejects any misspelled field
        assert config.name == name


def test_the_ensemble_keeps_nvidia_names_and_streams(torch_release: Path) -> None:
    ensemble = read_config(torch_release / "ensemble")
    assert ensemble.platform == "ensemble"
    names = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in ensemble.input}
    for name, dtype in [("text_input", "TYPE_STRING"), ("max_tokens", "TYPE_INT32"), ("stream", "TYPE_BOOL"),
                        ("temperature", "TYPE_FP32"), ("top_k", "TYPE_INT32"), ("top_p", "TYPE_FP32"),
                        ("random_seed", "TYPE_UINT64"), ("end_id", "TYPE_INT32"), ("pad_id", "TYPE_INT32"),
                        ("stop_words", "TYPE_STRING"), ("bad_words", "TYPE_STRING"),
                        ("exclude_input_in_output", "TYPE_BOOL"), ("return_perf_metrics", "TYPE_BOOL"),
                        ("num_draft_tokens", "TYPE_INT32")]:
        assert names[name][0] == dtype
    outputs = {t.name for t in ensemble.output}
    assert {"text_output", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} <= outputs
    assert [step.model_name for step in ensemble.ensemble_scheduling.step] == \
        ["preprocessing", "orchestrator", "postprocessing"]
    assert read_config(torch_release / "orchestrator").model_transaction_policy.decoupled


def test_engine_models_implement_the_tensorrtllm_interface(torch_release: Path) -> None:
    for role in ("target", "draft"):
        config = read_config(torch_release / role)
        assert config.backend == "python"
        inputs = {t.name for t in config.input}
        assert {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "draft_logits",
                "end_id", "runtime_top_k", "runtime_top_p", "temperature", "random_seed",
                "return_generation_logits"} <= inputs
        assert {t.name for t in config.output} == {"output_ids", "sequence_length", "generation_logits"}
    target = read_config(torch_release / "target")
    assert target.parameters["max_draft_len"].string_value == "8"
    assert read_config(torch_release / "draft").parameters["max_draft_len"].string_value == "0"
    tokenizer = torch_release / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"
    assert tokenizer.is_file() and (torch_release / "postprocessing" / "1" / "tokenizer" / "tokenizer.json").is_file()


def test_prompt_lookup_flows_like_adaptive_draft(torch_release: Path) -> None:
    """The per-request input reaches the orchestrator from the public ensemble input; its default and n-gram
    sizes are orchestrator parameters (off by default), with the target's vocabulary size for its logits."""
    ensemble = read_config(torch_release / "ensemble")
    for name in ("adaptive_draft", "prompt_lookup"):
        assert [(mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in ensemble.input
                if t.name == name] == [("TYPE_BOOL", [1], True)]
        assert ensemble.ensemble_scheduling.step[1].input_map[name] == name
        assert name in {t.name for t in read_config(torch_release / "orchestrator").input}
    params = {k: v.string_value for k, v in read_config(torch_release / "orchestrator").parameters.items()}
    assert (params["prompt_lookup"], params["lookup_max_ngram"], params["lookup_min_ngram"]) == ("false", "4", "2")
    assert int(params["vocab_size"]) == json.loads((torch_release.parent / "engines" / "target" / "build_info.json")
                                                   .read_text())["vocab_size"]


@pytest.mark.parametrize("damage", ["unmapped_required", "wrong_type", "unknown_model", "misspelled_field"])
def test_validation_names_what_is_broken(torch_release: Path, tmp_path: Path, damage: str) -> None:
    repo = shutil.copytree(torch_release, tmp_path / "repo")
    path = repo / "ensemble" / "config.pbtxt"
    text = path.read_text()
    if damage == "unmapped_required":
        config = read_config(repo / "ensemble")
        del config.ensemble_scheduling.step[1].input_map["max_tokens"]
        text = text_format.MessageToString(config)
        expected = "required input 'max_tokens' is not mapped"
    elif damage == "wrong_type":
        text = text.replace('name: "max_tokens"\n  data_type: TYPE_INT32', 'name: "max_tokens"\n  data_type: TYPE_FP32')
        expected = "max_tokens"
    elif damage == "unknown_model":
        text = text.replace('model_name: "postprocessing"', 'model_name: "detokenizer"')
        expected = "no such model"
    else:
        text = text.replace("max_batch_size", "max_batchsize")
        expected = "does not parse as ModelConfig"
    path.write_text(text)
    problems = validate_repository(repo)
    assert any(expected in problem for problem in problems), problems


def test_a_tensorrt_llm_release_renders_backend_configs(tmp_path: Path, checkpoints: Checkpoints) -> None:  # noqa: F811
    """Package a tensorrt-llm release from engine folders as TensorRT-LLM's build step leaves them
    (``build_info.json``; the engines themselves cannot be built without a GPU)."""
    spec = load_spec(None, {"runtime": "tensorrt-llm", "target.checkpoint": str(checkpoints.target),
                            "draft.checkpoint": str(checkpoints.draft), "target.tp_size": 2,
                            "speculation.prompt_lookup.enabled": True, "speculation.prompt_lookup.max_ngram": 3},
                     base_dir=tmp_path)
    engines = {}
    for role, max_draft in (("target", 8), ("draft", 0)):
        folder = tmp_path / "engines" / role
        folder.mkdir(parents=True)
        build = {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048 + max_draft,
                 "max_draft_len": max_draft}
        (folder / "build_info.json").write_text(json.dumps(
            {"runtime": "tensorrt-llm", "role": role, "dtype": "float16", "vocab_size": 400, "build_config": build}))
        engines[role] = EngineInfo.read(folder, role)
    repo = tmp_path / "triton_repo"
    repo.mkdir()
    factory = compiler.tensorrt_llm_engine_configs(spec, {"target": 0.7, "draft": 0.2},
                                                   {"target": 16448, "draft": 16384})
    render_repository(spec, engines["target"], engines["draft"], checkpoints.target, repo, engine_config=factory)
    assert validate_repository(repo) == []
    target = read_config(repo / "target")
    assert target.backend == "tensorrtllm"
    params = {key: value.string_value for key, value in target.parameters.items()}
    assert params["gpt_model_path"] == "/engines/target"
    assert params["enable_kv_cache_reuse"] == "true"
    assert float(params["kv_cache_free_gpu_mem_fraction"]) == pytest.approx(0.7)
    assert params["max_tokens_in_paged_kv_cache"] == "16448"
    draft = {key: value.string_value for key, value in read_config(repo / "draft").parameters.items()}
    assert float(draft["kv_cache_free_gpu_mem_fraction"]) + float(params["kv_cache_free_gpu_mem_fraction"]) <= 0.9
    assert not (repo / "target" / "1" / "model.py").exists()
    orchestrator = {key: value.string_value for key, value in read_config(repo / "orchestrator").parameters.items()}
    assert orchestrator["max_draft_len"] == "8"
    assert (orchestrator["prompt_lookup"], orchestrator["lookup_max_ngram"], orchestrator["lookup_min_ngram"],
            orchestrator["vocab_size"]) == ("true", "3", "2", "400")
