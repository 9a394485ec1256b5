"""The Triton server wrapper: log parsing and commands (fast), and a real tritonserver (e2e, slow).

The e2e tests serve the toy repository in tests/data/toy_triton (an ensemble over a decoupled python
model that mimics the public tensor contract): a fixture for the server layer, not the product.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from checkpoint_factory import release_spec
from specbuild.cli import main
from specbuild.package.contract import ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS
from specbuild.errors import ServerError, UsageError
from specbuild.serve.processes import free_port, free_ports, kill_group, live_group_members
from specbuild.serve.server import SHM_DIR, TritonServer
from specbuild.serve.triton_install import MODEL_FIX, PORT_FIX, find_triton, log_errors, start_failure_fix
from locations import DATA

TOY = DATA / "toy_triton"

# Lines as tritonserver 2.51 writes them when a python model has a syntax error.
BROKEN_LOG = r'''W1129 18:44:24.405922 5969 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"
E1129 18:44:24.406101 5969 server.cc:241] "CudaDriverHelper has not been initialized."
I1129 18:44:24.512886 5991 pb_stub.cc:366]  Failed to initialize Python stub: SyntaxError: invalid syntax (model.py, line 1)
E1129 18:44:24.809553 5969 backend_model.cc:692] "ERROR: Failed to create instance: SyntaxError: invalid syntax (model.py, line 1)"
E1129 18:44:24.809665 5969 model_lifecycle.cc:642] "failed to load 'broken' version 1: Internal: SyntaxError: invalid syntax (model.py, line 1)"
E1129 18:44:24.813357 5969 model_lifecycle.cc:642] "failed to load 'echo' version 1: Internal: AttributeError: no 'X'\n\nAt:\n  /tmp/repo/echo/1/model.py(15): <module>\n"
E1129 18:44:24.813400 5969 model_repository_manager.cc:703] "Invalid argument: ensemble 'ensemble' depends on 'echo' which has no loaded version."
error: creating server: Internal - failed to load all models
'''


# --- fast -------------------------------------------------------------------------------------------------
def test_log_errors_keeps_the_per_model_lines_and_unescapes_them():
    errors = log_errors(BROKEN_LOG)
    assert errors == [
        "failed to load 'broken' version 1: Internal: SyntaxError: invalid syntax (model.py, line 1)",
        "failed to load 'echo' version 1: Internal: AttributeError: no 'X'\n\nAt:\n  /tmp/repo/echo/1/model.py(15): <module>",
        "Invalid argument: ensemble 'ensemble' depends on 'echo' which has no loaded version.",
    ]


def test_log_errors_without_model_lines_keeps_other_errors_but_not_cpu_noise():
    log = ('E1129 18:44:24.406101 5969 server.cc:241] "CudaDriverHelper has not been initialized."\n'
           'E1129 18:44:24.5 5969 grpc_server.cc:2466] "Failed to listen on 127.0.0.1:8001"\n'
           "error: creating server: Internal - Socket 'localhost:8001' already in use\n")
    assert log_errors(log) == ["Failed to listen on 127.0.0.1:8001",
                               "creating server: Internal - Socket 'localhost:8001' already in use"]


def test_free_port_can_be_bound():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_ports_are_different_and_each_can_be_bound():
    """A server's gRPC, HTTP and metrics ports are picked together: one port twice fails its start."""
    import socket

    taken = free_port()
    ports = free_ports(3, avoid={taken})
    assert len(set(ports)) == 3 and taken not in ports
    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(socket.socket()).bind(("127.0.0.1", port))


def test_command_is_loopback_strict_and_uses_a_private_shm_prefix(tmp_path):
    first, second = TritonServer(tmp_path, http_port=1, grpc_port=2, metrics_port=3), TritonServer(tmp_path)
    argv = first.command(find_triton(), tmp_path / "backends")
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--http-port=1", "--grpc-port=2", "--metrics-port=3", "--exit-on-error=true",
                 "--strict-readiness=true", "--disable-auto-complete-config",
                 f"--backend-config=python,shm-region-prefix-name={first.shm_prefix}"):
        assert flag in argv
    assert "--model-control-mode=explicit" not in argv
    assert first.shm_prefix != second.shm_prefix
    assert first.shm_prefix.startswith("triton_python_backend_shm_region_")


def test_environment_puts_this_python_and_the_wheel_libraries_first(tmp_path):
    install = find_triton()
    env = TritonServer(tmp_path).environment(install)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(install.libs)


def test_missing_repository_and_bad_model_control_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not a folder"):
        TritonServer(tmp_path / "nope")
    with pytest.raises(UsageError, match="model_control"):
        TritonServer(tmp_path, model_control="poll")  # type: ignore[arg-type]


def test_toy_fixture_follows_the_public_contract():
    """The toy ensemble must mimic the real interface, or the client tests prove nothing."""
    config = text_format.Parse((TOY / "ensemble" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    inputs = {i.name: (model_config_pb2.DataType.Name(i.data_type), tuple(i.dims), i.optional) for i in config.input}
    assert inputs == {t.name: (t.dtype, t.dims, t.optional) for t in ENSEMBLE_INPUTS}
    outputs = {o.name: (model_config_pb2.DataType.Name(o.data_type), tuple(o.dims)) for o in config.output}
    assert outputs == {t.name: (t.dtype, t.dims) for t in ENSEMBLE_OUTPUTS}


def test_dry_run_prints_a_runnable_script_and_starts_nothing(tmp_path):
    result = CliRunner().invoke(main, ["serve", str(TOY), "--dry-run", "--http-port", "18000"])
    assert result.exit_code == 0, result.output
    assert 'mkdir "$BACKENDS/python"' in result.output
    assert "--http-port=18000" in result.output and "--grpc-port=8001" in result.output
    assert "--http-address=127.0.0.1" in result.output
    assert "picked free" not in result.output  # no port is 0


def test_dry_run_of_a_torch_release_names_every_process_the_openai_api_included(checkpoints, tmp_path):
    from specbuild import compiler

    repository = compiler.run(release_spec(checkpoints, tmp_path, "torch"), json_mode=True).repository
    result = CliRunner().invoke(main, ["serve", str(repository), "--dry-run", "--openai-port", "9100"])
    assert result.exit_code == 0, result.output
    assert "--grpc-port=8001" in result.output and "picked free" not in result.output
    assert "# and the OpenAI-compatible API at http://127.0.0.1:9100/v1, in the `specbuild serve` process;" in \
        result.output
    assert f"specbuild openai {repository} --triton 127.0.0.1:8001 --host 127.0.0.1 --port 9100" in result.output
    free = CliRunner().invoke(main, ["serve", str(repository), "--dry-run", "--http-port", "0", "--json"])
    document = json.loads(free.stdout)
    assert document["script"].startswith("# http port 0: picked free by `specbuild serve` at start; set it")
    assert document["openai"]["url"] == "http://127.0.0.1:9000/v1" and document["openai"]["command"][:2] == [
        "specbuild", "openai"]
    without = CliRunner().invoke(main, ["serve", str(repository), "--dry-run", "--no-openai"])
    assert "OpenAI" not in without.output and "specbuild openai" not in without.output


def test_kill_group_returns_once_no_member_of_the_group_runs():
    """A leader and a grandchild in their own group (as tritonserver and its python stubs): both end."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    try:
        while len(live_group_members(leader.pid)) < 2:  # the shell has started its background child
            assert leader.poll() is None
        assert kill_group(leader.pid) == [] and live_group_members(leader.pid) == []
    finally:
        leader.kill()
        leader.wait()


# --- a real server ----------------------------------------------------------------------------------------
def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (the server and its python stubs carry its shm prefix)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _assert_nothing_left(server: TritonServer) -> None:
    assert _processes_mentioning(server.shm_prefix) == []
    assert list(SHM_DIR.glob(f"{server.shm_prefix}*")) == []
    assert not server.is_running()


@pytest.fixture
def toy_repo(tmp_path: Path) -> Path:
    repository = tmp_path / "repo"
    shutil.copytree(TOY, repository)
    return repository


def _add_model(repository: Path, name: str, source: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    (repository / name / "1" / "model.py").write_text(source)


@pytest.mark.e2e
@pytest.mark.slow
def test_start_ready_stop_leaves_no_process_and_no_shared_memory(toy_repo):
    server = TritonServer(toy_repo)
    with server:
        assert server.is_running() and server.pid
        assert server.model_ready("ensemble") and server.model_ready("echo")
        assert not server.model_ready("missing")
        ports = {url.rsplit(":", 1)[1].split("/")[0] for url in (server.http_url, server.grpc_url, server.metrics_url)}
        assert len(ports) == 3 and "0" not in ports
        assert server.http_url.startswith("http://127.0.0.1:")
        # the python models hold shared-memory regions under this server's own prefix while it runs
        assert list(SHM_DIR.glob(f"{server.shm_prefix}*"))
        assert len(_processes_mentioning(server.shm_prefix)) >= 3  # server + 2 echo stubs
        with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
            assert b"nv_inference_request_success" in response.read()
    _assert_nothing_left(server)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_broken_model_raises_its_error_and_leaves_nothing_running(toy_repo):
    _add_model(toy_repo, "broken", "def broken(:\n")
    server = TritonServer(toy_repo, startup_timeout=60)
    with pytest.raises(ServerError) as caught:
        server.start()
    message = str(caught.value)
    assert "exited with code" in message  # it did not wait for the timeout
    assert "failed to load 'broken'" in message and "SyntaxError" in message
    assert "CudaDriverHelper" not in message
    _assert_nothing_left(server)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_taken_port_is_named_as_the_cause_not_a_model(toy_repo):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        server = TritonServer(toy_repo, grpc_port=taken, startup_timeout=60)
        with pytest.raises(ServerError) as caught:
            server.start()
    assert "exited with code" in str(caught.value) and str(taken) in str(caught.value)
    assert caught.value.fix == PORT_FIX
    _assert_nothing_left(server)


def test_start_failures_are_told_apart_by_their_errors():
    assert start_failure_fix(["creating server: Internal - Socket 'localhost:8001' already in use"]) == PORT_FIX
    assert start_failure_fix(["failed to load 'orchestrator' version 1: SyntaxError"]) == MODEL_FIX
    assert start_failure_fix([]) == MODEL_FIX


@pytest.mark.e2e
@pytest.mark.slow
def test_a_model_that_never_loads_times_out_and_is_killed(toy_repo):
    """The hang the triton-on-cpu notes warn about: bounded, and everything is cleaned up."""
    _add_model(toy_repo, "stuck", "import time\n\nclass TritonPythonModel:\n"
                                  "    def initialize(self, args):\n        time.sleep(600)\n")
    server = TritonServer(toy_repo, startup_timeout=3, stop_timeout=5)
    with pytest.raises(ServerError, match="not ready after 3 s"):
        server.start()
    _assert_nothing_left(server)


@pytest.mark.e2e
@pytest.mark.slow
def test_explicit_model_control_loads_and_unloads(toy_repo):
    with TritonServer(toy_repo, model_control="explicit") as server:
        assert not server.model_ready("echo")
        server.load_model("echo")
        assert server.model_ready("echo")
        server.unload_model("echo")
        assert not server.model_ready("echo")
        with pytest.raises(ServerError, match="load of model 'missing' failed"):
            server.load_model("missing")
    with pytest.raises(UsageError, match="model_control='explicit'"):
        TritonServer(toy_repo).load_model("echo")
    _assert_nothing_left(server)


@pytest.mark.e2e
@pytest.mark.slow
def test_cli_serve_prints_endpoints_and_stops_cleanly_on_sigint(toy_repo):
    http, grpc, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "specbuild.cli", "serve", str(toy_repo), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "press Ctrl-C" in line:
                break
        assert any(f"127.0.0.1:{grpc}" in line for line in lines), lines
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=5) as response:
            assert response.status == 200
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, "".join(lines) + output
    assert "stopping tritonserver" in output
    assert _processes_mentioning(f"--http-port={http}") == []


def test_serve_of_a_gpu_release_prints_its_container_and_mpi_commands(gpu_release):
    result = CliRunner().invoke(main, ["serve", str(gpu_release.repository), "--dry-run", "--http-port", "8100",
                                       "--openai-port", "8103"])
    assert result.exit_code == 0, result.output
    assert "docker run" in result.output and "--gpus 2" in result.output
    assert "TRTLLM_ORCHESTRATOR=1" in result.output  # tp 2 for two models: orchestrator mode, as compiled
    assert "-p 127.0.0.1:8100:8100" in result.output and "--http-port=8100" in result.output
    assert "OpenAI-compatible API at http://127.0.0.1:8103/v1" in result.output
    assert f"source={gpu_release.engines.resolve()},target=/engines,readonly" in result.output
    assert f"source={gpu_release.repository.resolve()},target=/triton_repo,readonly" in result.output


def test_serve_refuses_a_layout_the_release_was_not_compiled_for(gpu_release):
    result = CliRunner().invoke(main, ["serve", str(gpu_release.repository), "--dry-run",
                                       "--set", "target.tp_size=4"])
    assert result.exit_code == 2 and "compiled with target.tp_size=2" in result.output


def test_serve_refuses_a_gpu_release_whose_files_changed(gpu_release):
    (gpu_release.engines / "target" / "rank0.engine").write_bytes(b"another engine")
    result = CliRunner().invoke(main, ["serve", str(gpu_release.repository), "--dry-run"])
    assert result.exit_code == 1 and "differs from its manifest" in result.output


def test_serve_of_a_gpu_release_without_docker_says_so(gpu_release, tmp_path):
    result = CliRunner().invoke(main, ["serve", str(gpu_release.repository)], env={"PATH": str(tmp_path)})
    assert result.exit_code == 1
    assert "docker is not installed" in result.output and "--dry-run" in result.output
