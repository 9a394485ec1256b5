"""Build limits left open in the spec come from the checkpoints (as trtllm-build does): a pair with a short
context passes ``check`` without a spec, every step after the check builds for the resolved limits, and only
values the user set are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_factory import Checkpoints, edit_json, with_max_positions
from click.testing import CliRunner

from specbuild.package.build_record import BuildRecord
from specbuild import compiler
from specbuild.cli import main
from specbuild.errors import SpecError
from specbuild.package import manifest
from specbuild.spec import DEFAULT_MAX_SEQ_LEN, LimitsSpec, load_spec

SHORT = 512


@pytest.mark.parametrize(("requested", "positions", "expected"), [
    ({}, SHORT, (SHORT // 2, SHORT)),
    ({}, 131072, (DEFAULT_MAX_SEQ_LEN // 2, DEFAULT_MAX_SEQ_LEN)),  # capped: KV memory grows with it
    ({}, None, (DEFAULT_MAX_SEQ_LEN // 2, DEFAULT_MAX_SEQ_LEN)),
    ({"max_seq_len": 300}, SHORT, (150, 300)),
    ({"max_input_len": 100}, SHORT, (100, SHORT)),
    ({"max_input_len": 3000}, 131072, (3000, 3001)),  # room for one generated token beyond the input
    ({"max_input_len": 64, "max_seq_len": 4096}, SHORT, (64, 4096)),  # set by the user: kept (check refuses it)
])
def test_open_limits_resolve_from_the_checkpoints(requested: dict, positions: int | None,
                                                  expected: tuple[int, int]) -> None:
    resolved = LimitsSpec(**requested).resolve(positions)
    assert (resolved.max_input_len, resolved.max_seq_len) == expected
    assert resolved.max_batch_size == LimitsSpec().max_batch_size


@pytest.mark.parametrize(("requested", "positions", "expected"), [
    ({}, (131072, 4096), (DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)),  # the draft holds the whole (capped) window
    ({}, (SHORT, 128), (SHORT, 128)),  # the release serves the target's window, the draft its own
    ({}, (SHORT, None), (SHORT, SHORT)),  # unknown: as many as the target
    ({"max_seq_len": 300}, (SHORT, 4096), (300, 300)),  # never more than a request holds
    ({"draft_max_seq_len": 64}, (SHORT, 128), (SHORT, 64)),  # set by the user: kept
    ({"draft_max_seq_len": 4096}, (SHORT, 128), (SHORT, SHORT)),  # beyond the resolved window (check refuses it)
])
def test_the_draft_window_resolves_from_the_draft_alone(requested: dict, positions: tuple[int, int | None],
                                                         expected: tuple[int, int]) -> None:
    resolved = LimitsSpec(**requested).resolve(*positions)
    assert (resolved.max_seq_len, resolved.draft_max_seq_len) == expected


def test_each_engine_gets_its_own_model_s_limits() -> None:
    limits = LimitsSpec().resolve(SHORT, 128)
    assert limits.of("target") == limits
    draft = limits.of("draft")
    assert (draft.max_batch_size, draft.max_input_len, draft.max_seq_len) == (8, 127, 128)
    same = LimitsSpec().resolve(SHORT, SHORT).of("draft")
    assert (same.max_input_len, same.max_seq_len) == (SHORT // 2, SHORT)


def test_limits_the_user_sets_are_still_validated(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="must be larger than max_input_len"):
        load_spec(None, {"target.checkpoint": "t", "draft.checkpoint": "d", "limits.max_seq_len": 64,
                         "limits.max_input_len": 64}, base_dir=tmp_path)


@pytest.fixture(scope="module")
def short_pair(checkpoints: Checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return with_max_positions(checkpoints, tmp_path_factory.mktemp("short"), SHORT)


def test_check_passes_a_short_context_pair_without_a_spec(short_pair: tuple[Path, Path]) -> None:
    result = CliRunner().invoke(main, ["check", *map(str, short_pair), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["compatible"] and report["limits"]["max_seq_len"] == SHORT
    assert report["memory_plan"]["target"]["kv_tokens"] == 8 * (SHORT + 8)  # the plan sees the resolved limits
    shown = CliRunner().invoke(main, ["check", *map(str, short_pair)], env={"COLUMNS": "300"})
    assert f"build limits: max_batch_size 8, max_input_len {SHORT // 2}, max_seq_len {SHORT}" in shown.output


@pytest.mark.parametrize(("setting", "message", "fix"), [
    ("limits.max_seq_len=2048", "limits.max_seq_len 2048 is more than the target supports (max_position_embeddings "
     f"{SHORT})", f"lower limits.max_seq_len to {SHORT} or less"),
    (f"limits.max_input_len={SHORT}", f"limits.max_input_len {SHORT} leaves no room to generate",
     f"lower limits.max_input_len below {SHORT}"),
])
def test_a_limit_the_user_set_beyond_the_checkpoints_is_refused_with_the_fix(
        short_pair: tuple[Path, Path], tmp_path: Path, setting: str, message: str, fix: str) -> None:
    key, value = setting.split("=")
    spec = tmp_path / "specbuild.yaml"
    section, name = key.split(".")
    spec.write_text(f"target: {{checkpoint: x}}\ndraft: {{checkpoint: y}}\n{section}: {{{name}: {value}}}\n")
    result = CliRunner().invoke(main, ["check", *map(str, short_pair), "--spec", str(spec)], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert message in text and fix in text


def test_every_step_after_the_check_builds_for_the_resolved_limits(short_pair: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    target, draft = short_pair
    spec = load_spec(None, {"runtime": "torch", "target.checkpoint": str(target), "draft.checkpoint": str(draft),
                            "outputs.build_dir": "build", "outputs.engines_dir": "engines",
                            "outputs.repository_dir": "triton_repo"}, base_dir=tmp_path)
    assert spec.limits.max_seq_len is None
    result = compiler.run(spec, json_mode=True)
    assert (result.spec.limits.max_input_len, result.spec.limits.max_seq_len) == (SHORT // 2, SHORT)
    limits = BuildRecord.read(result.engines / "draft").limits
    assert (limits.max_input_len, limits.max_seq_len) == (SHORT // 2, SHORT)
    orchestrator = (result.repository / "orchestrator" / "config.pbtxt").read_text()
    assert f'key: "max_seq_len"\n  value {{\n    string_value: "{SHORT}"' in orchestrator
    assert f'key: "max_input_len"\n  value {{\n    string_value: "{SHORT // 2}"' in \
        (result.repository / "preprocessing" / "config.pbtxt").read_text()
    recorded = json.loads((result.repository / manifest.MANIFEST_NAME).read_text())
    assert recorded["spec"]["limits"] == {"max_batch_size": 8, "max_input_len": SHORT // 2, "max_seq_len": SHORT,
                                          "draft_max_seq_len": SHORT}
    again = compiler.run(spec, json_mode=True)  # a skipped check still hands its resolved limits on
    assert again.spec.limits == result.spec.limits and {s.status for s in again.steps} == {"skipped"}


def test_a_draft_with_a_smaller_window_builds_for_it_and_the_release_for_the_target(
        checkpoints: Checkpoints, tmp_path: Path) -> None:
    """The target's window is the release's; the draft engine is built for its own, which the orchestrator knows."""
    target, draft = with_max_positions(checkpoints, tmp_path / "pair", SHORT)
    edit_json(draft / "config.json", max_position_embeddings=128)
    spec = load_spec(None, {"runtime": "torch", "target.checkpoint": str(target), "draft.checkpoint": str(draft),
                            "outputs.build_dir": "build", "outputs.engines_dir": "engines",
                            "outputs.repository_dir": "triton_repo"}, base_dir=tmp_path)
    result = compiler.run(spec, json_mode=True)
    assert (result.spec.limits.max_seq_len, result.spec.limits.draft_max_seq_len) == (SHORT, 128)
    target_limits = BuildRecord.read(result.engines / "target").limits
    draft_limits = BuildRecord.read(result.engines / "draft").limits
    assert (target_limits.max_input_len, target_limits.max_seq_len) == (SHORT // 2, SHORT)
    assert (draft_limits.max_input_len, draft_limits.max_seq_len) == (127, 128)
    orchestrator = (result.repository / "orchestrator" / "config.pbtxt").read_text()
    assert f'key: "max_seq_len"\n  value {{\n    string_value: "{SHORT}"' in orchestrator
    assert 'key: "draft_max_seq_len"\n  value {\n    string_value: "128"' in orchestrator
    shown = CliRunner().invoke(main, ["check", str(target), str(draft)], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert f"max_seq_len {SHORT} (the target's window), draft_max_seq_len 128 (the draft's)" in text
    assert "warning (draft-window): the draft engine holds 128 positions, the release serves 512" in text
