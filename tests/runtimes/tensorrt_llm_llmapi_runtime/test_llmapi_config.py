"""``model.yaml`` and the ``trtllm-serve`` YAML of a tensorrt-llm-llmapi release: typed, checked against the
upstream argument names, round-tripped, and pinned by golden files (``tests/data/llmapi/``)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from specbuild.errors import SpecbuildError
from specbuild.runtimes.tensorrt_llm_llmapi import model_yaml as config
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES
from specbuild.runtimes.tensorrt_llm_llmapi.repository import model_yaml, model_yaml_text, serve_config, serve_config_text
from locations import DATA
from llmapi_golden import BUSY, CONTEXT, TARGET, golden_spec

GOLDEN = DATA / "llmapi"


@pytest.mark.parametrize(("model", "upstream"), [
    (config.LLMArgs, "LLMArgs"), (config.ServeConfig, "LLMArgs"), (config.KvCacheConfig, "KvCacheConfig"),
    (config.DraftTargetConfig, "DraftTargetConfig"), (config.TritonConfig, "TritonConfig"),
])
def test_every_key_is_an_upstream_argument(model: type[BaseModel], upstream: str) -> None:
    assert set(model.model_fields) == set(config.UPSTREAM_FIELDS[upstream])


def test_model_yaml_adds_only_the_triton_models_own_section() -> None:
    assert set(config.ModelYaml.model_fields) - set(config.LLMArgs.model_fields) == {"triton_config"}


def test_unknown_and_misspelled_keys_cannot_be_written_or_read() -> None:
    good = yaml.safe_load(config.to_yaml(model_yaml(golden_spec(), TARGET, CONTEXT, BUSY)))
    for damage in ({"max_seq_length": 4096}, {"kv_cache_config": {**good["kv_cache_config"], "fraction": 0.5}},
                   {"speculative_config": {**good["speculative_config"], "speculative_model_path": "/x"}}):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            config.ModelYaml.model_validate({**good, **damage})
    with pytest.raises(SpecbuildError, match="not a valid ModelYaml") as refused:
        config.parse(config.ModelYaml, yaml.safe_dump({**good, "max_seq_length": 1}), "model.yaml", LINES["1.2"])
    assert "package the release again" in refused.value.fix


@pytest.mark.parametrize(("kind", "name", "render", "text"), [
    (config.ModelYaml, "model.yaml", model_yaml, model_yaml_text),
    (config.ServeConfig, "trtllm-serve.yaml", serve_config, serve_config_text)])
def test_both_files_round_trip_and_match_their_golden(kind: type[config.LLMArgs], name: str, render, text) -> None:
    typed = render(golden_spec(), TARGET, CONTEXT, BUSY)
    written = text(golden_spec(), TARGET, CONTEXT, BUSY)
    assert config.parse(kind, written, name, LINES["1.2"]) == typed
    assert written == (GOLDEN / name).read_text(), f"regenerate tests/data/llmapi/{name} if the change is intended"


def test_golden_values_come_from_the_spec_and_the_memory_plan() -> None:
    typed = model_yaml(golden_spec(), TARGET, CONTEXT, BUSY)
    assert (typed.model, typed.speculative_config.speculative_model) == ("/checkpoints/target", "/checkpoints/draft")
    assert (typed.tensor_parallel_size, typed.pipeline_parallel_size, typed.dtype) == (4, 1, "bfloat16")
    assert (typed.max_batch_size, typed.max_input_len, typed.max_seq_len) == (16, 3072, 4096)
    # one KV configuration for both models: the two shares of the plan, and the tokens each holds
    assert typed.kv_cache_config == config.KvCacheConfig(free_gpu_memory_fraction=0.8999, max_tokens=65664)
    assert typed.speculative_config.max_draft_len == 5
    assert typed.speculative_config.max_concurrency == 15  # the load policy, as TensorRT-LLM's cutoff
    assert typed.triton_config == config.TritonConfig(max_batch_size=0, decoupled=True)
    spec_total = model_yaml(golden_spec(kv_cache_free_gpu_mem_fraction=0.7), TARGET, CONTEXT, BUSY)
    assert spec_total.kv_cache_config.free_gpu_memory_fraction == 0.7


def test_the_mount_point_is_the_specs() -> None:
    typed = model_yaml(golden_spec(checkpoint_mount="/mnt/models/"), TARGET, CONTEXT, BUSY)
    assert (typed.model, typed.speculative_config.speculative_model) == ("/mnt/models/target", "/mnt/models/draft")


@pytest.mark.parametrize("line", sorted(LINES))
def test_the_line_switch_sets_the_decoding_type(line: str) -> None:
    typed = model_yaml(golden_spec(tensorrt_llm=line), TARGET, CONTEXT, BUSY)
    assert typed.speculative_config.decoding_type == LINES[line].decoding_type


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="free_gpu_memory_fraction"):
        config.KvCacheConfig(free_gpu_memory_fraction=1.2, max_tokens=10)
    with pytest.raises(ValidationError, match="max_draft_len"):
        config.DraftTargetConfig(decoding_type="DraftTarget", max_draft_len=0, speculative_model="/d")
    with pytest.raises(ValidationError, match="dtype"):
        config.LLMArgs.model_validate({**config.ServeConfig.model_validate(yaml.safe_load(
            (GOLDEN / "trtllm-serve.yaml").read_text())).model_dump(), "dtype": "float32"})
