"""The tensorrt-llm-llmapi runtime without TensorRT-LLM: the pair check, ``compile --dry-run`` and ``package``,
the repository (configs parse as ModelConfig, model.yaml reads back), the manifest and ``verify`` of a release
that serves its checkpoints, ``runtime: auto``, and the launch, compose-free docker, Kubernetes and KServe plans."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_factory import Checkpoints, package_llmapi_release, release_spec
from specbuild import compiler
from specbuild.runtimes.registry import best_available, runtime_for
from specbuild.runtimes.tensorrt_llm_llmapi.runtime import PYTORCH_ARCHITECTURES
from specbuild.check.pair_report import check
from specbuild.cli import main
from specbuild.errors import SpecError, UsageError
from specbuild.package import contract
from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml, ServeConfig, parse
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES
from specbuild.runtimes.tensorrt_llm_llmapi.contract import (
    ADAPTER_MODEL,
    IMAGE_MODEL_DIR,
    LLMAPI_INPUTS,
    LLMAPI_MODEL,
    LLMAPI_MODEL_NAMES,
    LLMAPI_OUTPUTS,
    MODEL_YAML,
    SERVE_CONFIG,
    LLMAPIAdapterParameters,
)
from specbuild.package.manifest import read_release, verify
from specbuild.package.repository import read_config, validate_repository
from specbuild.serve.k8s import manifests
from specbuild.runtimes.pod_plans import DeployOptions, ReleaseFootprint
from specbuild.runtimes.tensorrt_llm_llmapi.launch import LLMAPI_LAUNCH
from specbuild.runtimes.trtllm_image import TRITONSERVER
from specbuild.serve.release_launch import release_launch_plan
from k8s_objects import validate

RUNTIME = "tensorrt-llm-llmapi"


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory, checkpoints: Checkpoints) -> compiler.CompileResult:
    return package_llmapi_release(checkpoints, tmp_path_factory.mktemp("llmapi"))


def parameters(config) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


# --- the pair check ----------------------------------------------------------------------------------------
def test_architectures_come_from_the_pytorch_backend_table() -> None:
    runtime = runtime_for(RUNTIME)
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"} <= PYTORCH_ARCHITECTURES
    assert runtime.unsupported("LlamaForCausalLM") is None
    assert "no native model for GPT2LMHeadModel" in runtime.unsupported("GPT2LMHeadModel")


@pytest.mark.parametrize(("overrides", "code"), [
    ({"triton.tensorrt_llm": "main", "speculation.busy_in_flight": 1}, "load-policy"),
    ({"speculation.adaptive": True}, "adaptive"),
    ({"speculation.prompt_lookup.enabled": True}, "prompt-lookup"),
    ({"speculation.draft_context": 256}, "draft-context"),
    ({"draft.tp_size": 2}, "draft-layout"),
    ({"draft.dtype": "float16"}, "draft-dtype"),
    ({"launch.mode": "orchestrator"}, "launch"),
    ({"capture.enabled": True}, "capture"),
    ({"target.dtype": "float32", "draft.dtype": "float32"}, "target-dtype"),
])
def test_what_the_llm_api_fixes_at_load_is_refused_by_check(tmp_path: Path, checkpoints: Checkpoints,
                                                            overrides: dict, code: str) -> None:
    spec = release_spec(checkpoints, tmp_path, RUNTIME, overrides)
    report = check(spec.target.checkpoint, spec.draft.checkpoint, spec)
    assert not report.compatible
    assert code in {reason.code for reason in report.reasons}
    assert all(reason.fix for reason in report.reasons)


def test_capture_is_refused_because_the_llm_api_model_returns_no_token_ids(tmp_path: Path,
                                                                          checkpoints: Checkpoints) -> None:
    """A capture record holds token ids; the LLM-API model's outputs (its contract table) carry text and per-request
    totals only. Should upstream add token ids, this fails and capture may be built for this runtime."""
    outputs = {tensor.name for tensor in LLMAPI_OUTPUTS}
    assert "text_output" in outputs and not [name for name in outputs if "ids" in name or "token_id" in name]
    spec = release_spec(checkpoints, tmp_path, RUNTIME, {"capture.enabled": True})
    [reason] = [r for r in check(spec.target.checkpoint, spec.draft.checkpoint, spec).reasons if r.code == "capture"]
    assert "returns the text only, not the token ids" in reason.message and "no per-round" in reason.message
    assert "capture.enabled: false" in reason.fix and "--runtime torch (or tensorrt-llm)" in reason.fix


def test_k_0_packages_the_target_alone(tmp_path: Path, checkpoints: Checkpoints) -> None:
    spec = release_spec(checkpoints, tmp_path, RUNTIME, {"speculation.num_draft_tokens": 0})
    assert check(spec.target.checkpoint, spec.draft.checkpoint, spec).compatible
    result = compiler.run(spec, json_mode=True)
    version = result.repository / LLMAPI_MODEL / "1"
    typed = parse(ModelYaml, (version / MODEL_YAML).read_text(), MODEL_YAML, LINES[spec.triton.tensorrt_llm])
    assert typed.speculative_config is None
    adapter = LLMAPIAdapterParameters.from_parameters(parameters(read_config(result.repository / ADAPTER_MODEL)))
    assert adapter.num_draft_tokens == 0


def test_engines_cannot_be_built_for_a_tensorrt_llm_without_the_engine_flow(tmp_path: Path,
                                                                            checkpoints: Checkpoints) -> None:
    for runtime, compatible in (("tensorrt-llm", False), (RUNTIME, True)):
        spec = release_spec(checkpoints, tmp_path, runtime, {"triton.tensorrt_llm": "main"})
        report = check(spec.target.checkpoint, spec.draft.checkpoint, spec)
        assert report.compatible is compatible
        if not compatible:
            [reason] = [r for r in report.reasons if r.code == "tensorrt-llm-line"]
            assert "--runtime tensorrt-llm-llmapi" in reason.fix


def test_draft_logits_acceptance_is_a_warning_and_the_check_reports_token_matching(
        tmp_path: Path, checkpoints: Checkpoints) -> None:
    spec = release_spec(checkpoints, tmp_path, RUNTIME)
    assert spec.speculation.acceptance == "draft-logits"  # the spec's default
    report = check(spec.target.checkpoint, spec.draft.checkpoint, spec)
    assert report.compatible and report.acceptance == "token-match"
    assert "acceptance" in {warning.code for warning in report.warnings}
    # the memory plan splits the KV memory between the two models, as TensorRT-LLM does (bytes per token)
    plan = report.memory
    assert plan.target_kv_fraction > plan.draft_kv_fraction > 0
    assert plan.target.kv_tokens == plan.draft.kv_tokens


# --- compile --dry-run and package ----------------------------------------------------------------------
def test_compile_dry_run_plans_no_conversion_or_build(tmp_path: Path, checkpoints: Checkpoints) -> None:
    args = ["compile", "--dry-run", "--json", "--runtime", RUNTIME, "--target", str(checkpoints.target),
            "--draft", str(checkpoints.draft), "--set", f"outputs.repository_dir={tmp_path / 'repo'}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)
    assert described["steps"] == ["check", "package", "manifest"]
    assert described["models"]["draft"]["mounted_at"] == "/checkpoints/draft"
    assert (described["models"]["target"]["convert"], described["models"]["target"]["build"]) == (None, None)
    assert not (tmp_path / "repo").exists()
    text = CliRunner().invoke(main, args[:2] + args[3:]).output
    assert "no conversion or engine build" in text and "max_draft_len 4" in text


def test_compile_is_check_and_package_and_the_release_is_complete(release: compiler.CompileResult) -> None:
    assert [step.name for step in release.steps] == ["check", "package"]
    assert release.engines_built and not release.engines.exists()
    assert compiler.run(release.spec, json_mode=True).steps[1].status == "skipped"  # incremental like the others


def test_every_config_parses_and_the_repository_cross_checks(release: compiler.CompileResult) -> None:
    repo = release.repository
    assert validate_repository(repo, LLMAPI_MODEL_NAMES) == []
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == sorted(LLMAPI_MODEL_NAMES)
    ensemble = read_config(repo / contract.ENSEMBLE_MODEL)
    assert [step.model_name for step in ensemble.ensemble_scheduling.step] == [ADAPTER_MODEL]
    adapter = read_config(repo / ADAPTER_MODEL)
    assert adapter.model_transaction_policy.decoupled
    assert LLMAPIAdapterParameters.from_parameters(parameters(adapter)) == LLMAPIAdapterParameters(
        num_draft_tokens=4, end_id=1, streams=False, max_request_seconds=release.spec.triton.max_request_seconds,
        tensorrt_llm="1.2", draft_max_seq_len=release.spec.limits.draft_max_seq_len)
    llmapi = read_config(repo / LLMAPI_MODEL)
    assert (llmapi.backend, llmapi.max_batch_size, llmapi.model_transaction_policy.decoupled) == ("python", 0, True)
    assert [t.name for t in llmapi.input] == [t.name for t in LLMAPI_INPUTS]
    assert [t.name for t in llmapi.output] == [t.name for t in LLMAPI_OUTPUTS]
    assert [t.name for t in llmapi.input if not t.optional] == ["text_input"]


def test_the_llmapi_model_is_the_images_with_a_typed_model_yaml(release: compiler.CompileResult) -> None:
    version = release.repository / LLMAPI_MODEL / "1"
    assert sorted(p.name for p in version.iterdir()) == sorted(["helpers.py", MODEL_YAML, "model.py"])
    for name in ("model.py", "helpers.py"):  # links into the NGC image: no upstream code in the release
        assert (version / name).is_symlink() and os.readlink(version / name) == f"{IMAGE_MODEL_DIR}/{name}"
    spec = release.spec
    line = LINES[spec.triton.tensorrt_llm]
    typed = parse(ModelYaml, (version / MODEL_YAML).read_text(), MODEL_YAML, line)
    assert typed.speculative_config.decoding_type == "DraftTarget"  # 1.2.1's dispatch key (the default line)
    assert (typed.model, typed.speculative_config.speculative_model) == ("/checkpoints/target", "/checkpoints/draft")
    assert (typed.max_seq_len, typed.max_input_len, typed.max_batch_size) == (192, 64, 8)
    assert typed.speculative_config.max_draft_len == spec.speculation.num_draft_tokens
    check_data = release.check
    assert typed.kv_cache_config.max_tokens == check_data["kv_tokens"]["target"]
    assert typed.kv_cache_config.free_gpu_memory_fraction == pytest.approx(sum(check_data["kv_fractions"].values()),
                                                                           abs=1e-4)
    serve = parse(ServeConfig, (release.repository / SERVE_CONFIG).read_text(), SERVE_CONFIG, line)
    assert serve.model_dump() == {**typed.model_dump(exclude={"triton_config"}), "model": None}


def test_the_adapter_ships_its_modules_and_the_tokenizer(release: compiler.CompileResult) -> None:
    version = release.repository / ADAPTER_MODEL / "1"
    assert (version / "tokenizer" / "tokenizer.json").is_file()
    shipped = {p.relative_to(version).as_posix() for p in (version / "specbuild").rglob("*.py")}
    assert {"specbuild/runtimes/tensorrt_llm_llmapi/requests.py", "specbuild/runtimes/tensorrt_llm_llmapi/tensors.py"} <= shipped
    assert not any("torch_engine" in name or "llmapi_config" in name for name in shipped)


def test_no_python_model_calls_async_exec_decoupled() -> None:
    """python_backend's async_exec(decoupled=True) dereferences a freed stub in the 26.04-26.06 images (its PR #439,
    r26.07 only): every decoupled BLS call is the synchronous exec, on a worker thread."""
    import re

    import specbuild

    calls = re.compile(r"\.async_exec\(\s*decoupled\s*=\s*True")
    found = [str(path) for path in Path(specbuild.__file__).parent.rglob("*.py") if calls.search(path.read_text())]
    assert found == []


def test_a_tokenizer_the_image_cannot_load_is_named_as_the_adapter_s_portable_copy(
        release: compiler.CompileResult, checkpoints: Checkpoints) -> None:
    """The factory's tokenizer_config names TokenizersBackend (transformers 5's class): LLM() in the image would
    fail on the mounted folder's, so model.yaml and trtllm-serve.yaml name the portable copy the adapter ships."""
    assert json.loads((checkpoints.target / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "TokenizersBackend"
    line = LINES[release.spec.triton.tensorrt_llm]
    typed = parse(ModelYaml, (release.repository / LLMAPI_MODEL / "1" / MODEL_YAML).read_text(), MODEL_YAML, line)
    assert typed.tokenizer == f"{release.spec.triton.repository_mount}/{ADAPTER_MODEL}/1/tokenizer"
    shipped = release.repository / ADAPTER_MODEL / "1" / "tokenizer" / "tokenizer_config.json"
    assert json.loads(shipped.read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert parse(ServeConfig, (release.repository / SERVE_CONFIG).read_text(), SERVE_CONFIG, line).tokenizer == \
        typed.tokenizer


def test_a_portable_tokenizer_is_loaded_from_the_model_folder(tmp_path: Path, checkpoints: Checkpoints) -> None:
    from dataclasses import replace

    from checkpoint_factory import copy_checkpoint, edit_json

    target = copy_checkpoint(checkpoints.target, tmp_path / "target")
    edit_json(target / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")
    found = compiler.run(release_spec(replace(checkpoints, target=target), tmp_path, RUNTIME), json_mode=True)
    line = LINES[found.spec.triton.tensorrt_llm]
    typed = parse(ModelYaml, (found.repository / LLMAPI_MODEL / "1" / MODEL_YAML).read_text(), MODEL_YAML, line)
    assert typed.tokenizer is None


# --- manifest and verify ----------------------------------------------------------------------------------
def test_the_manifest_names_the_served_checkpoints_and_verify_rehashes_them(tmp_path: Path,
                                                                           checkpoints: Checkpoints) -> None:
    target = shutil.copytree(checkpoints.target, tmp_path / "target")
    result = package_llmapi_release(checkpoints, tmp_path, {"target.checkpoint": str(target)})
    manifest = json.loads(result.manifest.read_text())
    assert manifest["engines_built"] is True and set(manifest["trees"]) == {"repository"}
    assert manifest["checkpoints"] == {"target": str(target.resolve()), "draft": str(checkpoints.draft.resolve())}
    assert set(manifest["extra"]["build_info"]) == {"target", "draft"}
    report = verify(result.repository)
    assert report.ok and report.checked > len(manifest["files"])
    assert read_release(result.repository).checkpoints["target"] == target.resolve()
    (target / "config.json").write_text((target / "config.json").read_text() + " ")
    (target / "extra.bin").write_bytes(b"x")
    changed = verify(result.repository)
    assert changed.changed == ["target checkpoint/config.json"] and changed.extra == ["target checkpoint/extra.bin"]
    refused = CliRunner().invoke(main, ["verify", str(result.repository)])
    assert refused.exit_code == 1 and "target checkpoint/config.json" in refused.output


# --- runtime: auto --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("engine_flow", "expected"), [(True, "tensorrt-llm"), (False, RUNTIME)])
def test_auto_picks_the_engine_flow_where_it_is_installed_else_the_llm_api(tmp_path: Path, monkeypatch,
                                                                           engine_flow: bool, expected: str) -> None:
    package = tmp_path / "tensorrt_llm"
    (package / "llmapi").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if engine_flow:
        (package / "builder.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert best_available() == expected
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    assert best_available() == "torch"  # neither here


# --- launch plans, Kubernetes, KServe ------------------------------------------------------------------
def test_serve_dry_run_mounts_the_checkpoints_and_runs_one_mpi_rank(release: compiler.CompileResult) -> None:
    result = CliRunner().invoke(main, ["serve", str(release.repository), "--dry-run"])
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.output.strip().splitlines()[-1])
    mounts = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--mount"]
    assert mounts == [f"type=bind,source={release.spec.target.checkpoint},target=/checkpoints/target,readonly",
                      f"type=bind,source={release.spec.draft.checkpoint},target=/checkpoints/draft,readonly",
                      f"type=bind,source={release.repository},target=/triton_repo,readonly"]
    server = argv[argv.index(release.spec.triton.image) + 1:]
    assert server[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", TRITONSERVER]
    assert {"--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_"} <= set(server)
    assert "tensorrt-llm-llmapi runtime" in result.output


@pytest.mark.parametrize(("launch", "ranks", "prefix"), [({}, 1, []), ({"launch.mode": "leader"}, 4, [LLMAPI_LAUNCH])])
def test_multi_gpu_is_spawned_by_the_llm_or_launched_by_mpi(tmp_path: Path, checkpoints: Checkpoints,
                                                            launch: dict, ranks: int, prefix: list[str]) -> None:
    result = package_llmapi_release(checkpoints, tmp_path, {"target.tp_size": 2, "target.pp_size": 2,
                                                            "draft.tp_size": 2, "draft.pp_size": 2, **launch})
    plan = release_launch_plan(result.repository, {})
    assert (plan.gpu_count, plan.world_size) == (4, ranks)
    head = ("mpirun", "--allow-run-as-root", "-n", str(ranks), *prefix, TRITONSERVER)
    assert plan.server_argv[:len(head)] == head
    assert plan.devices["draft"].gpu_device_ids == plan.devices["target"].gpu_device_ids == (0, 1, 2, 3)
    with pytest.raises(UsageError, match="needs 4 GPUs"):
        release_launch_plan(result.repository, {}, gpus=2)


def test_a_launch_the_release_was_not_packaged_for_is_refused(release: compiler.CompileResult, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="target.tp_size=1"):
        release_launch_plan(release.repository, {"target.tp_size": 2})
    copy = shutil.copytree(release.repository, tmp_path / "repo", symlinks=True)
    path = copy / LLMAPI_MODEL / "1" / MODEL_YAML
    path.write_text(path.read_text().replace("/checkpoints/draft", "/models/draft"))
    with pytest.raises(SpecError, match="speculative_model is '/models/draft'"):
        release_launch_plan(copy, {}, verify_files=False)


@pytest.mark.parametrize("kserve", [False, True])
def test_kubernetes_and_kserve_manifests_validate_and_mount_the_checkpoints(release: compiler.CompileResult,
                                                                           kserve: bool) -> None:
    objects = manifests(release.spec, ReleaseFootprint.of(read_release(release.repository)),
                        DeployOptions(pvc="models"), kserve=kserve)
    containers = objects[0]["spec"]["containers"] if kserve else objects[0]["spec"]["template"]["spec"]["containers"]
    for obj in objects:
        validate(obj)  # core kinds against Kubernetes' schemas, KServe's and the PodMonitor against their CRDs'
    mounts = {m["mountPath"]: m for m in containers[0]["volumeMounts"]}
    assert mounts["/checkpoints/target"]["subPath"] == Path(release.spec.target.checkpoint).name
    assert mounts["/checkpoints/draft"]["subPath"] == Path(release.spec.draft.checkpoint).name
    assert mounts["/triton_repo"]["subPath"] == release.repository.name
    assert containers[0]["args"][:5] == ["mpirun", "--allow-run-as-root", "-n", "1", TRITONSERVER]
    assert len(containers) == 1  # no OpenAI-compatible API: it calls specbuild's orchestrator, which is not here
    [metric] = objects[2]["spec"]["metrics"]  # the HPA: on the adapter's gauge (the LLM-API model has none)
    assert metric["pods"]["metric"] == {"name": "specbuild_requests_in_flight",
                                        "selector": {"matchLabels": {"model": ADAPTER_MODEL}}}
    # the weights it loads are the checkpoints: counted in the memory request
    assert int(containers[0]["resources"]["requests"]["memory"].removesuffix("Gi")) >= 2 + 2 + 1


def test_checkpoint_folders_of_the_same_name_cannot_share_a_volume(tmp_path: Path,
                                                                  checkpoints: Checkpoints) -> None:
    draft = shutil.copytree(checkpoints.draft, tmp_path / "other" / "target")
    spec = release_spec(checkpoints, tmp_path, RUNTIME, {"draft.checkpoint": str(draft)})
    with pytest.raises(UsageError, match="different names"):
        manifests(spec, ReleaseFootprint(0, None), DeployOptions(pvc="models"))
