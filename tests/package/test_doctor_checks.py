"""The doctor's checks whose failures a CPU machine cannot reach through a real release: a python backend bug by the
image's Triton release, an engine that differs from its build record, RoPE as each transformers line exposes it.
Each runs the doctor's own functions on a release folder written here (manifest and facts as specbuild writes
them, trimmed to what the check reads)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbuild.doctor import checked_release as checked
from specbuild.doctor import checkpoint_checks, environment_checks, release_doctor, runtime_checks
from specbuild.doctor.facts import backend_bugs

RECORD = {"format": "specbuild.build/v1", "runtime": "tensorrt-llm", "role": "target", "dtype": "float16",
          "vocab_size": 1024, "architecture": "LlamaForCausalLM",
          "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512, "max_draft_len": 4}}


def release(folder: Path, *, manifest: dict | None = None, facts: dict | None = None) -> checked.FoundRelease:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / checked.MANIFEST).write_text(json.dumps({"spec": {"runtime": "tensorrt-llm-llmapi"}, "trees": {},
                                                      **(manifest or {})}))
    (folder / checked.FACTS).write_text(json.dumps(facts or {}))
    return checked.FoundRelease(folder, None, {})


def test_the_doctor_runs_alone_with_its_parts_beside_it_on_the_standard_library(tmp_path):
    """As a release ships it (``doctor.py`` and its parts), run without site-packages: no specbuild, no bytecode
    cache left in the folder (Triton would take a folder there for a model)."""
    here = Path(release_doctor.__file__).parent
    shutil.copy2(here / "release_doctor.py", tmp_path / "doctor.py")
    for part in release_doctor.PARTS:
        shutil.copy2(here / part, tmp_path / part)
    release(tmp_path, manifest={"spec": {"name": "alone", "runtime": "torch"}})
    result = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "doctor.py"), "--json"], capture_output=True,
                            text=True, timeout=60)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"] and report["release"] == "alone", result.stderr
    assert {check["name"] for check in report["checks"]} >= {"files", "packages", "config:target", "python-backend"}
    assert not (tmp_path / "__pycache__").exists()


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


@pytest.mark.parametrize("triton, verdict", [("26.04", checked.FAIL), ("26.06", checked.FAIL),
                                             ("26.07", checked.PASS), (None, checked.UNCHECKABLE)])
def test_the_python_backend_bug_fails_in_images_before_its_fix(tmp_path, monkeypatch, triton, verdict):
    if triton is None:
        monkeypatch.delenv(checked.TRITON_VERSION_ENV, raising=False)
    else:
        monkeypatch.setenv(checked.TRITON_VERSION_ENV, triton)
    bug = {"name": "decoupled async_exec", "summary": "use-after-free", "fixed_in": "26.07",
           "source": "python_backend PR #439", "files": ["llmapi_adapter/1/model.py"]}
    [check] = environment_checks.check_python_backend(release(tmp_path, facts={"python_backend_bugs": [bug]}))
    assert check.verdict == verdict, check
    if verdict == checked.FAIL:
        assert "llmapi_adapter/1/model.py" in check.evidence and "r26.07" in check.fix


def test_a_release_whose_models_hit_no_known_bug_passes_anywhere(tmp_path, monkeypatch):
    monkeypatch.delenv(checked.TRITON_VERSION_ENV, raising=False)
    bug = {"name": "decoupled async_exec", "summary": "", "fixed_in": "26.07", "source": "", "files": []}
    [check] = environment_checks.check_python_backend(release(tmp_path, facts={"python_backend_bugs": [bug]}))
    assert check.verdict == checked.PASS


def engine_release(tmp_path: Path, build_config: dict) -> checked.FoundRelease:
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
    [check] = runtime_checks.check_engines(engine_release(tmp_path / "same", as_built))
    assert check.verdict == checked.PASS, check
    [check] = runtime_checks.check_engines(engine_release(tmp_path / "other", {**as_built, "max_batch_size": 4}))
    assert check.verdict == checked.FAIL and "build_config.max_batch_size 4, the build record says 8" in check.evidence


def test_rope_is_read_as_each_transformers_line_exposes_it():
    # transformers 4.57 on a config saved by 5: its own rope_theta field (the default), rope_parameters kept aside
    four = SimpleNamespace(rope_theta=10000.0, rope_scaling=None,
                           rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    assert checkpoint_checks._rope_as_read(four) == (10000.0, None)
    # transformers 5: RoPE only in rope_parameters, scaling included
    five = SimpleNamespace(rope_parameters={"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0})
    assert checkpoint_checks._rope_as_read(five) == (500000.0, {"rope_type": "yarn", "factor": 4.0})
    # a legacy scaling names its kind "type"
    legacy = SimpleNamespace(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0})
    assert checkpoint_checks._rope_as_read(legacy) == (1e6, {"rope_type": "linear", "factor": 2.0})
