"""The build spec: defaults, overrides, and errors that name the field and the allowed values."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from specbuild.errors import SpecError
from specbuild.runtimes.registry import resolved
from specbuild.spec import BuildSpec, load_spec
from specbuild.spec_rendering import render_spec, starter_spec
from specbuild.spec_sources import parse_override

MINIMAL = {"target.checkpoint": "t", "draft.checkpoint": "d"}


def test_defaults_work_for_the_demo(tmp_path: Path) -> None:
    spec = load_spec(None, MINIMAL, base_dir=tmp_path)
    assert spec.speculation.num_draft_tokens <= spec.speculation.max_draft_len
    assert spec.triton.host == "127.0.0.1"
    assert spec.security.allow_pickle is False and spec.security.trust_remote_code is False
    assert spec.target.checkpoint == str(tmp_path / "t")
    assert spec.capture.enabled is False  # nothing a user sends is stored unless they turn it on


def test_starter_spec_parses_back_and_keeps_comments(tmp_path: Path) -> None:
    text = starter_spec("models/t", "models/d", runtime="torch")
    assert "# " in text
    path = tmp_path / "specbuild.yaml"
    path.write_text(text)
    spec = load_spec(path)
    assert spec.runtime == "torch"
    assert spec.target.checkpoint == str(tmp_path / "models/t")
    assert spec.outputs.engines_dir == str(tmp_path / "engines")
    assert spec.model_dump(exclude={"target", "draft", "outputs", "runtime", "name"}) == \
        BuildSpec(target={"checkpoint": "t"}, draft={"checkpoint": "d"}).model_dump(
            exclude={"target", "draft", "outputs", "runtime", "name"})


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, int, FieldInfo]]:
    """Every field of ``model`` and its sections: (dotted key, depth, field)."""
    for name, field in model.model_fields.items():
        yield prefix + name, prefix.count("."), field
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _fields(field.annotation, f"{prefix}{name}.")


def test_starter_spec_holds_every_field_under_its_description() -> None:
    """Generated from the model: a field added to BuildSpec appears in `specbuild init`'s file with its comment."""
    text = starter_spec("models/t", "models/d")
    lines = text.splitlines()
    assert BuildSpec.model_validate(yaml.safe_load(text))
    for dotted, _, field in _fields(BuildSpec):
        assert field.description, f"{dotted} has no description for `specbuild init` to write"
        at = 0
        for depth, part in enumerate(dotted.split(".")):  # the key's line, under its sections' lines
            at = next((i for i in range(at, len(lines)) if lines[i].startswith(f"{'  ' * depth}{part}:")), None)
            assert at is not None, f"{dotted} is missing from the starter spec"
        indent = "  " * dotted.count(".")
        comment = []
        for line in reversed(lines[:at]):
            if not line.startswith(f"{indent}# "):
                break
            comment.insert(0, line.removeprefix(f"{indent}# "))
        assert " ".join(comment).startswith(field.description), dotted


def test_rendered_spec_round_trips_any_spec(tmp_path: Path) -> None:
    spec = load_spec(None, {**MINIMAL, "limits.max_seq_len": 4096, "triton.gpu_memory_gib": 80.5,
                            "speculation.prompt_lookup.enabled": True, "name": "x.1"}, base_dir=tmp_path)
    assert BuildSpec.model_validate(yaml.safe_load(render_spec(spec, {"limits": "a note"}))) == spec
    assert "# a note\nlimits:" in render_spec(spec, {"limits": "a note"})


def test_overrides_beat_the_file_and_parse_yaml_values(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"target": {"checkpoint": "a"}, "draft": {"checkpoint": "b"},
                                    "speculation": {"num_draft_tokens": 2}}))
    spec = load_spec(path, dict([parse_override("speculation.num_draft_tokens=5"),
                                 parse_override("speculation.adaptive=true")]))
    assert spec.speculation.num_draft_tokens == 5 and spec.speculation.adaptive is True


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"speculation.acceptanc": "x"}, "speculation.acceptanc: unknown key"),
    ({"speculation.acceptance": "greedy"}, "'token-match' or 'draft-logits'"),
    ({"runtime": "vllm"}, "runtime: Input should be 'torch', 'tensorrt-llm', 'tensorrt-llm-llmapi' or 'auto'"),
    ({"target.tp_size": 0}, "target.tp_size"),
    ({"speculation.num_draft_tokens": 9, "speculation.max_draft_len": 4}, "raise max_draft_len"),
    ({"limits.max_seq_len": 100, "limits.max_input_len": 100}, "must be larger than max_input_len"),
    ({"triton.engine_mount": "engines"}, "triton.engine_mount"),
    ({"triton.engine_mount": "/a/../b"}, "without '..'"),
    ({"name": "bad name!"}, "name"),
    ({"speculation.verification": "tree"}, "'token' or 'block'"),
    ({"speculation.verification": "block", "speculation.acceptance": "token-match"}, "set acceptance: draft-logits"),
    ({"capture.claim_size": "10GB"}, "capture.claim_size: Value error, '10GB' is not a Kubernetes quantity"),
    ({"capture.max_file_mib": 0}, "capture.max_file_mib"),
    ({"capture.retention_days": -1}, "capture.retention_days"),
])
def test_bad_values_name_the_field(overrides: dict, expected: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as error:
        load_spec(None, {**MINIMAL, **overrides}, base_dir=tmp_path)
    assert expected in str(error.value)
    assert error.value.exit_code == 2


def test_missing_checkpoints_are_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="target: required field is missing"):
        load_spec(None, {"draft.checkpoint": "d"}, base_dir=tmp_path)


@pytest.mark.parametrize("content", ["target: [unclosed", "- a list\n- not a mapping\n"])
def test_bad_files_are_reported(content: str, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(content)
    with pytest.raises(SpecError, match="spec.yaml"):
        load_spec(path)


def test_missing_file_and_bad_override(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="specbuild init"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_override("no-equals-sign")


def test_resolved_runtime_without_tensorrt_llm_is_torch(tmp_path: Path) -> None:
    spec = load_spec(None, MINIMAL, base_dir=tmp_path)
    assert spec.runtime == "auto"
    assert resolved(spec).runtime == "torch"
    assert isinstance(BuildSpec.model_validate(yaml.safe_load(spec.to_yaml())), BuildSpec)


def test_prompt_lookup_settings(tmp_path: Path) -> None:
    spec = load_spec(None, MINIMAL, base_dir=tmp_path)
    assert not spec.speculation.prompt_lookup.enabled
    assert (spec.speculation.prompt_lookup.max_ngram, spec.speculation.prompt_lookup.min_ngram) == (4, 2)
    spec = load_spec(None, {**MINIMAL, "speculation.prompt_lookup.enabled": True,
                            "speculation.prompt_lookup.max_ngram": 3}, base_dir=tmp_path)
    assert spec.speculation.prompt_lookup.enabled and spec.speculation.prompt_lookup.max_ngram == 3
    path = tmp_path / "specbuild.yaml"
    path.write_text(starter_spec("t", "d").replace("    enabled: false", "    enabled: true"))
    assert load_spec(path).speculation.prompt_lookup.enabled


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"speculation.prompt_lookup.min_ngram": 5}, "prompt lookup needs max_ngram >= min_ngram >= 1, got max_ngram=4, min_ngram=5"),
    ({"speculation.prompt_lookup.min_ngram": 0}, "speculation.prompt_lookup.min_ngram"),
    ({"speculation.prompt_lookup.max_ngram": 99}, "speculation.prompt_lookup.max_ngram"),
    ({"speculation.prompt_lookup.ngram": 3}, "speculation.prompt_lookup.ngram: unknown key"),
])
def test_bad_prompt_lookup_settings_name_the_field(overrides: dict, expected: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=re.escape(expected)):
        load_spec(None, {**MINIMAL, **overrides}, base_dir=tmp_path)


def test_bad_values_name_where_they_came_from(tmp_path: Path) -> None:
    path = tmp_path / "specbuild.yaml"
    path.write_text(yaml.safe_dump({"target": {"checkpoint": "t"}, "draft": {"checkpoint": "d"},
                                    "limits": {"max_batch_size": 0}}))
    with pytest.raises(SpecError) as error:
        load_spec(path, {"speculation.acceptance": "greedy"},
                  override_sources={"speculation.acceptance": "--set speculation.acceptance=greedy"})
    lines = str(error.value).splitlines()
    assert any(line.startswith("  speculation.acceptance:") and line.endswith("(from --set speculation.acceptance=greedy)")
               for line in lines), lines
    assert any(line.startswith("  limits.max_batch_size:") and line.endswith(f"(from {path})") for line in lines), lines


def test_a_cross_field_error_names_the_file_and_the_override(tmp_path: Path) -> None:
    path = tmp_path / "specbuild.yaml"
    path.write_text(yaml.safe_dump({"target": {"checkpoint": "t"}, "draft": {"checkpoint": "d"},
                                    "speculation": {"max_draft_len": 4}}))
    with pytest.raises(SpecError, match=re.escape(f"(from {path} and override speculation.num_draft_tokens)")):
        load_spec(path, {"speculation.num_draft_tokens": 6})
    with pytest.raises(SpecError) as error:
        load_spec(None, {**MINIMAL, "speculation.num_draft_tokens": 9}, base_dir=tmp_path)
    assert "(from override speculation.num_draft_tokens)" in str(error.value) and "(from None" not in str(error.value)


def test_cli_blames_the_set_flag_not_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from specbuild.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "specbuild.yaml").write_text(starter_spec("t", "d"))
    result = CliRunner().invoke(main, ["compile", "--dry-run", "--set", "limits.max_batch_size=0",
                                       "--num-draft-tokens", "-1"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "limits.max_batch_size: Input should be greater than or equal to 1 (from --set limits.max_batch_size=0)" in text
    assert "(from --num-draft-tokens -1)" in text
    assert "(from specbuild.yaml)" not in text


def test_a_null_override_sets_the_key_to_null(tmp_path: Path) -> None:
    """``--set limits.max_seq_len=null`` resets a value the file set (back to "from the checkpoints"); a null
    where a value is required is refused naming that field, not its section."""
    spec_file = tmp_path / "specbuild.yaml"
    spec_file.write_text("target: {checkpoint: t}\ndraft: {checkpoint: d}\nlimits: {max_seq_len: 512}\n")
    assert load_spec(spec_file).limits.max_seq_len == 512
    _, null = parse_override("limits.max_seq_len=null")
    assert load_spec(spec_file, {"limits.max_seq_len": null}).limits.max_seq_len is None
    with pytest.raises(SpecError, match=r"target\.checkpoint: .*\(from --set target\.checkpoint=~\)"):
        load_spec(spec_file, {"target.checkpoint": None}, override_sources={"target.checkpoint": "--set target.checkpoint=~"})
