"""The tokenizer of a checkpoint from its files (tokenizer.json, tokenizer_config.json,
special_tokens_map.json), and the hash that says whether two checkpoints tokenize alike."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from specbuild.checkpoint.json_files import MAX_CONFIG_JSON, MAX_TOKENIZER_JSON, read_json
from specbuild.errors import CheckpointError

SPECIAL_ROLES = ("bos", "eos", "pad", "unk")


class TokenizerInfo(BaseModel):
    """Tokenizer identity: ``hash`` covers vocabulary, merges, added and special tokens (see :func:`tokenizer_hash`)."""

    hash: str
    model: str  # BPE, Unigram, WordPiece, WordLevel
    vocab_size: int  # distinct token ids, added tokens included (``len(tokenizer)``)
    max_token_id: int
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    files: list[str]


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _vocab(model: dict[str, Any], path: Path) -> dict[str, int]:
    vocab = model.get("vocab")
    if isinstance(vocab, dict) and all(isinstance(i, int) for i in vocab.values()):
        return vocab
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        return {entry[0]: index for index, entry in enumerate(vocab) if isinstance(entry, list) and entry}
    raise CheckpointError(f"{path} has no readable model.vocab", "save the tokenizer again with save_pretrained")


def _merges(model: dict[str, Any]) -> list[list[str]]:
    """Merges as pairs; tokenizers writes ``"a b"`` strings (old) or ``["a", "b"]`` lists (new)."""
    return [merge.split(" ", 1) if isinstance(merge, str) else list(merge) for merge in model.get("merges") or []]


def _special_tokens(folder: Path, files: list[str]) -> tuple[dict[str, str], list[str], dict[str, Any]]:
    """Role -> token content, additional special tokens, and tokenizer_config.json itself.

    ``special_tokens_map.json`` overrides ``tokenizer_config.json``, as in transformers.
    """
    roles: dict[str, str] = {}
    additional: set[str] = set()
    tokenizer_config: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if not path.is_file():
            continue
        data = read_json(path, MAX_CONFIG_JSON)
        if not isinstance(data, dict):
            raise CheckpointError(f"{path} is not a JSON object", "save the tokenizer again with save_pretrained")
        files.append(name)
        if name == "tokenizer_config.json":
            tokenizer_config = data
        for role in SPECIAL_ROLES:
            content = _token_content(data.get(f"{role}_token"))
            if content is not None:
                roles[role] = content
        for key in ("additional_special_tokens", "extra_special_tokens"):
            extra = data.get(key)
            values = extra.values() if isinstance(extra, dict) else extra if isinstance(extra, list) else []
            additional.update(c for c in map(_token_content, values) if c is not None)
    return roles, sorted(additional), tokenizer_config


def tokenizer_hash(vocab: dict[str, int], merges: list[list[str]], added: dict[int, tuple[str, bool]],
                   special: dict[str, str], additional: list[str], model: str) -> str:
    """sha256 of a canonical JSON of the tokenizer's identity, independent of file formatting and key order."""
    canonical = {
        "model": model,
        "vocab": vocab,
        "merges": merges,
        "added_tokens": [[i, content, is_special] for i, (content, is_special) in sorted(added.items())],
        "special_tokens": special,
        "additional_special_tokens": additional,
    }
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_tokenizer(folder: Path, config: dict[str, Any]) -> TokenizerInfo:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json (the fast tokenizer file)",
                              "save the tokenizer into the checkpoint: AutoTokenizer.from_pretrained(...)"
                              ".save_pretrained(folder)")
    data = read_json(path, MAX_TOKENIZER_JSON)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        raise CheckpointError(f"{path} has no model section", "save the tokenizer again with save_pretrained")
    vocab = _vocab(model, path)
    files = ["tokenizer.json"]
    roles, additional, tokenizer_config = _special_tokens(folder, files)
    added: dict[int, tuple[str, bool]] = {}
    declared = list(data.get("added_tokens") or [])
    decoder = tokenizer_config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        declared += [{**entry, "id": int(i)} for i, entry in decoder.items() if isinstance(entry, dict) and i.isdigit()]
    for entry in declared:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            added[entry["id"]] = (entry["content"], bool(entry.get("special", False)))
    ids = {content: i for i, (content, _) in added.items()}
    ids = {**vocab, **ids}
    all_ids = set(vocab.values()) | set(added)
    if not all_ids:
        raise CheckpointError(f"{path} has an empty vocabulary", "save the tokenizer again with save_pretrained")

    def token_id(role: str) -> int | None:
        if role in roles:
            if roles[role] not in ids:
                raise CheckpointError(f"the {role} token {roles[role]!r} named by the tokenizer files of {folder} is "
                                      "not in its vocabulary", "fix the tokenizer's special tokens")
            return ids[roles[role]]
        value = config.get(f"{role}_token_id")  # fall back to config.json; eos may be a list
        value = value[0] if isinstance(value, list) and value else value
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return TokenizerInfo(
        hash=tokenizer_hash(vocab, _merges(model), added, roles, additional, str(model.get("type", "BPE"))),
        model=str(model.get("type", "BPE")), vocab_size=len(all_ids), max_token_id=max(all_ids),
        bos_token=roles.get("bos"), eos_token=roles.get("eos"), pad_token=roles.get("pad"),
        bos_token_id=token_id("bos"), eos_token_id=token_id("eos"), pad_token_id=token_id("pad"), files=files,
    )


def folder_tokenizer_hash(folder: Path) -> str:
    """The hash of the tokenizer in ``folder`` (:func:`tokenizer_hash`): the one a release stamps into its capture
    records, a bench replaying them and a draft continued on them compare. It depends on the tokenizer files alone
    (config.json only supplies special-token ids, which the hash does not cover)."""
    return read_tokenizer(folder, {}).hash


# What makes a tokenizer, copied with a converted checkpoint and into a release.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


def copy_tokenizer(source: Path, destination: Path) -> list[str]:
    """Copy the tokenizer files that exist in ``source``; return their names."""
    destination.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, destination / name)
            copied.append(name)
    return copied
