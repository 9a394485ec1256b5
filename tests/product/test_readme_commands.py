"""Every command in README.md's code blocks runs as written (read from the README each time, so commands
added there are run too), in order, in a scratch folder that stands in for the repository root; the demo
pair's folder there holds the tiny pair, so the README's flow (init, check, compile, verify, the dry runs,
the Python API) takes about a minute. Commands that cannot run here are listed below with the reason."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specbuild.drafts.model_pairs import CACHE_ENV, pair_dir
from readme_blocks import NEEDS_THE_SERVER, README, readme_commands

COMMAND_TIMEOUT = 600

# Written as shlex.join writes the README's line (without its comment).
SKIPPED = {
    "bash scripts/demo.sh": "long-running: sets up .venv and builds the SmolLM2 demo pair (2 min 20 s without "
                            "set-up, 2026-12-01); "
                            "tests/test_demo.py runs the same demo on the tiny pair",
    "bash scripts/test.sh": "runs this test suite itself (8+ minutes)",
    "source .venv/bin/activate": "changes the calling shell only",
    "specbuild serve triton_repo": "serves until Ctrl-C on the fixed ports 8000-8002 of a shared machine; "
                                   "tests/serve/test_server.py serves releases on free ports",
    "specbuild generate 'Tell me a joke' --stream --num-draft-tokens 4": "needs the server above; "
                                                                        "tests/serve/test_client.py streams through one",
}
# Known to fail as written; strict: once one runs, it must leave this list.
EXPECTED_FAILURES = {
    "specbuild deploy gpu_repo --k8s k8s/ --pvc my-release": "needs a GPU release whose engines are built (a GPU "
    "host); the README packages gpu_repo without engines, which deploy refuses (tests/serve/test_k8s.py deploys one)",
}


def test_readme_has_commands_and_the_lists_name_only_readme_commands():
    commands = {command for kind, command in readme_commands(README.read_text(encoding="utf-8"))}
    assert {"specbuild verify triton_repo", "bash scripts/demo.sh"} <= commands
    stale = (SKIPPED.keys() | EXPECTED_FAILURES.keys()) - commands
    assert not stale, f"no longer in README.md, remove from this test's lists: {sorted(stale)}"


def test_comments_and_quotes_are_read_as_a_shell_reads_them():
    text = "```bash\nspecbuild generate \"Tell me # a joke\" --stream   # streamed\n\n# a comment\n```\n" \
           "```\nnot a command\n```\n```python\nprint(1)\n```\n"
    assert readme_commands(text) == [("shell", "specbuild generate 'Tell me # a joke' --stream"),
                                     ("python", "print(1)\n")]


@pytest.fixture()
def scratch_root(tiny_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder standing in for the repository root: the tiny pair where the demo pair is cached."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    shutil.copytree(tiny_pair.root, pair_dir("demo", tmp_path), copy_function=os.link)
    return tmp_path


@pytest.mark.slow
def test_every_readme_command_runs_as_written(scratch_root: Path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "200"}
    env.pop(CACHE_ENV, None)
    problems = []
    for kind, command in readme_commands(README.read_text(encoding="utf-8")):
        if command in SKIPPED or command.startswith(NEEDS_THE_SERVER):
            continue
        argv = shlex.split(command) if kind == "shell" else [sys.executable, "-c", command]
        result = subprocess.run(argv, cwd=scratch_root, env=env, capture_output=True, text=True, check=False,
                                timeout=COMMAND_TIMEOUT)
        failed = result.returncode != 0
        if failed != (command in EXPECTED_FAILURES):
            outcome = f"exit {result.returncode}" if failed else "now runs: remove it from EXPECTED_FAILURES"
            problems.append(f"{command!r}: {outcome}\n{(result.stdout + result.stderr)[-2000:]}")
    assert not problems, "\n\n".join(problems)
    written = [f"{path.name}/" if path.is_dir() else path.name for path in sorted(scratch_root.iterdir())]
    ignored = subprocess.run(["git", "-C", str(README.parent), "check-ignore", "--no-index", "--stdin"],
                             input="\n".join(written), capture_output=True, text=True, check=False).stdout.split()
    assert set(written) == set(ignored), f"the README's commands write {sorted(set(written) - set(ignored))} at " \
        "the repository root, which .gitignore does not ignore"
