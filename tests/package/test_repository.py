"""Contract tests of the rendered Triton repository: every config parses with Triton's own ModelConfig,
the ensemble's mappings agree with the composing models, and every runtime gives the same public interface."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from checkpoint_factory import Checkpoints, pair_spec, package_gpu_release, package_llmapi_release
from specbuild import compiler
from specbuild.errors import StageError, VerificationError
from specbuild.package import contract
from specbuild.package.backend_contract import ENGINE_INPUTS
from specbuild.runtimes.torch.parameters import TorchEngineParameters
from specbuild.package.manifest import verify
from specbuild.package.repository import read_config, validate_repository
from specbuild.package.vendor import PACKAGE_MARKER, SOURCE_ROOT, closure


@pytest.fixture(scope="module")
def torch_release(tmp_path_factory: pytest.TempPathFactory, checkpoints: Checkpoints) -> Path:
    root = tmp_path_factory.mktemp("torch_release")
    return compiler.run(pair_spec(root, checkpoints.target, checkpoints.draft), json_mode=True).repository


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
        # the backend's inputs, and the guide masks and block verification the torch engine applies (specbuild's own)
        assert [t.name for t in config.input] == [t.name for t in ENGINE_INPUTS] + ["guide_token_masks",
                                                                                    "block_verification"]
        assert {t.name for t in config.output} == {"output_ids", "sequence_length", "generation_logits"}
        params = {key: value.string_value for key, value in config.parameters.items()}
        assert TorchEngineParameters.from_parameters(params).gpt_model_path == f"engines/{role}"
    tokenizer = torch_release / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"
    assert tokenizer.is_file() and (torch_release / "postprocessing" / "1" / "tokenizer" / "tokenizer.json").is_file()
    assert (torch_release / "orchestrator" / "1" / "tokenizer" / "tokenizer.json").is_file()  # it compiles guides
    orchestrator = read_config(torch_release / "orchestrator")
    assert orchestrator.parameters["guided_decoding"].string_value == "true"
    assert orchestrator.parameters["verification"].string_value == "token"  # the spec's default


# What may differ between a torch and a tensorrt-llm release's engine configs: the backend, the weights path (a
# container mount for TensorRT-LLM, the release folder for torch), where the devices come from (the launch
# layout; the torch runtime picks its device itself), the torch runtime's own keys, and the backend's own guided
# decoding (a tensorrt-llm target's; a torch engine takes guide masks instead).
ENGINE_CONFIG_DIFFERENCES = {"backend", "gpt_model_path", "gpu_device_ids", "kv_cache_free_gpu_mem_fraction",
                             "torch_device", "torch_threads", "guided_decoding_backend", "xgrammar_tokenizer_info_path"}


def test_both_runtimes_render_the_same_engine_configs(torch_release: Path, tmp_path: Path,
                                                      checkpoints: Checkpoints) -> None:
    gpu = package_gpu_release(checkpoints, tmp_path, {"limits.max_seq_len": 128}).repository  # the torch one's
    for role in ("target", "draft"):
        torch_config, gpu_config = read_config(torch_release / role), read_config(gpu / role)
        assert (torch_config.backend, gpu_config.backend) == ("python", "tensorrtllm")
        for message in (torch_config, gpu_config):
            message.ClearField("backend")
        torch_params = {k: v.string_value for k, v in torch_config.parameters.items()}
        gpu_params = {k: v.string_value for k, v in gpu_config.parameters.items()}
        differing = {key for key in torch_params.keys() | gpu_params.keys()
                     if torch_params.get(key) != gpu_params.get(key)}
        assert differing <= ENGINE_CONFIG_DIFFERENCES, differing
        torch_config.ClearField("parameters")
        gpu_config.ClearField("parameters")
        # the torch engine's inputs of specbuild's own, guide masks and block verification, last (the tensorrtllm
        # backend has neither)
        assert [torch_config.input.pop().name for _ in range(2)] == ["block_verification", "guide_token_masks"]
        assert torch_config == gpu_config  # inputs, outputs, batching, instances: identical


def test_every_runtime_serves_the_same_public_interface(torch_release: Path, tmp_path: Path,
                                                       checkpoints: Checkpoints) -> None:
    """The ensemble of a torch, a tensorrt-llm and a tensorrt-llm-llmapi release: the same inputs and outputs
    (names, types, shapes, optional), batching and streaming; only what sits behind it differs."""
    releases = {"torch": torch_release, "tensorrt-llm": package_gpu_release(checkpoints, tmp_path / "gpu").repository,
                "tensorrt-llm-llmapi": package_llmapi_release(checkpoints, tmp_path / "llmapi").repository}

    def interface(repository: Path) -> tuple[list[str], list[str], int]:
        ensemble = read_config(repository / contract.ENSEMBLE_MODEL)
        return ([text_format.MessageToString(t, as_one_line=True) for t in ensemble.input],
                [text_format.MessageToString(t, as_one_line=True) for t in ensemble.output], ensemble.max_batch_size)

    interfaces = {name: interface(repository) for name, repository in releases.items()}
    assert interfaces["torch"] == interfaces["tensorrt-llm"] == interfaces["tensorrt-llm-llmapi"]
    inputs, outputs, _ = interfaces["torch"]
    assert len(inputs) == len(contract.ENSEMBLE_INPUTS) and len(outputs) == len(contract.ENSEMBLE_OUTPUTS)
    steps = {name: [step.model_name for step in read_config(repository / contract.ENSEMBLE_MODEL)
                    .ensemble_scheduling.step] for name, repository in releases.items()}
    assert steps["tensorrt-llm-llmapi"] == ["llmapi_adapter"] != steps["torch"]


def test_prompt_lookup_flows_like_adaptive_draft(torch_release: Path) -> None:
    """The per-request input reaches the orchestrator from the public ensemble input; its default and n-gram
    sizes are orchestrator parameters (off by default)."""
    ensemble = read_config(torch_release / "ensemble")
    for name in ("adaptive_draft", "prompt_lookup"):
        assert [(mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in ensemble.input
                if t.name == name] == [("TYPE_BOOL", [1], True)]
        assert ensemble.ensemble_scheduling.step[1].input_map[name] == name
        assert name in {t.name for t in read_config(torch_release / "orchestrator").input}
    params = {k: v.string_value for k, v in read_config(torch_release / "orchestrator").parameters.items()}
    assert (params["prompt_lookup"], params["lookup_max_ngram"], params["lookup_min_ngram"]) == ("false", "4", "2")


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


def test_a_tensorrt_llm_release_renders_backend_configs(tmp_path: Path, checkpoints: Checkpoints) -> None:
    """Package a tensorrt-llm release from engine folders as TensorRT-LLM's build step leaves them
    (``build_info.json``; the engines themselves cannot be built without a GPU)."""
    result = package_gpu_release(checkpoints, tmp_path, {"target.tp_size": 2, "speculation.prompt_lookup.enabled": True,
                                                         "speculation.prompt_lookup.max_ngram": 3})
    repo = result.repository
    assert result.engines_built and validate_repository(repo) == []
    target = read_config(repo / "target")
    assert target.backend == "tensorrtllm"
    params = {key: value.string_value for key, value in target.parameters.items()}
    assert params["gpt_model_path"] == "/engines/target"
    assert params["enable_kv_cache_reuse"] == "true"
    assert (params["gpu_device_ids"], params.get("participant_ids")) == ("0,1", None)  # orchestrator mode spawns
    draft = {key: value.string_value for key, value in read_config(repo / "draft").parameters.items()}
    assert float(draft["kv_cache_free_gpu_mem_fraction"]) + float(params["kv_cache_free_gpu_mem_fraction"]) <= 0.9
    assert not (repo / "target" / "1" / "model.py").exists()
    orchestrator = {key: value.string_value for key, value in read_config(repo / "orchestrator").parameters.items()}
    assert (orchestrator["max_draft_len"], orchestrator["max_seq_len"]) == ("8", "192")  # from the target's record
    assert (orchestrator["prompt_lookup"], orchestrator["lookup_max_ngram"], orchestrator["lookup_min_ngram"]) == (
        "true", "3", "2")


def test_package_without_engines_renders_the_whole_gpu_repository_marked(tmp_path: Path,
                                                                        checkpoints: Checkpoints) -> None:
    """``specbuild package --runtime tensorrt-llm`` on a machine without TensorRT-LLM: every config and the
    manifest, engines planned not built; verify refuses it (so do serve and deploy, which read the release)."""
    from click.testing import CliRunner

    from specbuild.cli import main
    from specbuild.package.manifest import read_release

    root = tmp_path / "rel"
    args = ["--target", str(checkpoints.target), "--draft", str(checkpoints.draft), "--runtime", "tensorrt-llm",
            "--set", f"outputs.build_dir={root / 'build'}", "--set", f"outputs.engines_dir={root / 'engines'}",
            "--set", f"outputs.repository_dir={root / 'triton_repo'}", "--set", "target.tp_size=2"]
    dry = CliRunner().invoke(main, ["package", "--dry-run", *args])
    assert dry.exit_code == 0, dry.output
    assert not root.exists()  # --dry-run writes nothing
    result = CliRunner().invoke(main, ["package", "--json", *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["engines_built"] is False
    repo = root / "triton_repo"
    assert validate_repository(repo) == [] and not (root / "engines").exists()
    params = {k: v.string_value for k, v in read_config(repo / "target").parameters.items()}
    assert params["gpt_model_path"] == "/engines/target" and params["gpu_device_ids"] == "0,1"
    manifest = json.loads((repo / "manifest.json").read_text())
    assert manifest["engines_built"] is False and set(manifest["trees"]) == {"repository"}
    for refuse in (lambda: read_release(repo), lambda: verify(repo)):
        with pytest.raises(VerificationError, match="packaged without engines") as refused:
            refuse()
        assert "specbuild compile" in refused.value.fix
    for command in (["verify", str(repo)], ["serve", str(repo), "--dry-run"],
                    ["deploy", str(repo), "--k8s", str(tmp_path / "k8s"), "--pvc", "p"]):
        refused = CliRunner().invoke(main, command)
        assert refused.exit_code == 1 and "packaged without engines" in refused.output, command


def test_every_python_model_ships_the_specbuild_modules_it_imports(torch_release: Path) -> None:
    """The release is self-contained: each python model has its import closure beside its model.py, the
    packages marked, and nothing that needs more than numpy, torch and transformers."""
    for name in (contract.PREPROCESSING_MODEL, contract.ORCHESTRATOR_MODEL, contract.POSTPROCESSING_MODEL, "target"):
        version = torch_release / name / "1"
        modules = closure(version / "model.py")
        assert modules
        for module in modules:
            shipped = version / Path(*module.split(".")).with_suffix(".py")
            assert shipped.read_bytes() == (SOURCE_ROOT.parent / Path(*module.split(".")).with_suffix(".py")).read_bytes()
        assert (version / "specbuild" / "__init__.py").read_text() == PACKAGE_MARKER
    assert not list(torch_release.glob("*/1/specbuild/compiler.py"))  # nothing beyond the closures


def test_a_serving_module_that_needs_specbuild_s_own_environment_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("from specbuild.spec import BuildSpec\n")  # PyYAML: not in the Triton image
    with pytest.raises(StageError, match="imports 'yaml'"):
        closure(model)
