"""Faults: the draft dies mid-run, a client cancels mid-stream, compile is interrupted at each step, a release
is tampered with after the build. Each must end in exact output, a clean error or a resumable state.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from click.testing import CliRunner
from served_tiny import MAX_DRAFT_LEN, compile_release
from triton_requests import metrics, raw_stream

from specbuild.cli import main
from specbuild.serve.client import Generation, GenerationRequest, SpecbuildClient
from specbuild.errors import StageError
from specbuild.package.manifest import verify
from specbuild.serve.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PROMPTS = ["def parse(text):", "import json", "The quick brown fox"]


# --- the draft dies ---------------------------------------------------------------------------------------
def test_draft_killed_mid_run_requests_finish_exactly_through_the_fallback_then_recover(served):
    client = SpecbuildClient(served.grpc_url, timeout=300)
    expected = {p: client.generate(p, 48, num_draft_tokens=0).text for p in PROMPTS}
    before = metrics(served)
    draft_pid = served.processes()["draft_0_0"]
    others: list[Any] = []
    batch = [GenerationRequest(p, 48, num_draft_tokens=MAX_DRAFT_LEN, stream=i % 2 == 0) for i, p in enumerate(PROMPTS)]
    worker = threading.Thread(target=lambda: others.extend(client.generate_many(batch, 3, return_exceptions=True)))

    streamed = []
    for chunk in client.stream(PROMPTS[0], 48, num_draft_tokens=MAX_DRAFT_LEN):
        if not streamed:  # in flight: the first round is out, the rest is not
            worker.start()
            os.kill(draft_pid, signal.SIGKILL)
        streamed.append(chunk.text)
    worker.join(300)

    assert "".join(streamed) == expected[PROMPTS[0]]
    assert [r.text if isinstance(r, Generation) else r for r in others] == [expected[p] for p in PROMPTS]
    after_kill = client.generate(PROMPTS[1], 48, num_draft_tokens=MAX_DRAFT_LEN)
    assert after_kill.text == expected[PROMPTS[1]]
    assert metrics(served)["specbuild_draft_fallbacks_total"] > before["specbuild_draft_fallbacks_total"]
    assert metrics(served)["specbuild_request_errors_total"] == before["specbuild_request_errors_total"]
    assert "draft_0_0" not in served.processes()  # Triton does not restart a dead stub by itself

    served.unload_model("draft")  # a plain load of a loaded model is a no-op: unload first
    served.load_model("draft")
    assert served.processes()["draft_0_0"] != draft_pid
    time.sleep(5.5)  # the orchestrator retries the draft DRAFT_RETRY_SECONDS after its last failure
    recovered = client.generate(PROMPTS[2], 48, num_draft_tokens=MAX_DRAFT_LEN)
    assert recovered.text == expected[PROMPTS[2]]
    assert recovered.total_draft_tokens and recovered.total_draft_tokens > 0


# --- cancellation -----------------------------------------------------------------------------------------
def test_cancelled_stream_stops_the_orchestrator_and_the_server_keeps_serving(served):
    before = metrics(served)
    wanted = 120
    arrays = {"input_ids": np.array([[5, 6, 7, 8]], np.int32), "input_length": np.array([[4]], np.int32),
              "max_tokens": np.array([[wanted]], np.int32), "stream": np.array([[True]]),
              "num_draft_tokens": np.array([[2]], np.int32)}
    responses, error = raw_stream(served, "orchestrator", arrays, chunks=2)
    assert len(responses) == 2 and error is None
    deadline = time.monotonic() + 60
    while metrics(served)["specbuild_requests_total"] == before["specbuild_requests_total"]:
        assert time.monotonic() < deadline, "the cancelled request never finished"
        time.sleep(0.2)
    produced = metrics(served)["specbuild_output_tokens_total"] - before["specbuild_output_tokens_total"]
    assert produced < wanted  # it stopped early
    assert "the client cancelled a request" in served.read_log()
    assert metrics(served)["specbuild_cancelled_requests_total"] == before["specbuild_cancelled_requests_total"] + 1

    # Through the ensemble, Triton 2.51 stops between steps but does not cancel the running orchestrator
    # request (docs/reliability.md): the work is bounded by max_tokens and the server keeps serving.
    chunks = SpecbuildClient(served.grpc_url, timeout=300).stream(PROMPTS[0], 64)
    next(chunks)
    chunks.close()
    assert SpecbuildClient(served.grpc_url, timeout=300).generate(PROMPTS[1], 4).output_token_count == 4
    assert served.is_running()


# --- compile interrupted at each step ---------------------------------------------------------------------
def _disk_full(*_: Any, **__: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _interrupt(*_: Any, **__: Any) -> None:
    raise KeyboardInterrupt


def _after_writing(path_name: str, fault: Callable[..., None]) -> Callable[..., Any]:
    """A ``Path.write_text`` that writes half of a file named ``path_name`` and then fails."""
    original = Path.write_text

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name == path_name:
            original(self, data[: len(data) // 2], *args, **kwargs)
            fault()
        return original(self, data, *args, **kwargs)

    return write_text


FAULTS = {
    # step: (what to patch, replacement)
    "check": ("specbuild.check.pair_report.check", _interrupt),
    "convert": ("specbuild.runtimes.torch.runtime.copy_tokenizer", _disk_full),
    "build": ("pathlib.Path.write_text", _after_writing("build_info.json", _disk_full)),
    "package": ("specbuild.package.repository.validate_repository", _interrupt),
    "manifest": ("specbuild.package.manifest.atomic_write_text", _disk_full),
}
OUTPUTS = {"check": "build/check", "convert": "build/torch", "build": "engines", "package": "triton_repo"}
STEPS = list(FAULTS)


def _scratch_left(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


@pytest.mark.parametrize("step", STEPS)
def test_interrupted_compile_leaves_no_partial_output_and_a_rerun_resumes(checkpoints, tmp_path, monkeypatch, step):
    target, replacement = FAULTS[step]
    with monkeypatch.context() as patch:
        patch.setattr(target, replacement)
        with pytest.raises((StageError, KeyboardInterrupt)) as failure:
            compile_release(checkpoints, tmp_path)
    if isinstance(failure.value, StageError):
        assert failure.value.stage == step and "No space left on device" in failure.value.message
    assert _scratch_left(tmp_path) == []
    for later in STEPS[STEPS.index(step):]:  # the failed step and everything after it: nothing under final names
        if later in OUTPUTS:
            assert not (tmp_path / OUTPUTS[later]).exists(), later
    assert not (tmp_path / "triton_repo" / "manifest.json").exists()

    result = compile_release(checkpoints, tmp_path)
    statuses = {s.name: s.status for s in result.steps}
    assert all(statuses[done] == "skipped" for done in STEPS[: STEPS.index(step)] if done in statuses)
    assert verify(result.repository).ok


def test_sigint_during_build_exits_130_without_traceback_and_a_rerun_resumes(checkpoints, tmp_path):
    """A real SIGINT to ``specbuild compile`` while the build step runs (held there by a slow build)."""
    marker = tmp_path / "building"
    args = ["compile", "--target", str(checkpoints.target), "--draft", str(checkpoints.draft), "--runtime", "torch",
            *(f"--set=outputs.{key}={tmp_path / folder}" for key, folder in
              (("build_dir", "build"), ("engines_dir", "engines"), ("repository_dir", "triton_repo"))),
            "--set=limits.max_input_len=64", "--set=limits.max_seq_len=192"]
    # a signal ignored by this process stays ignored in a child (a test run started as a background job, `cmd &` in a
    # script, has SIGINT ignored from the start), and Python installs its Ctrl-C handler only where SIGINT is not
    # ignored: the child restores it, as an interactive shell has it
    script = (f"import pathlib, signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"import specbuild.runtimes.torch.runtime as runtime\n"
              f"runtime.build = lambda *a, **k: (pathlib.Path({str(marker)!r}).touch(), time.sleep(300))\n"
              f"from specbuild.cli import main\nsys.argv = ['specbuild', *{args!r}]\nmain()\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=120)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and "interrupted" in output and "Traceback" not in output, output
    assert not (tmp_path / "engines").exists() and _scratch_left(tmp_path) == []
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    statuses = {step["name"]: step["status"] for step in json.loads(result.stdout)["steps"]}
    assert statuses == {"check": "skipped", "convert": "skipped", "build": "ok", "package": "ok"}
    assert verify(tmp_path / "triton_repo").ok


def test_interrupted_rebuild_keeps_the_previous_release_whole(checkpoints, tmp_path, monkeypatch):
    first = compile_release(checkpoints, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr("specbuild.package.repository.validate_repository", _interrupt)
        with pytest.raises(KeyboardInterrupt):
            compile_release(checkpoints, tmp_path, **{"speculation.num_draft_tokens": 2})  # package must re-run
    assert verify(first.repository).ok and _scratch_left(tmp_path) == []


# --- tampering --------------------------------------------------------------------------------------------
def _tampered_release(checkpoints: Any, root: Path) -> Path:
    repository = compile_release(checkpoints, root).repository
    config = root / "engines" / "draft" / "config.json"
    config.write_text(config.read_text() + " ")
    return repository


def test_tampered_release_is_named_by_verify_and_refused_by_serve(checkpoints, tmp_path):
    repository = _tampered_release(checkpoints, tmp_path)
    verified = CliRunner().invoke(main, ["verify", str(repository)])
    assert verified.exit_code == 1 and "engines/draft/config.json" in verified.output
    refused = CliRunner().invoke(main, ["serve", str(repository), "--http-port", "0", "--grpc-port", "0",
                                        "--metrics-port", "0"])
    assert refused.exit_code == 1, refused.output
    assert f"changed {tmp_path / 'engines' / 'draft' / 'config.json'}" in refused.output  # whole, not wrapped
    assert "--no-verify" in refused.output
    assert "Traceback" not in refused.output


def test_serve_no_verify_serves_a_tampered_release(checkpoints, tmp_path):
    repository = _tampered_release(checkpoints, tmp_path)
    http = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "specbuild.cli", "serve", str(repository), "--no-verify", "--http-port", str(http),
         "--grpc-port", "0", "--metrics-port", "0", "--openai-port", "0", "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "press Ctrl-C" in line or "error:" in line:
                break
        assert any("press Ctrl-C" in line for line in lines), "".join(lines)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert not list(repository.rglob("__pycache__"))  # serving leaves the release's files as they were, shipped modules too
