"""specbuild draft: a distilled draft for a target (specbuild.drafts.distill, the CLI command; prompts: test_prompts).

The command runs on the tiny pair with a handful of prompts and steps: fast, and real (no mocks).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.drafts.distill import SUMMARY_FILE, TRAIN_FILE, compute_dtype, resolve_device, state_dir
from specbuild.drafts.distill_options import DraftOptions
from specbuild.drafts.distill_data import DATA_FILE, label
from specbuild.drafts.distill_training import Trainer, learning_rate, spread_layers, student_from_target
from specbuild.errors import UsageError

SMALL = ["--prompts", "6", "--held-out", "2", "--max-new-tokens", "8", "--minutes", "5"]


def run_draft(target: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["draft", str(target), str(out), *SMALL, *extra, "--json"])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def first_run(tiny_pair, tmp_path_factory):
    """The command run once on the tiny target for 2 steps; returns (out folder, summary)."""
    out = tmp_path_factory.mktemp("draft") / "draft"
    code, output = run_draft(tiny_pair.target_dir, out, "--steps", "2")
    assert code == 0, output
    return out, json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))


def test_draft_writes_a_loadable_checkpoint_with_the_targets_tokenizer(tiny_pair, first_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, summary = first_run
    draft = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    target = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True)
    assert draft.config.vocab_size == target.config.vocab_size
    text = "def main():\n    return 42  # ünïcode"
    assert (AutoTokenizer.from_pretrained(out)(text)["input_ids"]
            == AutoTokenizer.from_pretrained(tiny_pair.target_dir)(text)["input_ids"])
    assert summary["steps_done"] == 2 and summary["resumed_from_step"] == 0
    assert set(summary["held_out_acceptance"]) == {"1", "2", "3", "4"}
    assert all(0 <= rate <= 1 for rate in summary["held_out_acceptance"].values())
    assert summary["best_k"] in (1, 2, 3, 4) and summary["draft_step_ms"] > 0
    assert not list(out.glob("*.pt")) and (state_dir(out) / TRAIN_FILE).is_file()  # state stays outside OUT


def test_specbuild_check_accepts_the_draft(tiny_pair, first_run):
    out, _ = first_run
    result = CliRunner().invoke(main, ["check", str(tiny_pair.target_dir), str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["compatible"] is True


def test_resume_continues_from_the_saved_step_and_reuses_the_data(tiny_pair, first_run, tmp_path):
    out, _ = first_run
    copy = tmp_path / "draft"
    shutil.copytree(out, copy)
    shutil.copytree(state_dir(out), state_dir(copy))
    data_before = (state_dir(copy) / DATA_FILE).read_bytes()
    code, output = run_draft(tiny_pair.target_dir, copy, "--steps", "4", "--resume")
    assert code == 0, output
    summary = json.loads((copy / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert summary["resumed_from_step"] == 2 and summary["steps_done"] == 4
    assert (state_dir(copy) / DATA_FILE).read_bytes() == data_before


def test_an_earlier_run_is_never_overwritten_without_resume(tiny_pair, first_run):
    out, _ = first_run
    code, output = run_draft(tiny_pair.target_dir, out, "--steps", "2")
    assert code == 2 and "--resume" in output and "Traceback" not in output


def test_resume_refuses_changed_settings(tiny_pair, first_run):
    out, _ = first_run
    code, output = run_draft(tiny_pair.target_dir, out, "--steps", "2", "--layers", "1", "--resume")
    assert code == 2 and "layers" in output


def test_a_folder_that_is_not_a_checkpoint_is_a_clear_error(tmp_path):
    code, output = run_draft(tmp_path, tmp_path / "out")
    assert code == 1 and "config.json" in output and "Traceback" not in output


def test_spread_layers():
    assert spread_layers(1, 30) == [0]
    assert spread_layers(2, 30) == [0, 29]
    assert spread_layers(4, 30) == [0, 10, 19, 29]
    with pytest.raises(UsageError):
        spread_layers(31, 30)


@pytest.fixture(scope="module")
def tiny_target(tiny_pair):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True).eval()


def test_a_full_depth_copy_is_the_target(tiny_target):
    import torch

    depth = tiny_target.config.num_hidden_layers
    student, copied = student_from_target(tiny_target, depth)
    assert copied == list(range(depth))
    ids = torch.randint(0, tiny_target.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(student.eval()(input_ids=ids).logits, tiny_target(input_ids=ids).logits)


def test_a_narrower_draft_keeps_the_vocabulary_and_checks_its_width(tiny_target):
    head_dim = tiny_target.config.head_dim
    student, copied = student_from_target(tiny_target, 1, hidden=2 * head_dim)
    assert copied == [] and student.config.hidden_size == 2 * head_dim
    assert student.lm_head.weight.shape == (tiny_target.config.vocab_size, 2 * head_dim)
    with pytest.raises(UsageError, match="multiple"):
        student_from_target(tiny_target, 1, hidden=head_dim + 1)


def test_batched_labels_equal_one_sequence_at_a_time(tiny_target):
    """Right padding in a batch must not change any real position's labels (causal attention)."""
    import torch

    generator = torch.Generator().manual_seed(1)
    vocab = tiny_target.config.vocab_size
    sequences = [(torch.randint(0, vocab, (length,), generator=generator).tolist(), 2) for length in (5, 17, 9, 12)]
    batched = label(tiny_target, sequences, top_k=4, progress=None)
    for index, (sequence, _) in enumerate(sequences):
        one = label(tiny_target, [(sequence, 2)], top_k=4, progress=None)
        start, end = int(batched.offsets[index]), int(batched.offsets[index + 1])
        torch.testing.assert_close(batched.top_logp[start:end], one.top_logp, atol=1e-4, rtol=1e-4)
        assert torch.equal(batched.top_ids[start:end, 0], one.top_ids[:, 0])
        torch.testing.assert_close(batched.hidden[start:end].float(), one.hidden.float(), atol=2e-3, rtol=2e-3)


def test_the_reference_recipe_runs_on_the_tiny_pair(tiny_pair, tmp_path):
    """Greedy and sampled answers, and a joint teacher: no stored labels, the target runs in each step."""
    from safetensors import safe_open

    out = tmp_path / "draft"
    code, output = run_draft(tiny_pair.target_dir, out, "--steps", "2", "--answers", "greedy+sampled",
                             "--teacher", "joint", "--device", "cpu", "--generate-batch", "4", "--batch-tokens", "256")
    assert code == 0, output
    summary = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert summary["device"] == "cpu" and summary["steps_done"] == 2
    assert summary["data"]["greedy_answers"] == 6 and summary["data"]["sampled_answers"] == 4  # held-out: none
    assert summary["data"]["sequences"] == 10
    with safe_open(str(state_dir(out) / DATA_FILE), "pt") as stored:
        assert set(stored.keys()) == {"ids", "offsets", "prompt_lens"}
    assert all(0 <= rate <= 1 for rate in summary["held_out_acceptance"].values())


def test_joint_teacher_loss_is_zero_for_a_copy_of_the_target(tiny_target):
    """KL(target || draft) over the full vocabulary and the hidden-state term both vanish when the draft is
    the target, and are positive for a shallower draft."""
    import torch

    generator = torch.Generator().manual_seed(2)
    vocab = tiny_target.config.vocab_size
    sequences = [(torch.randint(0, vocab, (length,), generator=generator).tolist(), 3) for length in (9, 14)]
    data = label(tiny_target, sequences, None, progress=None)
    assert data.top_ids is None and data.figures["sequences"] == 2
    options = DraftOptions(held_out=1, teacher="joint")
    rows = data.rows(range(2))
    copy, _ = student_from_target(tiny_target, tiny_target.config.num_hidden_layers)
    same = Trainer(copy.eval(), data, options, frozen_head=True, dtype=torch.float32, teacher=tiny_target)
    with torch.no_grad():
        assert same.loss(rows).item() == pytest.approx(0.0, abs=1e-5)
        shallow, _ = student_from_target(tiny_target, 1)
        other = Trainer(shallow.eval(), data, options, frozen_head=True, dtype=torch.float32, teacher=tiny_target)
        assert other.loss(rows).item() > 1e-3


def test_cuda_without_a_gpu_is_a_clear_error(tiny_pair, tmp_path):
    import torch

    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
        return
    assert resolve_device("auto").type == "cpu"
    code, output = run_draft(tiny_pair.target_dir, tmp_path / "draft", "--device", "cuda")
    assert code == 2 and "no CUDA GPU" in output and "Traceback" not in output


def test_precision_choices():
    import torch

    assert compute_dtype("float32") is torch.float32 and compute_dtype("bfloat16") is torch.bfloat16
    assert compute_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(UsageError, match="precision"):
        DraftOptions(precision="fp8").validate()
    for bad, word in ((DraftOptions(device="tpu"), "device"), (DraftOptions(teacher="soft"), "teacher"),
                      (DraftOptions(answers="sampled"), "answers")):
        with pytest.raises(UsageError, match=word):
            bad.validate()


def test_learning_rate_warms_up_then_decays():
    rates = [learning_rate(step, 100, 1.0) for step in range(100)]
    assert rates[0] < rates[4] == pytest.approx(1.0)
    assert rates[5:] == sorted(rates[5:], reverse=True) and rates[-1] == pytest.approx(0.1, abs=0.01)


def test_in_process_comparison_is_exact_at_every_k(tiny_pair):
    from specbuild.drafts.evaluate import compare_in_process

    report = compare_in_process(tiny_pair.target_dir, tiny_pair.draft_dir, (2, 1), prompts=2, max_tokens=8)
    assert [row["k"] for row in report["rows"]] == [0, 1, 2]
    assert all(row["identical"] == 2 and row["tokens"] > 0 for row in report["rows"])
    assert report["rows"][0]["speedup"] == 1.0 and report["rows"][0]["acceptance"] is None
    assert all(0 <= row["acceptance"] <= 1 for row in report["rows"][1:])
