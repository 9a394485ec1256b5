"""Launch plans: every generated command for single GPU, tp 2, tp 4 + tp 1 draft and pp 2 layouts, each from
the spec's ``launch`` section (what the release was compiled for)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from specbuild.errors import SpecError, UsageError
from specbuild.runtimes.launch_plans import ModelDevices
from specbuild.runtimes.tensorrt_llm.launch import launch_plan, model_devices, resolve_mode
from specbuild.runtimes.trtllm_image import TRITONSERVER
from specbuild.serve.release_launch import release_launch_spec
from specbuild.spec import BuildSpec


def make_spec(target: dict[str, Any] | None = None, draft: dict[str, Any] | None = None, **extra: Any) -> BuildSpec:
    data: dict[str, Any] = {"runtime": "tensorrt-llm", "target": {"checkpoint": "/ckpt/target", **(target or {})},
                            "draft": {"checkpoint": "/ckpt/draft", **(draft or {})}}
    data.update(extra)
    return BuildSpec.model_validate(data)


def ranks(argv: tuple[str, ...]) -> list[list[str]]:
    """Split an ``mpirun`` argv into its per-rank ``tritonserver`` argvs (after ``-n 1``)."""
    assert argv[:2] == ("mpirun", "--allow-run-as-root")
    groups, current = [], []
    for arg in argv[2:] + (":",):
        if arg == ":":
            assert current[:2] == ["-n", "1"]
            groups.append(current[2:])
            current = []
        else:
            current.append(arg)
    return groups


def serves_endpoints(argv: list[str]) -> bool:
    return any(arg.startswith("--http-port=") for arg in argv)


def test_single_gpu_is_one_plain_tritonserver(tmp_path):
    plan = launch_plan(make_spec(), tmp_path / "repo", tmp_path / "engines")
    assert plan.mode == "single" and plan.world_size == 1 and plan.gpu_count == 1
    assert plan.server_argv[0] == TRITONSERVER
    assert "mpirun" not in plan.server_argv
    assert "--model-repository=/triton_repo" in plan.server_argv
    assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"} <= set(plan.server_argv)
    assert plan.env == {}
    assert plan.devices == {"target": ModelDevices((0,), None, False), "draft": ModelDevices((0,), None, False)}


def test_docker_run_mounts_read_only_and_publishes_on_loopback(tmp_path):
    plan = launch_plan(make_spec(), tmp_path / "repo", tmp_path / "engines")
    argv = list(plan.docker_argv)
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("--gpus") + 1] == "1"
    assert argv[argv.index("--shm-size") + 1] == "2g"
    published = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-p"]
    assert published == ["127.0.0.1:8000:8000", "127.0.0.1:8001:8001", "127.0.0.1:8002:8002"]
    mounts = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--mount"]
    assert mounts == [f"type=bind,source={tmp_path / 'engines'},target=/engines,readonly",
                      f"type=bind,source={tmp_path / 'repo'},target=/triton_repo,readonly"]
    image_at = argv.index(plan.image)
    assert tuple(argv[image_at + 1:]) == plan.server_argv
    # the shell rendering round-trips to the same argv
    assert shlex.split(plan.render().splitlines()[-1]) == argv


def test_a_capturing_release_gets_its_store_mounted_read_write_at_capture_and_named(tmp_path):
    plan = launch_plan(make_spec(), tmp_path / "repo", tmp_path / "engines").with_capture(tmp_path / "store")
    argv = list(plan.docker_argv)
    mounts = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--mount"]
    assert mounts[-1] == f"type=bind,source={tmp_path / 'store'},target=/capture"  # the only one not read-only
    assert argv[argv.index("-e") + 1] == "SPECBUILD_CAPTURE_DIR=/capture" and plan.env["SPECBUILD_CAPTURE_DIR"]
    assert tuple(argv[argv.index(plan.image) + 1:]) == plan.server_argv  # docker's options before the image
    assert shlex.split(plan.render().splitlines()[-1]) == argv


def test_host_and_ports_follow_the_spec(tmp_path):
    spec = make_spec(triton={"host": "0.0.0.0", "http_port": 9000, "grpc_port": 9001, "metrics_port": 9002,
                             "openai_port": 9003, "engine_mount": "/models/engines", "repository_mount": "/models/repo"})
    plan = launch_plan(spec, tmp_path / "repo", tmp_path / "engines")
    argv = list(plan.docker_argv)
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "-p"] == [
        "0.0.0.0:9000:9000", "0.0.0.0:9001:9001", "0.0.0.0:9002:9002"]
    assert "--model-repository=/models/repo" in plan.server_argv
    assert any(m.endswith("target=/models/engines,readonly") for m in argv)
    # the OpenAI-compatible API runs on the host beside the container (specbuild serve), not in it
    assert plan.openai_port == 9003 and "http://0.0.0.0:9003/v1" in plan.render()
    clash = make_spec(triton={"http_port": 9000, "openai_port": 9000})
    with pytest.raises(SpecError, match="the ports must differ"):
        launch_plan(clash, tmp_path / "repo", tmp_path / "engines")


def test_ipv6_host_is_bracketed(tmp_path):
    plan = launch_plan(make_spec(triton={"host": "::1"}), tmp_path / "r", tmp_path / "e")
    assert "[::1]:8000:8000" in plan.docker_argv
    assert "http://[::1]:8000" in plan.render()


def test_tp2_target_uses_orchestrator_mode_with_spawning(tmp_path):
    plan = launch_plan(make_spec(target={"tp_size": 2}), tmp_path / "r", tmp_path / "e")
    assert plan.mode == "orchestrator" and plan.spawn_processes is True
    assert plan.world_size == 1 and plan.gpu_count == 2
    assert plan.env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    [rank0] = ranks(plan.server_argv)
    assert "--cuda-memory-pool-byte-size=0:0" in rank0 and "--cuda-memory-pool-byte-size=1:0" in rank0
    assert "--pinned-memory-pool-byte-size=0" in rank0
    # TensorRT-LLM spawns the workers: no participant ids
    assert plan.devices["target"] == ModelDevices((0, 1), None, False)
    assert "-e" in plan.docker_argv and "TRTLLM_ORCHESTRATOR=1" in plan.docker_argv


def test_leader_mode_with_tensor_parallelism_is_refused():
    """NVIDIA's draft-target guide: orchestrator mode is required with tensor parallelism for two models."""
    for target, draft in (({"tp_size": 2}, {"tp_size": 2}), ({"tp_size": 4}, {})):
        with pytest.raises(SpecError, match="leader mode with tensor parallelism") as refused:
            resolve_mode(make_spec(target=target, draft=draft, launch={"mode": "leader"}))
        assert "launch.mode: orchestrator" in refused.value.fix


def test_tp4_target_tp1_draft_separate_gpus(tmp_path):
    separate = launch_plan(make_spec(target={"tp_size": 4}, launch={"placement": "separate"}), tmp_path / "r",
                           tmp_path / "e")
    assert separate.mode == "orchestrator" and separate.gpu_count == 5
    assert separate.devices["draft"].gpu_device_ids == (4,)
    assert separate.docker_argv[separate.docker_argv.index("--gpus") + 1] == "5"


def test_tp4_target_tp1_draft_fast_logits_layout(tmp_path):
    spec = make_spec(target={"tp_size": 4}, launch={"fast_logits": True})
    plan = launch_plan(spec, tmp_path / "r", tmp_path / "e")
    assert plan.mode == "orchestrator" and plan.spawn_processes is False
    assert plan.world_size == 1 + 1 + 4
    assert plan.env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0"}
    assert plan.devices == {"draft": ModelDevices((0,), (1,), True), "target": ModelDevices((0, 1, 2, 3), (2, 3, 4, 5), True)}
    argvs = ranks(plan.server_argv)
    assert len(argvs) == 6 and serves_endpoints(argvs[0]) and not any(serves_endpoints(a) for a in argvs[1:])
    # no spawning: none of the multi-model pool flags
    assert not any(arg.startswith("--cuda-memory-pool-byte-size") for arg in plan.server_argv)


def test_pp2_target_in_leader_mode_one_server_per_rank_only_rank0_serves(tmp_path):
    plan = launch_plan(make_spec(target={"pp_size": 2}, launch={"mode": "leader"}), tmp_path / "r", tmp_path / "e")
    assert plan.mode == "leader" and plan.world_size == 2 and plan.gpu_count == 2 and plan.env == {}
    rank0, rank1 = ranks(plan.server_argv)
    assert serves_endpoints(rank0) and not serves_endpoints(rank1)
    assert {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"} <= set(rank1)
    assert {"--model-control-mode=explicit", "--load-model=target", "--load-model=draft"} <= set(rank1)
    assert rank0[-1] == "--backend-config=python,shm-region-prefix-name=prefix0_"
    assert rank1[-1] == "--backend-config=python,shm-region-prefix-name=prefix1_"
    assert plan.devices["target"].participant_ids == (0, 1) and plan.devices["draft"].participant_ids == (0,)
    fast = launch_plan(make_spec(target={"tp_size": 2, "pp_size": 2}, launch={"fast_logits": True}),
                       tmp_path / "r", tmp_path / "e")
    assert fast.world_size == 1 + 1 + 4
    assert fast.devices["target"].participant_ids == (2, 3, 4, 5)


def test_model_devices_are_the_plans(tmp_path):
    for launch in ({}, {"fast_logits": True}, {"placement": "separate"}):
        spec = make_spec(target={"tp_size": 2}, launch=launch)
        assert model_devices(spec) == launch_plan(spec, tmp_path / "r", tmp_path / "e").devices


def test_fast_logits_errors_instead_of_silent_fallback():
    for mode in ("leader", "single"):
        with pytest.raises(SpecError, match="orchestrator mode with spawning disabled"):
            resolve_mode(make_spec(launch={"mode": mode, "fast_logits": True}))
    with pytest.raises(ValueError, match="acceptance"):
        make_spec(speculation={"acceptance": "token-match"}, launch={"fast_logits": True})


def test_mode_errors():
    with pytest.raises(SpecError, match="single mode runs one process"):
        resolve_mode(make_spec(draft={"tp_size": 2}, launch={"mode": "single"}))
    with pytest.raises(ValueError, match="launch.mode"):
        make_spec(launch={"mode": "mpi"})
    with pytest.raises(UsageError, match="GPU releases"):
        resolve_mode(make_spec(runtime="torch"))


def test_a_launch_may_choose_ports_and_image_but_not_the_layout():
    release = make_spec(target={"tp_size": 2})
    spec = release_launch_spec(release, {"triton.http_port": 9000, "triton.image": "registry/triton:26.05",
                                         "target.tp_size": 2})  # the release's own value is fine
    assert (spec.triton.http_port, spec.triton.image, spec.target.tp_size) == (9000, "registry/triton:26.05", 2)
    for key, value in (("target.tp_size", 4), ("launch.mode", "leader"), ("launch.fast_logits", True),
                       ("triton.engine_mount", "/elsewhere")):
        with pytest.raises(SpecError, match=f"compiled with {key}=") as refused:
            release_launch_spec(release, {key: value})
        assert f"--set {key}=" in refused.value.fix


def test_plan_refusals(tmp_path):
    with pytest.raises(UsageError, match="needs 5 GPUs"):
        launch_plan(make_spec(target={"tp_size": 4}, launch={"placement": "separate"}), tmp_path, tmp_path, gpus=4)
    with pytest.raises(SpecError, match="http_port is 0"):
        launch_plan(make_spec(triton={"http_port": 0}), tmp_path, tmp_path)
    with pytest.raises(SpecError, match="ports must differ"):
        launch_plan(make_spec(triton={"grpc_port": 8000}), tmp_path, tmp_path)
    with pytest.raises(UsageError, match="comma"):
        launch_plan(make_spec(), tmp_path / "a,b", tmp_path)


def test_format_and_dict_views(tmp_path):
    spec = make_spec(target={"pp_size": 2}, launch={"mode": "leader"})
    text = launch_plan(spec, tmp_path / "r", tmp_path / "e").render()
    assert text.startswith("# specbuild launch plan (tensorrt-llm runtime): leader mode, MPI world size 2")
    assert "#   target: GPUs 0,1, MPI ranks 0,1" in text
    data = launch_plan(spec, tmp_path / "r", tmp_path / "e").to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["server_command"] == shlex.join(data["server_argv"])
    assert data["mounts"][0] == {"source": str(tmp_path / "e"), "target": "/engines", "read_only": True}
