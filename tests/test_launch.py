"""Launch plans: every generated command for single GPU, tp 2, tp 4 + tp 1 draft and pp 2 layouts."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from specbuild.errors import SpecError, UsageError
from specbuild.serve.launch import (
    TRITONSERVER,
    check_engine_parameters,
    device_assignment,
    format_launch,
    launch_as_dict,
    launch_plan,
    model_devices,
    resolve_mode,
)
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
    assert plan.engine_parameters() == {
        "target": {"gpu_device_ids": "0", "speculative_decoding_fast_logits": "false"},
        "draft": {"gpu_device_ids": "0", "speculative_decoding_fast_logits": "false"},
    }


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


def test_host_and_ports_follow_the_spec(tmp_path):
    spec = make_spec(triton={"host": "0.0.0.0", "http_port": 9000, "grpc_port": 9001, "metrics_port": 9002,
                             "engine_mount": "/models/engines", "repository_mount": "/models/repo"})
    plan = launch_plan(spec, tmp_path / "repo", tmp_path / "engines")
    argv = list(plan.docker_argv)
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "-p"] == [
        "0.0.0.0:9000:9000", "0.0.0.0:9001:9001", "0.0.0.0:9002:9002"]
    assert "--model-repository=/models/repo" in plan.server_argv
    assert any(m.endswith("target=/models/engines,readonly") for m in argv)


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
    assert plan.engine_parameters()["target"] == {"gpu_device_ids": "0,1", "speculative_decoding_fast_logits": "false"}
    assert "-e" in plan.docker_argv and "TRTLLM_ORCHESTRATOR=1" in plan.docker_argv


def test_tp2_leader_mode_one_server_per_rank_only_rank0_serves(tmp_path):
    plan = launch_plan(make_spec(target={"tp_size": 2}, draft={"tp_size": 2}), tmp_path / "r", tmp_path / "e",
                       mode="leader")
    assert plan.mode == "leader" and plan.world_size == 2 and plan.env == {}
    rank0, rank1 = ranks(plan.server_argv)
    assert serves_endpoints(rank0) and not serves_endpoints(rank1)
    assert {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"} <= set(rank1)
    assert {"--model-control-mode=explicit", "--load-model=target", "--load-model=draft"} <= set(rank1)
    assert rank0[-1] == "--backend-config=python,shm-region-prefix-name=prefix0_"
    assert rank1[-1] == "--backend-config=python,shm-region-prefix-name=prefix1_"
    assert plan.engine_parameters()["target"]["participant_ids"] == "0,1"
    assert plan.engine_parameters()["draft"]["participant_ids"] == "0,1"


def test_tp4_target_tp1_draft_leader_and_orchestrator(tmp_path):
    spec = make_spec(target={"tp_size": 4})
    leader = launch_plan(spec, tmp_path / "r", tmp_path / "e", mode="leader")
    assert leader.world_size == 4 and leader.gpu_count == 4 and len(ranks(leader.server_argv)) == 4
    assert leader.engine_parameters()["target"]["gpu_device_ids"] == "0,1,2,3"
    assert leader.engine_parameters()["draft"] == {
        "gpu_device_ids": "0", "participant_ids": "0", "speculative_decoding_fast_logits": "false"}

    separate = launch_plan(spec, tmp_path / "r", tmp_path / "e", placement="separate")
    assert separate.mode == "orchestrator" and separate.gpu_count == 5
    assert separate.engine_parameters()["draft"]["gpu_device_ids"] == "4"
    assert separate.docker_argv[separate.docker_argv.index("--gpus") + 1] == "5"


def test_tp4_target_tp1_draft_fast_logits_layout(tmp_path):
    spec = make_spec(target={"tp_size": 4})
    plan = launch_plan(spec, tmp_path / "r", tmp_path / "e", fast_logits=True)
    assert plan.mode == "orchestrator" and plan.spawn_processes is False
    assert plan.world_size == 1 + 1 + 4
    assert plan.env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0"}
    params = plan.engine_parameters()
    assert params["draft"] == {"gpu_device_ids": "0", "participant_ids": "1", "speculative_decoding_fast_logits": "true"}
    assert params["target"] == {"gpu_device_ids": "0,1,2,3", "participant_ids": "2,3,4,5",
                                "speculative_decoding_fast_logits": "true"}
    argvs = ranks(plan.server_argv)
    assert len(argvs) == 6 and serves_endpoints(argvs[0]) and not any(serves_endpoints(a) for a in argvs[1:])
    # no spawning: none of the multi-model pool flags
    assert not any(arg.startswith("--cuda-memory-pool-byte-size") for arg in plan.server_argv)


def test_pp2_target_counts_pipeline_ranks(tmp_path):
    spec = make_spec(target={"pp_size": 2})
    plan = launch_plan(spec, tmp_path / "r", tmp_path / "e", mode="leader")
    assert plan.world_size == 2 and plan.gpu_count == 2
    assert plan.engine_parameters()["target"]["participant_ids"] == "0,1"
    fast = launch_plan(make_spec(target={"tp_size": 2, "pp_size": 2}), tmp_path / "r", tmp_path / "e",
                       fast_logits=True)
    assert fast.world_size == 1 + 1 + 4
    assert fast.engine_parameters()["target"]["participant_ids"] == "2,3,4,5"


def test_device_assignment_matches_the_plan(tmp_path):
    spec = make_spec(target={"tp_size": 2})
    for options in ({}, {"mode": "leader"}, {"fast_logits": True}, {"placement": "separate"}):
        plan = launch_plan(spec, tmp_path / "r", tmp_path / "e", **options)
        assert device_assignment(spec, **options) == plan.engine_parameters()
        assert model_devices(spec, **options) == plan.devices
    typed = model_devices(spec, fast_logits=True)
    assert typed["target"].gpu_device_ids == (0, 1) and typed["target"].participant_ids == (2, 3)


def test_fast_logits_errors_instead_of_silent_fallback():
    spec = make_spec(target={"tp_size": 2})
    with pytest.raises(UsageError, match="orchestrator mode with spawning disabled"):
        resolve_mode(spec, "leader", fast_logits=True)
    with pytest.raises(UsageError, match="orchestrator mode"):
        resolve_mode(make_spec(), "single", fast_logits=True)
    with pytest.raises(UsageError, match="SPAWN_PROCESSES=0"):
        resolve_mode(spec, "orchestrator", fast_logits=True, spawn_processes=True)
    with pytest.raises(SpecError, match="acceptance"):
        resolve_mode(make_spec(speculation={"acceptance": "token-match"}), fast_logits=True)


def test_check_engine_parameters_names_missing_participant_ids():
    spec = make_spec(target={"tp_size": 2})
    expected = device_assignment(spec, fast_logits=True)
    check_engine_parameters(expected, expected)  # matching configs pass
    rendered = {role: dict(params) for role, params in expected.items()}
    del rendered["draft"]["participant_ids"]
    with pytest.raises(SpecError, match=r"draft: participant_ids is None, the launch plan needs '1'"):
        check_engine_parameters(expected, rendered)


def test_mode_errors():
    with pytest.raises(UsageError, match="single mode runs one process"):
        resolve_mode(make_spec(draft={"tp_size": 2}), "single")
    with pytest.raises(UsageError, match="unknown launch mode"):
        resolve_mode(make_spec(), "mpi")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="spawn_processes only applies"):
        resolve_mode(make_spec(), "leader", spawn_processes=False)
    with pytest.raises(UsageError, match="tensorrt-llm runtime"):
        resolve_mode(make_spec(runtime="torch"))


def test_plan_refusals(tmp_path):
    with pytest.raises(UsageError, match="needs 5 GPUs"):
        launch_plan(make_spec(target={"tp_size": 4}), tmp_path, tmp_path, placement="separate", gpus=4)
    with pytest.raises(SpecError, match="http_port is 0"):
        launch_plan(make_spec(triton={"http_port": 0}), tmp_path, tmp_path)
    with pytest.raises(SpecError, match="ports must differ"):
        launch_plan(make_spec(triton={"grpc_port": 8000}), tmp_path, tmp_path)
    with pytest.raises(UsageError, match="comma"):
        launch_plan(make_spec(), tmp_path / "a,b", tmp_path)
    with pytest.raises(UsageError, match="unknown GPU placement"):
        launch_plan(make_spec(), tmp_path, tmp_path, placement="spread")  # type: ignore[arg-type]


def test_format_and_dict_views(tmp_path):
    spec = make_spec(target={"tp_size": 2})
    text = format_launch(spec, tmp_path / "r", tmp_path / "e", mode="leader")
    assert text.startswith("# specbuild launch plan (tensorrt-llm runtime): leader mode, MPI world size 2")
    data = launch_as_dict(spec, tmp_path / "r", tmp_path / "e", mode="leader")
    assert json.loads(json.dumps(data)) == data
    assert data["server_command"] == shlex.join(data["server_argv"])
    assert data["mounts"][0] == {"source": str(tmp_path / "e"), "target": "/engines", "read_only": True}
