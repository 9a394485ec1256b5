"""read_checkpoint: config, safetensors headers and tokenizer identity, without loading weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

import pytest
from checkpoint_factory import MAX_POSITIONS, VOCAB, Checkpoints, copy_checkpoint, edit_json

from specbuild.checkpoint.info import CheckpointInfo, read_checkpoint
from specbuild.checkpoint.weights import read_safetensors_header
from specbuild.errors import CheckpointError


def test_reads_config_weights_and_tokenizer(checkpoints: Checkpoints) -> None:
    from transformers import AutoTokenizer

    info = read_checkpoint(checkpoints.target)
    assert (info.architecture, info.model_type) == ("LlamaForCausalLM", "llama")
    shape = (info.hidden_size, info.num_layers, info.num_attention_heads, info.num_kv_heads, info.head_dim)
    assert shape == (64, 4, 4, 2, 16)
    assert (info.intermediate_size, info.max_position_embeddings, info.vocab_size) == (256, MAX_POSITIONS, VOCAB)
    assert info.rope_theta == 10000.0 and info.rope_scaling is None
    assert info.torch_dtype == "float32" and not info.tie_word_embeddings and not info.remote_code
    assert info.num_parameters == checkpoints.target_parameters
    assert info.weights.parameters_by_dtype == {"float32": checkpoints.target_parameters}
    assert info.weights.stored_bytes == 4 * checkpoints.target_parameters
    assert (info.embedding_rows, info.weights.lm_head_rows, info.logits_width) == (VOCAB, VOCAB, VOCAB)

    tokenizer = AutoTokenizer.from_pretrained(checkpoints.target)
    tok = info.tokenizer
    assert tok.vocab_size == len(tokenizer) and tok.max_token_id == len(tokenizer) - 1
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert tok.eos_token == tokenizer.eos_token and len(tok.hash) == 64


def test_tied_draft_has_no_lm_head_and_logits_follow_the_embedding(checkpoints: Checkpoints) -> None:
    info = read_checkpoint(checkpoints.draft)
    assert info.tie_word_embeddings and info.weights.lm_head_rows is None
    assert info.num_parameters == checkpoints.draft_parameters
    assert info.logits_width == info.embedding_rows == VOCAB


def test_padded_embedding_rows_differ_from_the_tokenizer_size(checkpoints: Checkpoints) -> None:
    info = read_checkpoint(checkpoints.padded_draft)
    assert info.embedding_rows == info.vocab_size == info.logits_width == 448
    assert info.tokenizer.vocab_size == VOCAB


def test_sharded_checkpoint_reads_like_the_single_file(checkpoints: Checkpoints) -> None:
    sharded = read_checkpoint(checkpoints.sharded_target)
    single = read_checkpoint(checkpoints.target)
    assert len(sharded.weights.files) > 1
    assert sharded.num_parameters == single.num_parameters
    assert sharded.weights.num_tensors == single.weights.num_tensors
    assert sharded.tokenizer == single.tokenizer.model_copy(update={"files": sharded.tokenizer.files})


def test_header_parse_reads_no_tensor_data(checkpoints: Checkpoints, tmp_path: Path) -> None:
    """Zeroing the whole data section changes nothing: only the header is read."""
    source = checkpoints.target / "model.safetensors"
    raw = source.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    blank = tmp_path / "model.safetensors"
    blank.write_bytes(raw[: 8 + header_len] + bytes(len(raw) - 8 - header_len))
    assert read_safetensors_header(blank) == read_safetensors_header(source)


# --- tokenizer identity ---------------------------------------------------------------------------------
def test_tokenizer_hash_ignores_formatting_and_key_order(checkpoints: Checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints.target, tmp_path / "reformatted")
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["vocab"] = dict(reversed(list(data["model"]["vocab"].items())))
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]  # the older merges format
    path.write_text(json.dumps(data, indent=4, sort_keys=True, ensure_ascii=True))
    assert read_checkpoint(folder).tokenizer.hash == read_checkpoint(checkpoints.target).tokenizer.hash


@pytest.mark.parametrize("change", ["merge", "added-token", "special-token"])
def test_tokenizer_hash_changes_with_content(checkpoints: Checkpoints, tmp_path: Path, change: str) -> None:
    folder = copy_checkpoint(checkpoints.target, tmp_path / change)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    if change == "merge":
        data["model"]["merges"] = data["model"]["merges"][:-1]
    elif change == "added-token":
        data["added_tokens"].append({"id": VOCAB, "content": "<|extra|>", "special": True})
    path.write_text(json.dumps(data))
    if change == "special-token":  # the pad role moves to another existing token
        edit_json(folder / "tokenizer_config.json", pad_token="<|eos|>")
    assert read_checkpoint(folder).tokenizer.hash != read_checkpoint(checkpoints.target).tokenizer.hash


def test_other_tokenizer_has_another_hash(checkpoints: Checkpoints) -> None:
    other = read_checkpoint(checkpoints.other_tokenizer).tokenizer
    assert other.hash != read_checkpoint(checkpoints.draft).tokenizer.hash
    assert other.vocab_size == 350


def test_special_ids_fall_back_to_config(checkpoints: Checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints.target, tmp_path / "no_tokenizer_config")
    (folder / "tokenizer_config.json").unlink()
    tok = read_checkpoint(folder).tokenizer
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2) and tok.eos_token is None


# --- refusals and damaged files -------------------------------------------------------------------------
def test_pickle_only_is_refused_unless_allowed(checkpoints: Checkpoints) -> None:
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(checkpoints.pickle_only)
    assert "pytorch_model.bin" in refused.value.message and "--allow-pickle" in refused.value.fix
    info = read_checkpoint(checkpoints.pickle_only, allow_pickle=True)
    assert info.weights.format == "pickle"
    assert info.num_parameters == read_checkpoint(checkpoints.draft).num_parameters  # tied weights counted once


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_remote_code_is_refused_unless_trusted(checkpoints: Checkpoints, tmp_path: Path, file: str) -> None:
    folder = copy_checkpoint(checkpoints.target, tmp_path / "remote")
    edit_json(folder / file, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(folder)
    assert file in refused.value.message and "--trust-remote-code" in refused.value.fix
    assert read_checkpoint(folder, trust_remote_code=True).remote_code


def _header_bytes(folder: Path) -> tuple[Path, bytes, int]:
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    return path, raw, struct.unpack("<Q", raw[:8])[0]


def _truncate(folder: Path) -> Path:
    path, raw, _ = _header_bytes(folder)
    path.write_bytes(raw[: len(raw) // 2])
    return path


def _tiny_file(folder: Path) -> Path:
    path, raw, _ = _header_bytes(folder)
    path.write_bytes(raw[:5])
    return path


def _huge_header_length(folder: Path) -> Path:
    path, raw, _ = _header_bytes(folder)
    path.write_bytes(struct.pack("<Q", 2**62) + raw[8:])
    return path


def _garbage_header(folder: Path) -> Path:
    path, raw, header_len = _header_bytes(folder)
    path.write_bytes(raw[:8] + b"\xff" * header_len + raw[8 + header_len:])
    return path


def _huge_declared_shape(folder: Path) -> Path:
    path, raw, header_len = _header_bytes(folder)
    header = json.loads(raw[8: 8 + header_len])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [2**40, 2**40]
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + header_len:])
    return path


def _invalid_config(folder: Path) -> Path:
    path = folder / "config.json"
    path.write_text("{ not json")
    return path


def _missing_layers(folder: Path) -> Path:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    del data["num_hidden_layers"]
    path.write_text(json.dumps(data))
    return path


def _missing_config(folder: Path) -> Path:
    (folder / "config.json").unlink()
    return folder


def _missing_tokenizer(folder: Path) -> Path:
    (folder / "tokenizer.json").unlink()
    return folder


def _missing_weights(folder: Path) -> Path:
    (folder / "model.safetensors").unlink()
    return folder


@pytest.mark.parametrize("damage", [_truncate, _tiny_file, _huge_header_length, _garbage_header, _huge_declared_shape,
                                    _invalid_config, _missing_layers, _missing_config, _missing_tokenizer,
                                    _missing_weights], ids=lambda f: f.__name__.strip("_"))
def test_damaged_checkpoint_is_a_checkpoint_error_naming_the_file(
        checkpoints: Checkpoints, tmp_path: Path, damage: Callable[[Path], Path]) -> None:
    folder = copy_checkpoint(checkpoints.target, tmp_path / "damaged")
    named = damage(folder)
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(folder)
    assert str(named) in error.value.message and error.value.fix


@pytest.mark.parametrize("shard_name", ["../outside.safetensors", "/etc/passwd", "missing.safetensors"])
def test_sharded_index_must_name_shards_inside_the_folder(
        checkpoints: Checkpoints, tmp_path: Path, shard_name: str) -> None:
    folder = copy_checkpoint(checkpoints.sharded_target, tmp_path / "sharded")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard_name
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(folder)
    assert "model.safetensors.index.json" in error.value.message


def test_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")


def test_summary_is_json_serializable(checkpoints: Checkpoints) -> None:
    info: CheckpointInfo = read_checkpoint(checkpoints.target)
    summary = json.loads(json.dumps(info.summary()))
    assert summary["num_parameters"] == checkpoints.target_parameters and summary["tokenizer"]["vocab_size"] == VOCAB


# -- a draft's head vocabulary ---------------------------------------------------------------------------
def _with_head_vocabulary(checkpoints: Checkpoints, folder: Path, ids: list[int], changes: dict | None = None) -> Path:
    from specbuild.checkpoint.head_vocabulary import HEAD_VOCABULARY, HeadVocabulary

    folder = copy_checkpoint(checkpoints.draft, folder)
    HeadVocabulary.of(ids, {"prompts": 3}).write(folder)
    if changes:
        edit_json(folder / HEAD_VOCABULARY, **changes)
    return folder


def test_a_head_vocabulary_is_read_with_its_checksum_and_costs_its_rows(checkpoints: Checkpoints,
                                                                       tmp_path: Path) -> None:
    from specbuild.checkpoint.head_vocabulary import ids_checksum

    full = read_checkpoint(checkpoints.draft)
    info = read_checkpoint(_with_head_vocabulary(checkpoints, tmp_path / "draft", [7, 3, 0, 99]))
    assert full.head_vocabulary is None and full.head_rows == VOCAB
    assert info.head_vocabulary.ids == (7, 3, 0, 99) and info.head_vocabulary.sha256 == ids_checksum([7, 3, 0, 99])
    assert info.head_rows == 4 and info.logits_width == VOCAB  # its logits are still returned vocabulary-wide
    assert full.macs_per_token - info.macs_per_token == info.hidden_size * (VOCAB - 4)
    summary = json.loads(json.dumps(info.summary()))
    assert summary["head_vocabulary"] == {"size": 4, "sha256": ids_checksum([7, 3, 0, 99])}


@pytest.mark.parametrize(("ids", "changes", "named"), [
    ([1, 2, 2], {}, "more than once"),
    ([1, VOCAB], {}, "outside the vocabulary"),
    ([-1, 4], {}, "outside the vocabulary"),
    ([1, 2, 3], {"ids": [1, 2, 4]}, "sha256"),
    ([1, 2, 3], {"size": 2}, "size 2 but 3 ids"),
    ([1, 2, 3], {"ids": []}, "non-empty list"),
    ([1, 2, 3], {"ids": [1, 2.0]}, "non-empty list"),
    ([1, 2, 3], {"format": "other"}, "not a head vocabulary"),
], ids=["duplicate", "too-large", "negative", "edited", "size", "empty", "float", "format"])
def test_a_wrong_head_vocabulary_is_refused_naming_the_file_and_the_fix(
        checkpoints: Checkpoints, tmp_path: Path, ids: list[int], changes: dict, named: str) -> None:
    folder = _with_head_vocabulary(checkpoints, tmp_path / "draft", ids, changes)
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(folder)
    assert "head_vocabulary.json" in error.value.message and named in error.value.message
    assert "--head-vocabulary" in error.value.fix
