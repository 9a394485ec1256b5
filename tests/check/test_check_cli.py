"""``specbuild check TARGET DRAFT``: exit 0 compatible, 1 incompatible (reasons with fixes), 2 usage error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from checkpoint_factory import Checkpoints, copy_checkpoint, edit_json
from click.testing import CliRunner, Result

from specbuild.check.pair_report import check, render_check
from specbuild.check.pair_report import check as check_with
from specbuild.cli import main
from specbuild.spec import BuildSpec, ModelSpec


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["check", *map(str, args)], env={"COLUMNS": "400"})  # long paths unbroken


def flat(text: str) -> str:
    """Rich wraps long messages at the terminal width; compare with whitespace collapsed."""
    return " ".join(text.split())


def assert_no_traceback(result: Result) -> None:
    """The command exited through reports_errors, not through an exception escaping it."""
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


def spec_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_compatible_pair_exits_0_with_tables(checkpoints: Checkpoints, tmp_path: Path) -> None:
    result = run(checkpoints.target, checkpoints.draft, "--spec", spec_file(tmp_path, "runtime: tensorrt-llm\n"))
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "checkpoints" in text and "memory plan (per GPU)" in text and "kv_cache_free_gpu_mem_fraction" in text
    assert "compatible: acceptance draft-logits" in text


def test_a_release_on_the_cpu_gets_a_cpu_memory_plan(checkpoints: Checkpoints, tmp_path: Path) -> None:
    spec = spec_file(tmp_path, "runtime: torch\ntorch: {device: cpu}\n")
    text = flat(run(checkpoints.target, checkpoints.draft, "--spec", spec, "--gpu-memory-gib", "0.5").output)
    assert "memory plan (CPU memory)" in text and "of the CPU's memory" in text
    assert "GPU" not in text.split("memory plan")[1].split("build limits")[0]  # neither in the table nor the caption
    report = json.loads(run(checkpoints.target, checkpoints.draft, "--spec", spec, "--json").stdout)
    assert report["memory_plan"]["device"] == "CPU" and report["memory_plan"]["fits"] is None


def test_the_break_even_uses_the_verification_cost_measured_for_the_spec_s_k(checkpoints: Checkpoints,
                                                                            tmp_path: Path) -> None:
    plain = flat(run(checkpoints.target, checkpoints.draft).output)
    assert "speculation at K=4 breaks even when more than" in plain and "as on a GPU" in plain
    measured = spec_file(tmp_path, "speculation: {num_draft_tokens: 2, verify_cost: {1: 1.05, 2: 1.2}}\n")
    result = run(checkpoints.target, checkpoints.draft, "--spec", measured, "--json")
    break_even = json.loads(result.stdout)["break_even"]
    assert break_even["k"] == 2 and break_even["verify_cost"] == 1.2
    assert break_even["accepted_share"] == pytest.approx(json.loads(result.stdout)["cost_ratio"] + 0.1)
    text = flat(run(checkpoints.target, checkpoints.draft, "--spec", measured).output)
    assert f"speculation at K=2 breaks even when more than {break_even['accepted_share']:.0%} of the drafted " \
           "tokens are accepted (verifying 2 drafted tokens measured at 1.20 target steps)" in text
    costly = spec_file(tmp_path, "speculation: {num_draft_tokens: 1, verify_cost: {1: 2.5}}\n")
    assert "the draft cannot pay: even with every drafted token accepted, K=1 would be slower than the target " \
           "alone" in flat(run(checkpoints.target, checkpoints.draft, "--spec", costly).output)


def test_json_report(checkpoints: Checkpoints) -> None:
    result = run(checkpoints.target, checkpoints.draft, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["compatible"] is True and report["reasons"] == []
    assert report["tokenizer"]["identical"] is True
    assert report["target"]["num_parameters"] == checkpoints.target_parameters
    plan = report["memory_plan"]
    assert 0 < plan["target_kv_fraction"] and 0 < plan["draft_kv_fraction"]
    assert plan["target_kv_fraction"] + plan["draft_kv_fraction"] <= 0.9


def test_different_tokenizers_exit_1_with_the_reason_and_fix(checkpoints: Checkpoints) -> None:
    result = run(checkpoints.target, checkpoints.other_tokenizer)
    assert result.exit_code == 1
    text = flat(result.output)
    assert "target vocab size 400 does not match draft vocab size 350" in text
    assert "fix: use a draft that shares the target's tokenizer" in text
    assert_no_traceback(result)


def test_json_of_an_incompatible_pair_lists_reasons(checkpoints: Checkpoints) -> None:
    result = run(checkpoints.target, checkpoints.other_tokenizer, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["compatible"] is False and report["tokenizer"]["identical"] is False
    assert all(reason["fix"] for reason in report["reasons"])


def test_padded_draft_passes_with_token_match_from_a_spec(checkpoints: Checkpoints, tmp_path: Path) -> None:
    refused = run(checkpoints.target, checkpoints.padded_draft)
    assert refused.exit_code == 1 and "use acceptance token-match" in flat(refused.output)
    spec = tmp_path / "specbuild.yaml"
    spec.write_text("target: {checkpoint: x}\ndraft: {checkpoint: y}\nspeculation: {acceptance: token-match}\n")
    accepted = run(checkpoints.target, checkpoints.padded_draft, "--spec", spec)
    assert accepted.exit_code == 0, accepted.output
    assert "warning (logits-width)" in flat(accepted.output)


def test_memory_that_cannot_fit_exits_1(checkpoints: Checkpoints) -> None:
    result = run(checkpoints.target, checkpoints.draft, "--gpu-memory-gib", "0.5")
    assert result.exit_code == 1 and "incompatible (memory)" in flat(result.output)
    assert run(checkpoints.target, checkpoints.draft, "--gpu-memory-gib", "8").exit_code == 0


@pytest.mark.parametrize("args", [("nowhere", None), (None, "nowhere")])
def test_missing_folder_is_a_usage_error(checkpoints: Checkpoints, tmp_path: Path, args) -> None:
    target, draft = (tmp_path / a if a else p for a, p in zip(args, (checkpoints.target, checkpoints.draft)))
    result = run(target, draft)
    assert result.exit_code == 2 and "does not exist" in flat(result.output)


def test_bad_spec_file_is_a_usage_error(checkpoints: Checkpoints, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("target: {checkpoint: x}\ndraft: {checkpoint: y}\nspeculation: {acceptance: guess}\n")
    result = run(checkpoints.target, checkpoints.draft, "--spec", spec)
    assert result.exit_code == 2 and "speculation.acceptance" in flat(result.output)


def test_pickle_only_needs_allow_pickle(checkpoints: Checkpoints) -> None:
    refused = run(checkpoints.target, checkpoints.pickle_only)
    assert refused.exit_code == 1 and "--allow-pickle" in flat(refused.output)
    assert_no_traceback(refused)
    assert run(checkpoints.target, checkpoints.pickle_only, "--allow-pickle").exit_code == 0


def test_remote_code_needs_trust(checkpoints: Checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints.draft, tmp_path / "remote")
    edit_json(folder / "config.json", auto_map={"AutoModelForCausalLM": "modeling_x.X"})
    refused = run(checkpoints.target, folder)
    assert refused.exit_code == 1 and "--trust-remote-code" in flat(refused.output)
    assert run(checkpoints.target, folder, "--trust-remote-code").exit_code == 0


def test_corrupt_weights_name_the_file_without_traceback(checkpoints: Checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints.draft, tmp_path / "corrupt")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    result = run(checkpoints.target, folder)
    assert result.exit_code == 1 and "model.safetensors" in flat(result.output) and "truncated" in result.output
    assert_no_traceback(result)


def test_render_check_escapes_markup(checkpoints: Checkpoints) -> None:
    """Token strings and paths go through rich: brackets in them must print literally."""
    from rich.console import Console

    report = check(checkpoints.target, checkpoints.draft)
    odd = report.model_copy(update={"target": report.target.model_copy(update={"path": "/models/[bold]x"})})
    console = Console(record=True, width=200)
    render_check(odd, console)
    assert "/models/[bold]x" in console.export_text()


def test_memory_plan_caption_reads_as_sentences(checkpoints: Checkpoints, tmp_path: Path) -> None:
    from specbuild.check.pair_report import memory_caption

    gpu = BuildSpec(runtime="tensorrt-llm", target=ModelSpec(checkpoint=str(checkpoints.target)),
                    draft=ModelSpec(checkpoint=str(checkpoints.draft)))

    def check(target: Path, draft: Path, gpu_memory_gib: float | None = None) -> Any:
        return check_with(target, draft, gpu, gpu_memory_gib=gpu_memory_gib)

    unchecked = check(checkpoints.target, checkpoints.draft).memory
    caption = memory_caption(unchecked)
    assert caption.startswith(f"target and draft need {unchecked.needed_gib:.1f} GiB on 1 GPU (weights, activations")
    assert "smallest GPU that holds it:" in caption and "GPU(s)" not in caption
    assert caption.endswith("not checked against a GPU: pass --gpu-memory-gib (or set triton.gpu_memory_gib)")
    assert memory_caption(check(checkpoints.target, checkpoints.draft, gpu_memory_gib=80).memory).endswith(
        "fits a 80 GiB GPU")
    assert memory_caption(check(checkpoints.target, checkpoints.draft, gpu_memory_gib=0.5).memory).endswith(
        "does NOT fit a 0.5 GiB GPU")
    spec = spec_file(tmp_path, "runtime: tensorrt-llm\n")
    assert "smallest GPU that holds it" in flat(run(checkpoints.target, checkpoints.draft, "--spec", spec).output)
