"""The tiny pair made from nothing: loadable from safetensors, one tokenizer, realistic acceptance, cached."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import TINY_SEED
from specbuild.bench.acceptance import measure_acceptance, model_logits  # noqa: E402
from specbuild.drafts import tiny_models
from specbuild.drafts.model_pairs import STAMP_FILE  # noqa: E402


def _load(folder):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
    return model.eval(), transformers.AutoTokenizer.from_pretrained(folder)


def test_corpus_selection_is_deterministic_and_held_out():
    first, second = tiny_models.stdlib_corpus(), tiny_models.stdlib_corpus()
    assert first == second
    train_texts, eval_texts = first
    assert sum(map(len, train_texts)) >= tiny_models.CORPUS_CHARS
    assert len(eval_texts) == tiny_models.EVAL_PROMPTS
    assert not set(eval_texts) & set(train_texts)


def test_tokenizer_is_byte_level_with_special_tokens():
    train_texts, _ = tiny_models.stdlib_corpus()
    tokenizer = tiny_models.wrap_tokenizer(tiny_models.train_tokenizer(train_texts[:5]))
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    text = "naïve café → 東京 🚀\n\tdef f(x): return x"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # every byte is representable


def test_pair_loads_from_safetensors_with_one_tokenizer(tiny_pair):
    for folder in (tiny_pair.target_dir, tiny_pair.draft_dir):
        assert (folder / "model.safetensors").is_file()
        assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))
    assert (tiny_pair.target_dir / "tokenizer.json").read_bytes() == (tiny_pair.draft_dir / "tokenizer.json").read_bytes()
    target, tokenizer = _load(tiny_pair.target_dir)
    draft, _ = _load(tiny_pair.draft_dir)
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == tiny_models.VOCAB_SIZE
    assert target.config.num_hidden_layers > draft.config.num_hidden_layers
    assert target.num_parameters() > 4 * draft.num_parameters()
    assert target.generation_config.eos_token_id == tokenizer.eos_token_id


def test_target_generates_text(tiny_pair):
    target, tokenizer = _load(tiny_pair.target_dir)
    inputs = tokenizer("import os\n\n\ndef ", return_tensors="pt")
    with torch.no_grad():
        out = target.generate(**inputs, max_new_tokens=24, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1]:]
    assert len(new) > 0
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert text.strip(), "the target should continue the code, not emit only special tokens"


def test_acceptance_is_realistic_and_reproducible_from_the_saved_files(tiny_pair):
    recorded = tiny_pair.info["greedy_acceptance"]
    assert 0.25 <= recorded["4"] <= recorded["2"] <= recorded["1"] <= 0.9
    target, _ = _load(tiny_pair.target_dir)
    draft, _ = _load(tiny_pair.draft_dir)
    train_texts, eval_texts = tiny_models.stdlib_corpus()
    tokenizer = tiny_models.train_tokenizer(train_texts)
    prompts = [tokenizer.encode(text).ids[:tiny_models.EVAL_PROMPT_LEN] for text in eval_texts]
    with tiny_models.torch_threads(tiny_models.THREADS):
        measured = measure_acceptance(target, model_logits(draft), prompts, tiny_models.EVAL_NEW_TOKENS)
    assert measured == pytest.approx(recorded, abs=0.02)


def test_cached_pair_is_returned_without_rebuilding(tiny_pair, tmp_path):
    copy = tmp_path / "tiny"
    shutil.copytree(tiny_pair.root, copy)
    weights = copy / "target" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = tiny_models.build_tiny_pair(copy, seed=TINY_SEED)
    assert again.info == tiny_pair.info
    assert weights.stat().st_mtime_ns == before
    assert (copy / STAMP_FILE).is_file()


def test_cli_reports_the_pair_and_refuses_a_foreign_folder(tiny_pair, tmp_path):
    import json

    from click.testing import CliRunner

    from specbuild.cli import main

    copy = tmp_path / "tiny"
    shutil.copytree(tiny_pair.root, copy)
    result = CliRunner().invoke(main, ["demo-models", str(copy), "--tiny", "--tiny-seed", str(TINY_SEED), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["recipe"] == tiny_pair.info["recipe"]

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["demo-models", str(foreign), "--tiny"])
    assert result.exit_code == 2
    assert "not a specbuild model pair" in result.output and "Traceback" not in result.output
    assert (foreign / "todo.txt").read_text() == "keep me"
