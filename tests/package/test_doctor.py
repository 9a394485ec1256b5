"""``specbuild doctor`` on the tiny pair's three releases here: the torch release (every check passes or says why it
cannot run here), the tensorrt-llm release packaged without engines and the tensorrt-llm-llmapi release (what a CPU
can check passes, the rest is "not checkable here" with why); a tampered release fails, naming the file; the command
that runs it in an image mounts the release as ``serve`` does. The same doctor in the image's Python:
tests/product/test_release_image.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_CACHE_DIR
from checkpoint_factory import pair_spec

PASS, FAIL, UNCHECKABLE = "pass", "fail", "not checkable here"
IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
pytestmark = pytest.mark.slow  # the tiny pair's releases


def verdicts(report) -> dict[str, str]:
    return {check.name: check.verdict for check in report.checks}


@pytest.fixture(scope="session")
def tiny_engineless_release(tiny_pair):
    """The tiny pair packaged for the tensorrt-llm runtime without engines, as the README packages a GPU release
    here (``specbuild package --runtime tensorrt-llm``)."""
    from specbuild import compiler

    root = TINY_CACHE_DIR / "tiny-gpu-release"
    spec = pair_spec(root, tiny_pair.target_dir, tiny_pair.draft_dir, **{
        "name": "tiny-gpu", "runtime": "tensorrt-llm", "limits.max_input_len": 256, "limits.max_seq_len": 512,
        "speculation.max_draft_len": 8, "outputs.engines_dir": str(root / "gpu_engines")})
    return compiler.run(spec, json_mode=True, package_only=True)


def test_the_torch_release_passes_every_check_it_can_run_here(tiny_release):
    import specbuild

    report = specbuild.run_doctor(tiny_release.repository)  # the public API
    found = verdicts(report)
    assert report.ok and set(found.values()) <= {PASS, UNCHECKABLE}, report.to_json()
    for name in ("files", "config:target", "config:draft", "logits:target", "logits:draft", "tokenizer",
                 "python-backend"):
        assert found[name] == PASS, (name, report.to_json())
    packages = next(check for check in report.checks if check.name == "packages")
    assert packages.verdict == UNCHECKABLE and "bundled" in packages.evidence  # the image's rules are not its own


def test_the_llmapi_release_passes_what_a_cpu_checks_and_says_why_not_the_rest(tiny_llmapi_release):
    from specbuild.doctor import run_doctor

    report = run_doctor(tiny_llmapi_release.repository)
    found = verdicts(report)
    assert FAIL not in found.values(), report.to_json()
    for name in ("files", "config:target", "config:draft", "logits:target", "logits:draft", "model.yaml:line-rules"):
        assert found[name] == PASS, (name, report.to_json())
    unchecked = {check.name: check.evidence for check in report.checks if check.verdict == UNCHECKABLE}
    assert "NVIDIA_TRITON_SERVER_VERSION" in unchecked["packages"]  # not the image
    if importlib.util.find_spec("tensorrt_llm") is None:
        assert "tensorrt_llm" in unchecked["model.yaml:tensorrt-llm"]
    if shutil.which("nvidia-smi") is None:
        assert "nvidia-smi" in unchecked["gpus"]


def test_the_engineless_release_says_its_engines_are_not_built(tiny_engineless_release):
    from specbuild.doctor import run_doctor

    report = run_doctor(tiny_engineless_release.repository)
    found = verdicts(report)
    assert FAIL not in found.values(), report.to_json()
    assert found["files"] == found["config:target"] == found["tokenizer"] == PASS
    assert found["engines"] == UNCHECKABLE
    assert "packaged without engines" in next(c.evidence for c in report.checks if c.name == "engines")
    if importlib.util.find_spec("xgrammar") is not None:
        assert found["tokenizer-info"] == PASS  # the guided release's file, read as the backend reads it


def copied_release(release, destination: Path) -> Path:
    """The torch release's repository and engines copied side by side (the manifest names them relatively)."""
    for tree in (release.repository, release.engines):
        shutil.copytree(tree, destination / tree.name, symlinks=True)
    return destination / release.repository.name


def test_a_tampered_file_fails_with_its_fix_and_exit_1(tiny_release, tmp_path):
    repository = copied_release(tiny_release, tmp_path)
    with (repository / "preprocessing" / "1" / "model.py").open("a") as handle:
        handle.write("\n# edited by hand\n")
    result = subprocess.run([sys.executable, "-m", "specbuild.cli", "doctor", str(repository), "--json"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads(result.stdout)
    [files] = [check for check in report["checks"] if check["name"] == "files"]
    assert files["verdict"] == FAIL and "preprocessing/1/model.py" in files["evidence"]
    assert "specbuild verify" in files["fix"]


def test_the_image_command_mounts_the_release_as_serve_does(tiny_llmapi_release, tiny_release):
    from specbuild.doctor import doctor_command
    from specbuild.errors import UsageError
    from specbuild.serve.release_launch import release_launch_plan

    command = doctor_command(tiny_llmapi_release.repository, image=IMAGE)
    plan = release_launch_plan(tiny_llmapi_release.repository, {"triton.image": IMAGE})
    assert command[:5] == ["docker", "run", "--rm", "--gpus", str(plan.gpu_count)]
    for mount in plan.mounts:
        assert f"type=bind,source={mount.source},target={mount.target},readonly" in command
    start = command.index(IMAGE)
    assert command[start + 1:start + 4] == ["python3", "/triton_repo/doctor.py", "--json"]
    assert "--checkpoint=target=/checkpoints/target" in command
    with pytest.raises(UsageError, match="bundled"):
        doctor_command(tiny_release.repository, image=IMAGE)


def test_serve_dry_run_prints_the_doctor_first_unless_told_not_to(tiny_llmapi_release):
    def serve(*flags: str) -> str:
        result = subprocess.run([sys.executable, "-m", "specbuild.cli", "serve", str(tiny_llmapi_release.repository),
                                 "--dry-run", *flags], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    assert "/triton_repo/doctor.py" in serve()
    assert "doctor.py" not in serve("--no-doctor") and "skipped (--no-doctor)" in serve("--no-doctor")
