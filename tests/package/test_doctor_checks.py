"""The doctor's checks whose failures a CPU machine cannot reach through a real release: a python backend bug by the
image's Triton release, an engine that differs from its build record, RoPE as each transformers line exposes it.
Each runs the doctor's own functions on a release folder written here (manifest and facts as specbuild writes
them, trimmed to what the check reads)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbuild.doctor import release_doctor as doctor
from specbuild.doctor.facts import backend_bugs

RECORD = {"format": "specbuild.build/v1", "runtime": "tensorrt-llm", "role": "target", "dtype": "float16",
          "vocab_size": 1024, "architecture": "LlamaForCausalLM",
          "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512, "max_draft_len": 4}}


def release(folder: Path, *, manifest: dict | None = None, facts: dict | None = None) -> doctor.Release:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / doctor.MANIFEST).write_text(json.dumps({"spec": {"runtime": "tensorrt-llm-llmapi"}, "trees": {},
                                                      **(manifest or {})}))
    (folder / doctor.FACTS).write_text(json.dumps(facts or {}))
    return doctor.Release(folder, None, {})


def test_the_decoupled_async_exec_is_found_in_the_release_s_code_not_in_comments_or_other_calls(tmp_path):
    model = tmp_path / "llmapi_adapter" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("async def call(bls):\n    return await bls.async_exec(decoupled=True)\n")
    other = tmp_path / "orchestrator" / "1" / "model.py"
    other.parent.mkdir(parents=True)
    other.write_text('# never bls.async_exec(decoupled=True) here\nasync def call(bls):\n'
                     '    """not async_exec(decoupled=True)"""\n    return await bls.async_exec(decoupled=False)\n')
    [bug] = backend_bugs(tmp_path)
    assert bug["files"] == ["llmapi_adapter/1/model.py"] and bug["fixed_in"] == "26.07"


@pytest.mark.parametrize("triton, verdict", [("26.04", doctor.FAIL), ("26.06", doctor.FAIL),
                                             ("26.07", doctor.PASS), (None, doctor.UNCHECKABLE)])
def test_the_python_backend_bug_fails_in_images_before_its_fix(tmp_path, monkeypatch, triton, verdict):
    if triton is None:
        monkeypatch.delenv(doctor.TRITON_VERSION_ENV, raising=False)
    else:
        monkeypatch.setenv(doctor.TRITON_VERSION_ENV, triton)
    bug = {"name": "decoupled async_exec", "summary": "use-after-free", "fixed_in": "26.07",
           "source": "python_backend PR #439", "files": ["llmapi_adapter/1/model.py"]}
    [check] = doctor.check_python_backend(release(tmp_path, facts={"python_backend_bugs": [bug]}))
    assert check.verdict == verdict, check
    if verdict == doctor.FAIL:
        assert "llmapi_adapter/1/model.py" in check.evidence and "r26.07" in check.fix


def test_a_release_whose_models_hit_no_known_bug_passes_anywhere(tmp_path, monkeypatch):
    monkeypatch.delenv(doctor.TRITON_VERSION_ENV, raising=False)
    bug = {"name": "decoupled async_exec", "summary": "", "fixed_in": "26.07", "source": "", "files": []}
    [check] = doctor.check_python_backend(release(tmp_path, facts={"python_backend_bugs": [bug]}))
    assert check.verdict == doctor.PASS


def engine_release(tmp_path: Path, build_config: dict) -> doctor.Release:
    engine = tmp_path / "engines" / "target"
    engine.mkdir(parents=True)
    (engine / "config.json").write_text(json.dumps({
        "pretrained_config": {"dtype": "float16", "vocab_size": 1024, "architecture": "LlamaForCausalLM"},
        "build_config": build_config}))
    return release(tmp_path / "triton_repo", manifest={
        "spec": {"runtime": "tensorrt-llm"}, "trees": {"repository": ".", "engines": "../engines"},
        "engines_built": True, "extra": {"build_info": {"target": RECORD}}})


def test_engines_built_as_recorded_pass_and_one_built_otherwise_is_named(tmp_path):
    # trtllm-build's max_seq_len counts the drafted positions: 512 + 4
    as_built = {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 516, "max_draft_len": 4}
    [check] = doctor.check_engines(engine_release(tmp_path / "same", as_built))
    assert check.verdict == doctor.PASS, check
    [check] = doctor.check_engines(engine_release(tmp_path / "other", {**as_built, "max_batch_size": 4}))
    assert check.verdict == doctor.FAIL and "build_config.max_batch_size 4, the build record says 8" in check.evidence


def test_rope_is_read_as_each_transformers_line_exposes_it():
    # transformers 4.57 on a config saved by 5: its own rope_theta field (the default), rope_parameters kept aside
    four = SimpleNamespace(rope_theta=10000.0, rope_scaling=None,
                           rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    assert doctor._rope_as_read(four) == (10000.0, None)
    # transformers 5: RoPE only in rope_parameters, scaling included
    five = SimpleNamespace(rope_parameters={"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0})
    assert doctor._rope_as_read(five) == (500000.0, {"rope_type": "yarn", "factor": 4.0})
    # a legacy scaling names its kind "type"
    legacy = SimpleNamespace(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0})
    assert doctor._rope_as_read(legacy) == (1e6, {"rope_type": "linear", "factor": 2.0})
