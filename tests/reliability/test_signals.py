"""SIGTERM (what a pipeline runner sends a step that ran out of time) to any command or script that started a
Triton server: the server, its python model processes and their shared memory are all gone afterwards."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import TINY_SEED
from specbuild.drafts.model_pairs import CACHE_ENV, pair_dir
from specbuild.serve.server import SHM_DIR, SHM_PREFIX

STARTUP_S = 300  # the models load in seconds here; the bound only keeps a broken run from hanging the suite


def _children(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def _argv(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _ready_server(command: subprocess.Popen[Any]) -> dict[str, str]:
    """Wait until ``command`` has a tritonserver child that answers ready; its shm prefix and HTTP port."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if command.poll() is not None:
            pytest.fail(f"the command exited ({command.returncode}) before its server was ready")
        for pid in _children(command.pid):
            argv = _argv(pid)
            if argv and argv[0].endswith("tritonserver"):
                options = dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:] if "=" in arg)
                server = {"prefix": options["backend-config"].split("shm-region-prefix-name=", 1)[1],
                          "http": options["http-port"]}
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{server['http']}/v2/health/ready", timeout=2):
                        return server
                except (urllib.error.URLError, OSError):
                    pass
        time.sleep(0.2)
    pytest.fail(f"no ready server under the command after {STARTUP_S} s")


def _left_behind(prefix: str) -> tuple[list[int], list[str]]:
    """Processes whose command line carries the server's shm prefix, and its shared-memory regions."""
    processes = [int(entry.name) for entry in Path("/proc").iterdir()
                 if entry.name.isdigit() and prefix in "\0".join(_argv(int(entry.name)))]
    return processes, [region.name for region in SHM_DIR.glob(f"{prefix}*")]


def _spec_file(tiny_release, tmp_path: Path) -> Path:
    path = tmp_path / "specbuild.yaml"
    path.write_text(tiny_release.spec.to_yaml(), encoding="utf-8")
    return path


COMMANDS: dict[str, Callable[..., list[str]]] = {
    "bench --repository": lambda release, tmp: [
        "-m", "specbuild.cli", "bench", "--repository", str(release.repository), "--k", "0,2", "--num-prompts", "2",
        "--requests", "500", "--max-tokens", "64", "--no-plots", "--out", str(tmp / "bench")],
    "tune": lambda release, tmp: [
        "-m", "specbuild.cli", "tune", "--spec", str(_spec_file(release, tmp)), "--k", "0,1,2", "--num-prompts", "2",
        "--requests", "500", "--max-tokens", "64", "--dry-run"],
    "demo": lambda release, tmp: [
        "-m", "specbuild.cli", "demo", "--tiny", "--tiny-seed", str(TINY_SEED), "--workdir", str(tmp), "--max-tokens",
        "64"],
    "serve": lambda release, tmp: [
        "-m", "specbuild.cli", "serve", str(release.repository), "--http-port", "0", "--grpc-port", "0",
        "--metrics-port", "0", "--openai-port", "0", "--json"],
    "a script using TritonServer": lambda release, tmp: [
        "-c", "import sys, time\nfrom specbuild.serve.server import TritonServer\n"
              f"with TritonServer({str(release.repository)!r}):\n    time.sleep(3600)\n"],
}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigterm_stops_the_server_its_models_and_their_shared_memory(name, tiny_release, tiny_pair, tmp_path,
                                                                     monkeypatch):
    if name == "demo":  # its own folders, with the cached pair copied in (its stamp skips a rebuild)
        monkeypatch.delenv(CACHE_ENV, raising=False)
        shutil.copytree(tiny_pair.root, pair_dir("tiny", tmp_path))
    command = subprocess.Popen([sys.executable, *COMMANDS[name](tiny_release, tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server = _ready_server(command)
        if name == "serve":  # ready once its OpenAI API is up too, which it announces
            announced = [json.loads(command.stdout.readline())]
        processes, regions = _left_behind(server["prefix"])
        assert len(processes) >= 6 and regions  # the server and its python models, with their shared memory
        command.send_signal(signal.SIGTERM)
        stdout, stderr = command.communicate(timeout=120)
    finally:
        if command.poll() is None:
            command.kill()
    assert _left_behind(server["prefix"]) == ([], [])
    assert server["prefix"].startswith(SHM_PREFIX)
    if name == "serve":  # serving until told to stop is its job: a clean exit, announced in JSON Lines
        events = announced + [json.loads(line) for line in stdout.splitlines()]
        assert [event["event"] for event in events] == ["ready", "stopped"] and command.returncode == 0
        assert events[0]["processes"]["tritonserver"] == events[0]["pid"]
    elif name == "a script using TritonServer":
        assert command.returncode != 0 and "Terminated" in stderr  # unwound like Ctrl-C, servers stopped first
    else:
        assert command.returncode == 128 + signal.SIGTERM, stderr
        assert "interrupted by SIGTERM; the servers it started were stopped first" in stderr
