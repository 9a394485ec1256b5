"""``--json`` on every command: stdout holds exactly one JSON document, on success and on failure (``{"error",
"fix", "exit_code"}``, the exit code the process returns), or JSON Lines for the commands that stream. The
exit codes are the README's table (test_readme_commands checks that it names every command)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

from conftest import TINY_SEED
from specbuild.capture.store import open_store
from specbuild.cli import main
from locations import REPO_ROOT

Args = Callable[[Path], list[str]]
MISSING = "/nonexistent/specbuild"

# Each command with arguments that make it fail for a reason the user can fix (or a flag Click refuses).
FAILURES: dict[str, Args] = {
    "init": lambda tmp: ["init", "--out", str(_existing(tmp)), "--no-measure"],
    "verify": lambda tmp: ["verify", MISSING],
    "doctor": lambda tmp: ["doctor", MISSING],
    "check": lambda tmp: ["check", f"{MISSING}/target", f"{MISSING}/draft"],
    "compile": lambda tmp: ["compile", "--target", f"{MISSING}/target", "--draft", f"{MISSING}/draft"],
    "convert": lambda tmp: ["convert", "--set", "limits.max_seq_len=-1", "--target", "t", "--draft", "d"],
    "build": lambda tmp: ["build", "--set", "no_such_section.key=1", "--target", "t", "--draft", "d"],
    "package": lambda tmp: ["package", "--spec", f"{MISSING}.yaml"],
    "serve": lambda tmp: ["serve", MISSING],
    "openai": lambda tmp: ["openai", MISSING],
    "generate": lambda tmp: ["generate", ""],
    "deploy": lambda tmp: ["deploy", MISSING, "-o", "-"],
    "monitoring": lambda tmp: ["monitoring", MISSING, "-o", str(tmp / "monitoring")],
    "bench": lambda tmp: ["bench"],
    "tune": lambda tmp: ["tune", "--spec", f"{MISSING}.yaml"],
    "demo": lambda tmp: ["demo", "--max-tokens", "0"],
    "demo-models": lambda tmp: ["demo-models", "--no-such-flag"],
    "draft": lambda tmp: ["draft", f"{MISSING}/target", str(tmp / "draft")],
    "head-vocabulary": lambda tmp: ["head-vocabulary", f"{MISSING}/target", str(tmp)],
    "capture": lambda tmp: ["capture", "purge", str(tmp), "--yes"],  # a folder that is not a capture store
}


def _existing(tmp: Path) -> Path:
    path = tmp / "specbuild.yaml"
    path.write_text("name: keep-me\n")
    return path


def invoke(args: list[str]) -> Any:
    return CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)


def test_every_command_is_covered():
    assert set(main.commands) == set(FAILURES) == set(SUCCESSES_WITHOUT_A_SERVER) | set(SUCCESSES_WITH_A_SERVER) \
        | {"demo", "draft", "head-vocabulary"}  # these: test_demo_and_draft_report_in_json (slow)


@pytest.mark.parametrize("name", list(FAILURES))
def test_failures_are_one_json_document_with_the_exit_code(name: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a failed compile records its failure in ./build: never in the checkout
    result = invoke(FAILURES[name](tmp_path))
    assert result.exit_code != 0
    [line] = result.stdout.splitlines()  # one document, on one line (also the last line of a JSON Lines stream)
    error = json.loads(line)
    assert error["exit_code"] == result.exit_code and error["error"] and "fix" in error
    assert "Traceback" not in result.output


# --- successes -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spec_file(tiny_release, tmp_path_factory) -> Path:
    """The cached tiny release's spec as a file: compile finds every stage done."""
    path = tmp_path_factory.mktemp("json") / "specbuild.yaml"
    path.write_text(tiny_release.spec.to_yaml(), encoding="utf-8")
    return path


SUCCESSES_WITHOUT_A_SERVER: dict[str, Callable[..., list[str]]] = {
    "init": lambda release, spec, tmp: ["init", "--out", str(tmp / "new.yaml"), "--no-measure"],
    "verify": lambda release, spec, tmp: ["verify", str(release.repository)],
    "doctor": lambda release, spec, tmp: ["doctor", str(release.repository)],
    "check": lambda release, spec, tmp: ["check", release.spec.target.checkpoint, release.spec.draft.checkpoint],
    "compile": lambda release, spec, tmp: ["compile", "--spec", str(spec)],
    "convert": lambda release, spec, tmp: ["convert", "--spec", str(spec), "--dry-run"],
    "build": lambda release, spec, tmp: ["build", "--spec", str(spec), "--dry-run"],
    "package": lambda release, spec, tmp: ["package", "--spec", str(spec), "--dry-run"],
    "serve": lambda release, spec, tmp: ["serve", str(release.repository), "--dry-run"],
    "openai": lambda release, spec, tmp: ["openai", str(release.repository), "--dry-run"],
    "deploy": lambda release, spec, tmp: ["deploy", str(release.repository), "-o", str(tmp / "k8s"), "--pvc", "r"],
    "monitoring": lambda release, spec, tmp: ["monitoring", str(release.repository), "-o", str(tmp / "monitoring")],
    "demo-models": lambda release, spec, tmp: ["demo-models", "--tiny"],
    "capture": lambda release, spec, tmp: ["capture", "show", str(open_store(tmp / "capture"))],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUCCESSES_WITHOUT_A_SERVER))
def test_successes_are_one_json_document(name: str, tiny_release, spec_file: Path, tmp_path: Path) -> None:
    result = invoke(SUCCESSES_WITHOUT_A_SERVER[name](tiny_release, spec_file, tmp_path))
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert isinstance(document, dict) and "error" not in document


SUCCESSES_WITH_A_SERVER: dict[str, Callable[..., list[str]]] = {
    "generate": lambda server, spec: ["generate", "def main():", "--url", server.grpc_url, "--max-tokens", "8",
                                      "--no-stream"],
    "bench": lambda server, spec: ["bench", "--url", server.grpc_url, "--metrics-url", server.metrics_url, "--k", "2",
                                   "--num-prompts", "2", "--requests", "2", "--max-tokens", "8", "--no-plots",
                                   "--out", str(spec.parent / "bench"), "--gate", "greedy_identical"],
    "tune": lambda server, spec: ["tune", "--spec", str(spec), "--url", server.grpc_url, "--k", "0,1",
                                  "--adaptive", "off", "--num-prompts", "2", "--requests", "2", "--max-tokens", "8",
                                  "--dry-run"],
}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", list(SUCCESSES_WITH_A_SERVER))
def test_successes_against_a_server_are_one_json_document(name: str, tiny_server, spec_file: Path) -> None:
    result = invoke(SUCCESSES_WITH_A_SERVER[name](tiny_server, spec_file))
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert "error" not in document
    if name == "bench":
        assert document["gate"]["passed"] is True and document["cells"]


@pytest.mark.slow
@pytest.mark.e2e
def test_generate_stream_writes_json_lines_then_a_summary(tiny_server) -> None:
    result = invoke(["generate", "def main():", "--url", tiny_server.grpc_url, "--max-tokens", "12", "--stream",
                     "--num-draft-tokens", "2"])
    assert result.exit_code == 0, result.output
    *chunks, last = [json.loads(line) for line in result.stdout.splitlines()]
    assert chunks and all(set(item) == {"chunk"} for item in chunks)
    summary = last["summary"]
    assert summary["text"] == "".join(item["chunk"]["text"] for item in chunks)
    assert summary["chunks"] == len(chunks) and summary["output_token_count"] == 12


@pytest.mark.slow
@pytest.mark.e2e
def test_demo_and_draft_report_in_json(tiny_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from specbuild.drafts.model_pairs import CACHE_ENV, pair_dir

    monkeypatch.delenv(CACHE_ENV, raising=False)
    shutil.copytree(tiny_pair.root, pair_dir("tiny", tmp_path))  # the cached pair; its stamp skips a rebuild
    demo = invoke(["demo", "--tiny", "--tiny-seed", str(TINY_SEED), "--workdir", str(tmp_path), "--max-tokens",
                   "8"])
    assert demo.exit_code == 0, demo.output
    assert json.loads(demo.stdout)["identical"] is True
    draft = invoke(["draft", str(tiny_pair.target_dir), str(tmp_path / "draft"), "--prompts", "4", "--held-out", "2",
                    "--max-new-tokens", "8", "--steps", "2", "--minutes", "5"])
    assert draft.exit_code == 0, draft.output
    assert json.loads(draft.stdout)["steps_done"] == 2
    head = invoke(["head-vocabulary", str(tiny_pair.target_dir), str(tmp_path / "draft"), "--size", "32",
                   "--prompts", "2", "--max-new-tokens", "4", "--threads", "1"])
    assert head.exit_code == 0, head.output
    assert json.loads(head.stdout)["size"] == 32


# --- the documented exit codes ------------------------------------------------------------------------------
def test_the_readme_exit_code_table_names_every_command_and_code():
    import re

    from specbuild import errors

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("| ").split(" | ") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| command", "|---"))]
    named = {name for first, *_ in rows for name in re.findall(r"`([\w-]+)", first)}
    assert set(main.commands) <= named, f"without a row in README's CLI reference: {set(main.commands) - named}"
    assert all(cells[-1].strip() for cells in rows), "a command without its exit codes"
    codes = " ".join(cells[-1] for cells in rows)
    documented = {int(code) for code in re.findall(r"\b\d+\b", codes)}
    documented |= set(range(10, 15)) if "10-14" in codes else set()
    raised = {cls.exit_code for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.SpecbuildError)}
    raised |= set(errors.StageError.STAGE_EXIT_CODES.values()) | {128 + 2, 128 + 15}  # SIGINT, SIGTERM
    assert raised <= documented, f"exit codes missing from README's CLI reference: {raised - documented}"
