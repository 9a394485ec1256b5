"""The rule tables of the TensorRT-LLM lines (runtimes/tensorrt_llm_llmapi/lines.py): one test per rule showing the
stand-in's reading of a model.yaml refusing what that line's parser refuses, the renderer writing what each line
accepts, K=0 rendering no speculative_config, and the load policy reaching the release as max_concurrency (a single
cutoff) or as each line's draft_len_schedule."""

from __future__ import annotations

import pytest
import yaml

from specbuild.errors import SpecbuildError
from specbuild.runtimes.registry import runtime_for
from specbuild.runtimes.tensorrt_llm_llmapi import model_yaml as config
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES, load_keys
from specbuild.speculation.schedule import DraftLenSchedule
from specbuild.runtimes.tensorrt_llm_llmapi.repository import model_yaml, model_yaml_text
from llmapi_golden import BUSY, CONTEXT, TARGET, golden_spec

GOOD = {"max_draft_len": 4, "speculative_model": "/checkpoints/draft"}


def rendered(line: str, **speculation: object) -> dict:
    spec = golden_spec(tensorrt_llm=line)
    spec = spec.model_copy(update={"speculation": spec.speculation.model_copy(update=speculation)})
    return yaml.safe_load(model_yaml_text(spec, TARGET, CONTEXT, BUSY))


def refused(line: str, speculative: dict, rule: str) -> str:
    """The stand-in's reading of the rendered model.yaml with ``speculative`` in place of its own section."""
    text = yaml.safe_dump({**rendered(line), "speculative_config": speculative})
    with pytest.raises(SpecbuildError) as error:
        config.parse(config.ModelYaml, text, "model.yaml", LINES[line])
    assert f"[{rule}: " in error.value.message, error.value.message
    assert "package the release again" in error.value.fix
    return error.value.message


# --- the 1.2 line (TensorRT-LLM 1.2.1) ------------------------------------------------------------------
def test_1_2_refuses_the_main_spelling_of_draft_target() -> None:
    message = refused("1.2", {"decoding_type": "Draft_Target", **GOOD}, "decoding-type")
    assert "'Draft_Target' is not 'DraftTarget'" in message and "DecodingBaseConfig.from_dict" in message


def test_1_2_refuses_a_field_its_decoding_base_config_does_not_declare() -> None:
    # acceptance_rate_threshold is main's name; 1.2.1 calls it acceptance_length_threshold
    refused("1.2", {"decoding_type": "DraftTarget", **GOOD, "acceptance_rate_threshold": 0.5}, "known-fields")


def test_1_2_refuses_a_draft_length_of_zero() -> None:
    refused("1.2", {"decoding_type": "DraftTarget", **GOOD, "max_draft_len": 0}, "max-draft-len")


def test_1_2_refuses_a_missing_draft_model() -> None:
    refused("1.2", {"decoding_type": "DraftTarget", "max_draft_len": 4}, "speculative-model")


def test_1_2_refuses_a_max_concurrency_that_is_not_an_integer() -> None:
    refused("1.2", {"decoding_type": "DraftTarget", **GOOD, "max_concurrency": "8"}, "max-concurrency")


def test_1_2_takes_the_draft_under_its_alias_and_a_cutoff_of_zero() -> None:
    alias = {"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_model_dir": "/d", "max_concurrency": 0}
    assert LINES["1.2"].refusals(alias) == []


# --- the main line -----------------------------------------------------------------------------------------
def test_main_refuses_the_1_2_spelling_of_draft_target() -> None:
    message = refused("main", {"decoding_type": "DraftTarget", **GOOD}, "decoding-type")
    assert "0004396720054fd8e205cbf616f21f0b57c6b412" in message


def test_main_refuses_a_field_its_decoding_base_config_does_not_declare() -> None:
    refused("main", {"decoding_type": "Draft_Target", **GOOD, "acceptance_window": 8}, "known-fields")


def test_main_refuses_a_draft_length_of_zero() -> None:
    refused("main", {"decoding_type": "Draft_Target", **GOOD, "max_draft_len": 0}, "max-draft-len")


def test_main_refuses_a_missing_draft_model() -> None:
    refused("main", {"decoding_type": "Draft_Target", "max_draft_len": 4}, "speculative-model")


def test_main_refuses_a_cutoff_of_zero() -> None:
    refused("main", {"decoding_type": "Draft_Target", **GOOD, "max_concurrency": 0}, "max-concurrency")


def test_main_refuses_a_cutoff_beside_a_draft_length_schedule() -> None:
    refused("main", {"decoding_type": "Draft_Target", **GOOD, "max_concurrency": 4, "draft_len_schedule": {1: 4}},
            "max-concurrency-or-schedule")


def test_every_rule_names_its_upstream_file_and_revision() -> None:
    for line in LINES.values():
        assert {rule.name for rule in line.rules} >= {"decoding-type", "known-fields", "max-draft-len",
                                                       "speculative-model", "max-concurrency"}
        for rule in line.rules:
            assert rule.source.startswith("tensorrt_llm/llmapi/llm_args.py") and (
                "release/1.2" in rule.source or "@ 0004396" in rule.source), rule


# --- what the renderer writes ---------------------------------------------------------------------------
@pytest.mark.parametrize("line", sorted(LINES))
def test_each_line_loads_what_the_renderer_writes(line: str) -> None:
    text = model_yaml_text(golden_spec(tensorrt_llm=line), TARGET, CONTEXT, BUSY)
    parsed = config.parse(config.ModelYaml, text, "model.yaml", LINES[line])
    assert parsed.speculative_config.decoding_type == LINES[line].decoding_type
    other = next(name for name in LINES if name != line)
    with pytest.raises(SpecbuildError, match="decoding-type"):  # and the other line would not
        config.parse(config.ModelYaml, text, "model.yaml", LINES[other])


@pytest.mark.parametrize("line", sorted(LINES))
def test_k_0_renders_no_speculative_config(line: str) -> None:
    data = rendered(line, num_draft_tokens=0)
    assert "speculative_config" not in data
    parsed = config.parse(config.ModelYaml, yaml.safe_dump(data), "model.yaml", LINES[line])
    assert parsed.speculative_config is None


@pytest.mark.parametrize(("busy", "cutoff"), [(16, 15), (2, 1), (1, 0), (0, None)])
def test_the_load_policy_becomes_max_concurrency(busy: int, cutoff: int | None) -> None:
    # specbuild drafts nothing from `busy` requests in flight; TensorRT-LLM speculates while its batch holds at
    # most max_concurrency requests: batches of busy - 1 still speculate, batches of busy do not
    keys = load_keys(DraftLenSchedule.from_threshold(busy), 4, 8, LINES["1.2"])
    assert keys == ({} if cutoff is None else {"max_concurrency": cutoff})
    spec = golden_spec(tensorrt_llm="1.2")
    spec = spec.model_copy(update={"speculation": spec.speculation.model_copy(update={"busy_in_flight": busy})})
    rendered_config = model_yaml(spec, TARGET, CONTEXT, runtime_for(spec.runtime).load_policy(spec))
    assert rendered_config.speculative_config.max_concurrency == cutoff


def test_the_runtime_s_default_load_policy_reaches_the_release() -> None:
    spec = golden_spec()
    runtime = runtime_for(spec.runtime)
    assert spec.speculation.busy_in_flight is None
    busy, default = runtime.load_policy(spec), runtime.settings.load_default.in_flight
    assert busy == DraftLenSchedule.from_threshold(default)
    assert model_yaml(spec, TARGET, CONTEXT, busy).speculative_config.max_concurrency == default - 1


def test_a_cutoff_main_refuses_is_a_spec_finding_naming_the_fix() -> None:
    spec = golden_spec(tensorrt_llm="main")
    spec = spec.model_copy(update={"speculation": spec.speculation.model_copy(update={"busy_in_flight": 1})})
    [finding] = [f for f in runtime_for(spec.runtime).spec_findings(spec) if f.code == "load-policy"]
    assert finding.blocking and "max_concurrency 0" in finding.message and "busy_in_flight to 2" in finding.fix
    assert not [f for f in runtime_for(spec.runtime).spec_findings(golden_spec(tensorrt_llm="1.2"))
                if f.code == "load-policy"]


# --- K per load as draft_len_schedule --------------------------------------------------------------------
SCHEDULE = DraftLenSchedule.from_mapping({1: 4, 3: 2, 6: 0})  # K=4 for 1-2 in flight, 2 for 3-5, none from 6


@pytest.mark.parametrize(("line", "expected"), [
    ("1.2", {1: 4, 3: 2, 6: 0}),  # a key is where its K starts (largest key <= the batch size)
    ("main", {2: 4, 5: 2}),  # a key is where its K ends (first key >= the batch size; 0 above the last)
])
def test_a_schedule_renders_as_each_line_reads_it(line: str, expected: dict[int, int]) -> None:
    spec = golden_spec(tensorrt_llm=line)
    spec = spec.model_copy(update={"speculation": spec.speculation.model_copy(
        update={"num_draft_tokens": 4, "draft_len_schedule": SCHEDULE.as_mapping()})})
    schedule = runtime_for(spec.runtime).load_policy(spec)
    text = model_yaml_text(spec, TARGET, CONTEXT, schedule)
    assert yaml.safe_load(text)["speculative_config"]["draft_len_schedule"] == expected  # integer keys, as written
    parsed = config.parse(config.ModelYaml, text, "model.yaml", LINES[line])
    assert parsed.speculative_config.draft_len_schedule == expected
    assert parsed.speculative_config.max_concurrency is None  # main refuses both together
    assert not [f for f in runtime_for(spec.runtime).spec_findings(spec) if f.code == "load-policy"]


def test_a_schedule_that_never_reaches_zero_covers_the_whole_batch_on_main() -> None:
    schedule = DraftLenSchedule.from_mapping({1: 4, 3: 1})
    assert load_keys(schedule, 4, 8, LINES["main"]) == {"draft_len_schedule": {2: 4, 8: 1}}
    assert load_keys(schedule, 4, 8, LINES["1.2"]) == {"draft_len_schedule": {1: 4, 3: 1}}
    assert load_keys(schedule, 1, 8, LINES["main"]) == {}  # a release drafting 1 is never lowered


@pytest.mark.parametrize("line", sorted(LINES))
def test_a_schedule_starting_below_the_release_k_is_a_spec_finding_naming_the_fix(line: str) -> None:
    spec = golden_spec(tensorrt_llm=line)
    spec = spec.model_copy(update={"speculation": spec.speculation.model_copy(
        update={"num_draft_tokens": 4, "draft_len_schedule": {1: 2, 4: 0}})})
    [finding] = [f for f in runtime_for(spec.runtime).spec_findings(spec) if f.code == "load-policy"]
    assert finding.blocking and "K=2 at one request in flight" in finding.message
    assert "num_draft_tokens to 2" in finding.fix


def test_1_2_refuses_a_schedule_without_batch_size_1() -> None:
    refused("1.2", {"decoding_type": "DraftTarget", **GOOD, "draft_len_schedule": {2: 4, 8: 0}}, "draft-len-schedule")


@pytest.mark.parametrize("line", sorted(LINES))
def test_each_line_refuses_a_schedule_whose_smallest_key_is_not_max_draft_len(line: str) -> None:
    decoding = LINES[line].decoding_type
    message = refused(line, {"decoding_type": decoding, **GOOD, "draft_len_schedule": {1: 2, 8: 0}},
                      "draft-len-schedule")
    assert "draft_len_schedule[1] (2) must equal max_draft_len (4)" in message
    refused(line, {"decoding_type": decoding, **GOOD, "draft_len_schedule": {1: 4, 8: 6}}, "draft-len-schedule")


def test_main_takes_a_schedule_without_batch_size_1() -> None:
    text = yaml.safe_dump({**rendered("main"), "speculative_config": {
        "decoding_type": "Draft_Target", **GOOD, "draft_len_schedule": {2: 4, 8: 1}}})
    assert config.parse(config.ModelYaml, text, "model.yaml", LINES["main"]).speculative_config.draft_len_schedule \
        == {2: 4, 8: 1}
