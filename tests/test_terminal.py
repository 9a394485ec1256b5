"""Logs for machines: where output is not a terminal (CI, ``demo.log``, a pipe), text is never wrapped, so a
message is one line however long; at a terminal rich wraps at its width; ``--json`` output is unchanged."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_factory import Checkpoints
from specbuild.terminal import LOG_WIDTH, make_console

LONG = "the draft cannot pay: " + "every drafted token accepted, " * 12 + "end"


def test_a_console_writing_to_a_file_never_wraps_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    console = make_console()
    assert not console.is_terminal and console.width == LOG_WIDTH
    console.print(LONG)
    assert stream.getvalue() == LONG + "\n" and len(LONG) > LOG_WIDTH


def test_columns_names_the_width_of_tables_in_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert make_console(stderr=False).width == 100


def test_at_a_terminal_rich_wraps_at_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        console = make_console()
        assert console.is_terminal and not console.soft_wrap
    os.close(leader)


def test_the_cli_writes_whole_lines_to_a_pipe_and_json_unchanged(checkpoints: Checkpoints,
                                                                  tmp_path: Path) -> None:
    """``specbuild check`` into a pipe, no COLUMNS: its longest sentences (the break-even, over 80 columns) are
    one line each, and --json is one document."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    command = [sys.executable, "-m", "specbuild.cli", "check", str(checkpoints.target), str(checkpoints.draft)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, check=True, timeout=300)
    [line] = [line for line in done.stdout.splitlines() if line.startswith("a draft token costs")]
    assert len(line) > 80 and line.endswith(")") and "breaks even when more than" in line
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
                             timeout=300)
    assert json.loads(as_json.stdout)["compatible"] is True
