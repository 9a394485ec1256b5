"""The build spec: defaults, overrides, and errors that name the field and the allowed values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specbuild.errors import SpecError
from specbuild.spec import BuildSpec, load_spec, parse_override, starter_spec

MINIMAL = {"target.checkpoint": "t", "draft.checkpoint": "d"}


def test_defaults_work_for_the_demo(tmp_path: Path) -> None:
    spec = load_spec(None, MINIMAL, base_dir=tmp_path)
    assert spec.speculation.num_draft_tokens <= spec.speculation.max_draft_len
    assert spec.triton.host == "127.0.0.1"
    assert spec.security.allow_pickle is False and spec.security.trust_remote_code is False
    assert spec.target.checkpoint == str(tmp_path / "t")


def test_starter_spec_parses_back_and_keeps_comments(tmp_path: Path) -> None:
    text = starter_spec("models/t", "models/d", runtime="torch")
    assert "# " in text
    path = tmp_path / "specbuild.yaml"
    path.write_text(text)
    spec = load_spec(path)
    assert spec.runtime == "torch"
    assert spec.target.checkpoint == str(tmp_path / "models/t")
    assert spec.outputs.engines_dir == str(tmp_path / "engines")


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
    ({"runtime": "vllm"}, "runtime: Input should be 'torch', 'tensorrt-llm' or 'auto'"),
    ({"target.tp_size": 0}, "target.tp_size"),
    ({"speculation.num_draft_tokens": 9, "speculation.max_draft_len": 4}, "raise max_draft_len"),
    ({"limits.max_seq_len": 100, "limits.max_input_len": 100}, "must be larger than max_input_len"),
    ({"triton.engine_mount": "engines"}, "triton.engine_mount"),
    ({"triton.engine_mount": "/a/../b"}, "without '..'"),
    ({"name": "bad name!"}, "name"),
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
    assert spec.resolved().runtime == "torch"
    assert isinstance(BuildSpec.model_validate(yaml.safe_load(spec.to_yaml())), BuildSpec)


def test_prompt_lookup_settings(tmp_path: Path) -> None:
    spec = load_spec(None, MINIMAL, base_dir=tmp_path)
    assert not spec.speculation.prompt_lookup.enabled
    assert (spec.speculation.prompt_lookup.max_ngram, spec.speculation.prompt_lookup.min_ngram) == (4, 2)
    spec = load_spec(None, {**MINIMAL, "speculation.prompt_lookup.enabled": True,
                            "speculation.prompt_lookup.max_ngram": 3}, base_dir=tmp_path)
    assert spec.speculation.prompt_lookup.enabled and spec.speculation.prompt_lookup.max_ngram == 3
    path = tmp_path / "specbuild.yaml"
    path.write_text(starter_spec().replace("    enabled: false", "    enabled: true"))
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
