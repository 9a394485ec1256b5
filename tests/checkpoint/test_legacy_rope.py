"""RoPE as both transformers lines read it: 5.x saves it only in ``rope_parameters``, 4.57 (the NGC image's) reads
only the top-level ``rope_theta``/``rope_scaling``. specbuild's own checkpoints and the copies it ships carry both;
check refuses a checkpoint the image would read as it is without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_factory import Checkpoints, copy_checkpoint, pair_spec, strip_legacy_rope

from specbuild.check.compatibility import PairParams, check_pair
from specbuild.checkpoint.info import read_checkpoint
from specbuild.checkpoint.rope import legacy_rope_keys, write_legacy_rope
from specbuild.runtimes.names import TENSORRT_LLM, TENSORRT_LLM_LLMAPI, TORCH

SCALED = {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0}


def test_a_transformers_5_config_gets_the_keys_4_57_reads_and_5_reads_the_same_rope(tmp_path: Path) -> None:
    from transformers import AutoConfig, LlamaConfig

    LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters=dict(SCALED)).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_theta" not in saved and "rope_scaling" not in saved  # what 5.x writes: the bug's cause
    assert write_legacy_rope(tmp_path) == {"rope_theta": 50000.0, "rope_scaling": {"rope_type": "linear",
                                                                                   "factor": 2.0}}
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters == SCALED  # 5.x: unchanged by the legacy keys
    assert legacy_rope_keys(json.loads((tmp_path / "config.json").read_text())) == {}  # nothing left to add


def test_a_default_rope_needs_only_its_theta_and_a_4_x_config_nothing() -> None:
    assert legacy_rope_keys({"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}) == {
        "rope_theta": 100000.0}
    assert legacy_rope_keys({"rope_theta": 500000.0, "rope_scaling": None}) == {}


@pytest.mark.parametrize("runtime", [TENSORRT_LLM_LLMAPI, TENSORRT_LLM])
def test_a_runtime_whose_image_reads_the_folder_refuses_rope_only_in_rope_parameters(
        checkpoints: Checkpoints, tmp_path: Path, runtime: str) -> None:
    target = read_checkpoint(strip_legacy_rope(copy_checkpoint(checkpoints.target, tmp_path / "target")))
    assert target.legacy_rope_missing == {"rope_theta": 10000.0}
    report = check_pair(target, read_checkpoint(checkpoints.draft), PairParams(runtime=runtime))
    [reason] = [r for r in report.reasons if r.code == "target-rope-keys"]
    assert "rope_parameters" in reason.message and "4.57" in reason.message
    assert '"rope_theta": 10000.0' in reason.fix and "--runtime torch" in reason.fix
    assert check_pair(target, read_checkpoint(checkpoints.draft), PairParams(runtime=TORCH)).compatible


def test_the_torch_runtime_ships_its_converted_copy_with_the_legacy_keys(checkpoints: Checkpoints,
                                                                          tmp_path: Path) -> None:
    from specbuild.runtimes.torch.runtime import convert

    draft = strip_legacy_rope(copy_checkpoint(checkpoints.draft, tmp_path / "draft"))
    convert(pair_spec(tmp_path, checkpoints.target, draft), "draft", tmp_path / "converted")
    config = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 10000.0
