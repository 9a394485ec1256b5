"""The incremental stage runner: skip when nothing changed, re-run on any change, fail loudly and safely."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from specbuild.errors import CheckpointError, StageError, UsageError
from specbuild.stages.runner import Stage, StageRunner


class Pipeline:
    """Two stages like compile's convert -> build, over a one-file checkpoint, counting real runs."""

    def __init__(self, tmp_path: Path) -> None:
        self.checkpoint = tmp_path / "ckpt"
        self.checkpoint.mkdir()
        (self.checkpoint / "model.safetensors").write_bytes(b"weights-v1")
        self.converted = tmp_path / "build" / "convert"
        self.engines = tmp_path / "engines"
        self.state = tmp_path / "build" / ".specbuild-state.json"
        self.dtype = "float16"
        self.note = "first"
        self.max_draft_len = 4
        self.runs: list[str] = []
        self.fail_build: BaseException | None = None

    def convert(self, out: Path) -> dict[str, Any]:
        self.runs.append("convert")
        weights = (self.checkpoint / "model.safetensors").read_bytes()
        (out / "rank0.safetensors").write_bytes(weights + self.dtype.encode())
        return {"dtype": self.dtype}

    def build(self, out: Path, progress) -> None:
        self.runs.append("build")
        progress("building target", 0.5)
        if self.fail_build is not None:
            (out / "half.engine").write_bytes(b"partial")
            raise self.fail_build
        converted = (self.converted / "rank0.safetensors").read_bytes()
        (out / "target").mkdir()
        (out / "target" / "rank0.engine").write_bytes(converted + bytes([self.max_draft_len]))

    def stages(self) -> list[Stage]:
        return [
            Stage("convert", {"checkpoint": self.checkpoint, "dtype": self.dtype, "note": self.note},
                  self.converted, self.convert),
            Stage("build", {"max_draft_len": self.max_draft_len}, self.engines, self.build),
        ]

    def run(self, **options: Any) -> dict[str, str]:
        self.runs.clear()
        results = StageRunner(self.state, json_mode=True, **options).run(self.stages())
        return {result.name: result.status for result in results}


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(tmp_path)


def test_second_run_skips_everything(pipeline: Pipeline) -> None:
    assert pipeline.run() == {"convert": "ok", "build": "ok"}
    pipeline.runs.clear()
    results = StageRunner(pipeline.state, json_mode=True).run(pipeline.stages())
    assert [(r.status, r.detail) for r in results] == [("skipped", "skipped: inputs unchanged")] * 2
    assert results[0].data == {"dtype": "float16"}  # the action's report survives a skip
    assert pipeline.runs == []
    assert (pipeline.engines / "target" / "rank0.engine").read_bytes() == b"weights-v1float16\x04"


def test_changed_value_input_reruns_it_and_downstream(pipeline: Pipeline) -> None:
    pipeline.run()
    pipeline.dtype = "bfloat16"
    assert pipeline.run() == {"convert": "ok", "build": "ok"}
    assert pipeline.runs == ["convert", "build"]
    assert (pipeline.engines / "target" / "rank0.engine").read_bytes() == b"weights-v1bfloat16\x04"


def test_changed_input_file_reruns_it_and_downstream(pipeline: Pipeline) -> None:
    pipeline.run()
    (pipeline.checkpoint / "model.safetensors").write_bytes(b"weights-v2")
    assert pipeline.run() == {"convert": "ok", "build": "ok"}


def test_changed_downstream_input_reruns_only_downstream(pipeline: Pipeline) -> None:
    pipeline.run()
    pipeline.max_draft_len = 8
    assert pipeline.run() == {"convert": "skipped", "build": "ok"}
    assert pipeline.runs == ["build"]


def test_upstream_rerun_with_identical_output_does_not_rerun_downstream(pipeline: Pipeline) -> None:
    pipeline.run()
    pipeline.note = "second"  # an input that does not change convert's files
    assert pipeline.run() == {"convert": "ok", "build": "skipped"}


def test_tampered_output_reruns_the_stage_and_names_the_file(pipeline: Pipeline) -> None:
    pipeline.run()
    engine = pipeline.engines / "target" / "rank0.engine"
    data = bytearray(engine.read_bytes())
    data[0] ^= 0x01
    engine.write_bytes(bytes(data))
    results = StageRunner(pipeline.state, json_mode=True).run(pipeline.stages())
    assert [r.status for r in results] == ["skipped", "ok"]
    assert "target/rank0.engine" in results[1].detail
    assert engine.read_bytes() == b"weights-v1float16\x04"


def test_deleted_output_reruns_the_stage(pipeline: Pipeline) -> None:
    pipeline.run()
    (pipeline.converted / "rank0.safetensors").unlink()
    assert pipeline.run() == {"convert": "ok", "build": "skipped"}


def test_force_reruns_everything(pipeline: Pipeline) -> None:
    pipeline.run()
    assert pipeline.run(force=True) == {"convert": "ok", "build": "ok"}


@pytest.mark.parametrize(
    ("failure", "message", "fix"),
    [
        (ValueError("bad shape"), "build failed: ValueError: bad shape", "traceback"),
        (CheckpointError("draft has no weights", "add model.safetensors"), "build failed: draft has no weights",
         "add model.safetensors"),
    ],
)
def test_failing_action_records_failed_and_raises_stage_error(
    pipeline: Pipeline, failure: Exception, message: str, fix: str
) -> None:
    pipeline.run()
    pipeline.max_draft_len = 8
    pipeline.fail_build = failure
    runner = StageRunner(pipeline.state, json_mode=True)
    with pytest.raises(StageError) as info:
        runner.run(pipeline.stages())
    assert info.value.stage == "build" and info.value.exit_code == 12
    assert info.value.message == message and fix in info.value.fix
    assert [(r.name, r.status) for r in runner.results] == [("convert", "skipped"), ("build", "failed")]
    record = json.loads(pipeline.state.read_text())["stages"]["build"]
    assert record["status"] == "failed" and type(failure).__name__ in record["traceback"]
    # The previous engines are intact, and the partial one never appeared.
    assert sorted(p.name for p in pipeline.engines.rglob("*")) == ["rank0.engine", "target"]
    pipeline.fail_build = None
    assert pipeline.run() == {"convert": "skipped", "build": "ok"}


def test_interrupt_propagates_and_is_recorded(pipeline: Pipeline) -> None:
    pipeline.fail_build = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        pipeline.run()
    assert not pipeline.engines.exists()
    assert json.loads(pipeline.state.read_text())["stages"]["build"]["error"] == "interrupted"


def test_stage_names_set_exit_codes(pipeline: Pipeline) -> None:
    def broken(out: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(StageError) as info:
        StageRunner(pipeline.state, json_mode=True).run([Stage("package", {}, pipeline.engines, broken)])
    assert info.value.exit_code == 13


def test_display_shows_progress_and_summary(pipeline: Pipeline) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=False)
    StageRunner(pipeline.state, console=console).run(pipeline.stages())
    StageRunner(pipeline.state, console=console).run(pipeline.stages())
    text = buffer.getvalue()
    assert "specbuild stages" in text and "ran: first run" in text and "skipped: inputs unchanged" in text


def test_json_mode_prints_nothing(pipeline: Pipeline, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline.run()
    assert capsys.readouterr() == ("", "")


def test_state_file_inside_an_output_is_refused(pipeline: Pipeline) -> None:
    with pytest.raises(UsageError, match="state file"):
        StageRunner(pipeline.engines / "state.json", json_mode=True).run(pipeline.stages())


def test_concurrent_run_on_the_same_state_is_refused(pipeline: Pipeline) -> None:
    def nested(out: Path) -> None:
        StageRunner(pipeline.state, json_mode=True).run(pipeline.stages())

    with pytest.raises(StageError) as info:
        StageRunner(pipeline.state, json_mode=True).run([Stage("check", {}, pipeline.engines.parent / "check", nested)])
    assert "another specbuild run" in info.value.message


def test_records_are_per_scope(pipeline: Pipeline) -> None:
    """A failure in one scope (compile's other runtime) leaves the other scope's records alone."""
    assert pipeline.run(scope="torch") == {"convert": "ok", "build": "ok"}
    pipeline.fail_build = RuntimeError("no tensorrt_llm here")
    with pytest.raises(StageError, match='stages\\["tensorrt-llm/build"\\].traceback'):
        pipeline.run(scope="tensorrt-llm")
    pipeline.fail_build = None
    assert pipeline.run(scope="torch") == {"convert": "skipped", "build": "skipped"}
    records = json.loads(pipeline.state.read_text())["stages"]
    assert records["tensorrt-llm/build"]["status"] == "failed" and records["torch/build"]["status"] == "ok"
