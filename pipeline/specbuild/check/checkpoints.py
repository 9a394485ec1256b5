"""Reading Hugging Face checkpoints without loading their weights.

:func:`read_checkpoint` reads ``config.json``, the safetensors headers (never the tensor data) and the
tokenizer files of one checkpoint folder into a :class:`CheckpointInfo`. Everything a user can get wrong
(a missing or corrupt file, a pickle-only checkpoint, remote code) is a :class:`CheckpointError` that names
the file and the fix; every size read from a file is checked against the file before anything is allocated.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from specbuild.errors import CheckpointError

# safetensors refuses headers over 100 MB itself; a header that claims more is corrupt.
MAX_SAFETENSORS_HEADER = 100_000_000
MAX_CONFIG_JSON = 16 * 2**20  # config.json, tokenizer_config.json, index files
MAX_TOKENIZER_JSON = 256 * 2**20  # the largest public tokenizer.json files are ~35 MB

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"

# safetensors dtype code -> (the torch name reports use, bytes per element)
SAFETENSORS_DTYPES = {
    "F64": ("float64", 8), "I64": ("int64", 8), "U64": ("uint64", 8),
    "F32": ("float32", 4), "I32": ("int32", 4), "U32": ("uint32", 4),
    "F16": ("float16", 2), "BF16": ("bfloat16", 2), "I16": ("int16", 2), "U16": ("uint16", 2),
    "I8": ("int8", 1), "U8": ("uint8", 1), "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1), "F8_E8M0": ("float8_e8m0fnu", 1),
}

# Tensor-name suffixes of the input embedding and the output projection across HF families.
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight",
                      "tok_embeddings.weight")
LM_HEAD_SUFFIXES = ("lm_head.weight", "embed_out.weight")

# config.json spells the same quantity differently across families; the first key present wins.
CONFIG_ALIASES: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
}

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


class WeightsInfo(BaseModel):
    """What the weight files declare (headers only)."""

    format: Literal["safetensors", "pickle"]
    files: list[str]
    num_tensors: int
    num_parameters: int
    stored_bytes: int
    parameters_by_dtype: dict[str, int]
    embedding_tensor: str | None
    embedding_rows: int | None
    lm_head_rows: int | None  # None when the output projection is tied to the embedding


class CheckpointInfo(BaseModel):
    """One HF checkpoint folder, summarized from its config, weight headers and tokenizer files."""

    path: str
    architecture: str
    model_type: str | None
    vocab_size: int  # config.json: the logits width the model was built with
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    torch_dtype: str | None
    tie_word_embeddings: bool
    remote_code: bool  # config or tokenizer_config has an ``auto_map`` (read, never executed, here)
    weights: WeightsInfo
    tokenizer: TokenizerInfo

    @property
    def num_parameters(self) -> int:
        return self.weights.num_parameters

    @property
    def embedding_rows(self) -> int | None:
        return self.weights.embedding_rows

    @property
    def logits_width(self) -> int:
        """Width of the logits the engine returns: the output projection's rows."""
        return self.weights.lm_head_rows or self.weights.embedding_rows or self.vocab_size

    @property
    def macs_per_token(self) -> int:
        """Multiply-accumulates of one decoding step for one token (see :func:`decoder_macs_per_token`)."""
        return decoder_macs_per_token(layers=self.num_layers, hidden=self.hidden_size,
                                      query_width=self.num_attention_heads * self.head_dim,
                                      kv_width=self.num_kv_heads * self.head_dim,
                                      intermediate=self.intermediate_size, logits_width=self.logits_width)

    def summary(self) -> dict[str, Any]:
        """The figures a report shows (no per-file lists)."""
        data = self.model_dump(mode="json", exclude={"weights", "tokenizer"})
        data.update(
            num_parameters=self.num_parameters,
            embedding_rows=self.embedding_rows,
            logits_width=self.logits_width,
            weights_format=self.weights.format,
            parameters_by_dtype=self.weights.parameters_by_dtype,
            tokenizer=self.tokenizer.model_dump(mode="json", exclude={"files"}),
        )
        return data


def decoder_macs_per_token(*, layers: int, hidden: int, query_width: int, kv_width: int, intermediate: int,
                           logits_width: int) -> int:
    """Multiply-accumulates of a decoder's weight matmuls for one token: per layer the query and output
    projections (``hidden x query_width`` each), the key and value projections (``hidden x kv_width`` each)
    and a gated MLP (``3 x hidden x intermediate``, as Llama-family models have), plus the output head
    (``hidden x logits_width``). The embedding lookup costs no matmul and attention over the context is
    left out (it is small next to these at the short contexts where decoding cost matters)."""
    per_layer = 2 * hidden * query_width + 2 * hidden * kv_width + 3 * hidden * intermediate
    return layers * per_layer + hidden * logits_width


# --- small file helpers --------------------------------------------------------------------------------
def _read_json(path: Path, limit: int) -> Any:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    if size > limit:
        raise CheckpointError(f"{path} is {size} bytes, more than the {limit} a valid file of its kind holds",
                              "replace it with the checkpoint's original file")
    try:
        return json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting: RecursionError
        raise CheckpointError(f"{path} is not valid JSON ({exc})",
                              "replace it with the checkpoint's original file") from None


def _inside(folder: Path, name: str, referrer: Path) -> Path:
    """``folder / name`` if it stays inside ``folder``; names come from files we do not trust."""
    if not isinstance(name, str) or Path(name).is_absolute() or \
            not (folder / name).resolve().is_relative_to(folder.resolve()):
        raise CheckpointError(f"{referrer} points outside the checkpoint folder: {name!r}",
                              "use an index whose shard names are files in the same folder")
    return (folder / name).resolve()


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# --- config.json ---------------------------------------------------------------------------------------
def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal and some newer configs nest the language model under ``text_config``."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def _config_value(config: dict[str, Any], field: str) -> Any:
    for key in CONFIG_ALIASES.get(field, (field,)):
        if config.get(key) is not None:
            return config[key]
    return None


def _require_int(config: dict[str, Any], field: str, path: Path) -> int:
    value = _config_value(config, field)
    if not _positive_int(value):
        keys = " / ".join(CONFIG_ALIASES.get(field, (field,)))
        raise CheckpointError(f"{path}: {keys} is missing or not a positive integer (got {value!r})",
                              "use the config.json the model was trained with")
    return value


def _rope(config: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """rope_theta and rope scaling; transformers 5 moves both into ``rope_parameters``."""
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    scaling = config.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return (float(theta) if isinstance(theta, (int, float)) else None), (scaling if isinstance(scaling, dict) else None)


# --- safetensors headers -------------------------------------------------------------------------------
def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> ``{"dtype", "shape"}`` from a safetensors file's header; the data is never read.

    Layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor data. Every declared
    size and offset is checked against the file, so a corrupt file cannot trigger a huge allocation.
    """
    fix = "re-download or re-save the checkpoint (save_pretrained writes valid safetensors)"
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path} is truncated: {size} bytes, too short for a safetensors header", fix)
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_SAFETENSORS_HEADER or header_len > size - 8:
                raise CheckpointError(
                    f"{path} is corrupt or truncated: its header claims {header_len} bytes but the file holds "
                    f"{size - 8} after the length prefix", fix)
            raw = handle.read(header_len)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CheckpointError(f"{path} is corrupt: its safetensors header is not valid JSON", fix) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is corrupt: its safetensors header is not a JSON object", fix)
    data_len = size - 8 - header_len
    tensors: dict[str, dict[str, Any]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _checked_tensor_entry(path, name, entry, data_len, fix)
    return tensors


def _checked_tensor_entry(path: Path, name: str, entry: Any, data_len: int, fix: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path} is corrupt: header entry {name!r} is not an object", fix)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}",
                              "use fp16/bf16/fp32 weights (no quantized formats)")
    valid_shape = isinstance(shape, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    valid_offsets = (isinstance(offsets, list) and len(offsets) == 2
                     and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                     and 0 <= offsets[0] <= offsets[1])
    if not (valid_shape and valid_offsets):
        raise CheckpointError(f"{path} is corrupt: tensor {name!r} has a malformed shape or data_offsets", fix)
    if offsets[1] > data_len:
        raise CheckpointError(f"{path} is truncated: tensor {name!r} ends at byte {offsets[1]} of the data "
                              f"but the file holds {data_len}", fix)
    dtype_name, size = SAFETENSORS_DTYPES[dtype]
    if offsets[1] - offsets[0] != math.prod(shape) * size:
        raise CheckpointError(f"{path} is corrupt: tensor {name!r} declares shape {shape} ({dtype}) but "
                              f"{offsets[1] - offsets[0]} bytes", fix)
    return {"dtype": dtype_name, "shape": shape, "bytes": offsets[1] - offsets[0]}


def _index(index_path: Path) -> tuple[dict[str, str], list[Path]]:
    """A sharded checkpoint's index: tensor name -> shard file, and the shard paths (inside the folder)."""
    index = _read_json(index_path, MAX_CONFIG_JSON)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path} has no weight_map", "re-save the checkpoint with save_pretrained")
    return weight_map, sorted({_inside(index_path.parent, name, index_path) for name in weight_map.values()})


def _safetensors_tensors(folder: Path) -> tuple[list[Path], dict[str, dict[str, Any]]]:
    index_path = folder / SAFETENSORS_INDEX
    weight_map: dict[str, str] = {}
    if index_path.is_file():
        weight_map, shards = _index(index_path)
    else:
        shards = sorted(folder.glob("*.safetensors"))
    tensors: dict[str, dict[str, Any]] = {}
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"{index_path} names shard {shard.name}, which is missing",
                                  "copy every shard of the checkpoint")
        tensors.update(read_safetensors_header(shard))
    for name in weight_map:
        if name not in tensors:
            raise CheckpointError(f"{index_path} maps tensor {name!r} to {weight_map[name]}, which does not hold it",
                                  "re-save the checkpoint with save_pretrained")
    return shards, tensors


def _pickle_tensors(folder: Path, files: list[Path]) -> dict[str, dict[str, Any]]:
    """Shapes from pickle checkpoints (only with allow_pickle): memory-mapped, restricted unpickler."""
    try:
        import torch
    except ImportError:
        raise CheckpointError("reading .bin/.pt checkpoints needs PyTorch",
                              "pip install 'specbuild[torch]', or convert the checkpoint to safetensors") from None
    tensors: dict[str, dict[str, Any]] = {}
    seen: set[tuple[int, int]] = set()  # tied weights share storage: count them once
    for file in files:
        try:
            state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # torch raises many types for corrupt or legacy files
            raise CheckpointError(f"{file} could not be read as a PyTorch state dict: {exc}",
                                  "convert the checkpoint to safetensors") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{file} does not hold a state dict", "convert the checkpoint to safetensors")
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor):
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            if key not in seen:
                seen.add(key)
                tensors[name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                                 "bytes": tensor.element_size() * tensor.numel()}
    return tensors


def _pickle_files(folder: Path) -> list[Path]:
    """The weight pickles: the index's shards, else pytorch_model.bin, else every pickle in the folder."""
    index_path = folder / PICKLE_INDEX
    if index_path.is_file():
        return _index(index_path)[1]
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    return sorted(p for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())


def _find(tensors: dict[str, dict[str, Any]], suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        for name in sorted(tensors):
            if name.endswith(suffix) and len(tensors[name]["shape"]) == 2:
                return name
    return None


def _read_weights(folder: Path, allow_pickle: bool) -> WeightsInfo:
    if (folder / SAFETENSORS_INDEX).is_file() or any(folder.glob("*.safetensors")):
        fmt: Literal["safetensors", "pickle"] = "safetensors"
        files, tensors = _safetensors_tensors(folder)
    else:
        files = _pickle_files(folder)
        if not files:
            raise CheckpointError(f"{folder} holds no weights (*.safetensors)",
                                  "point at a folder written by save_pretrained")
        if not allow_pickle:
            raise CheckpointError(
                f"{folder} only has pickle weights ({', '.join(p.name for p in files)}); loading a pickle can run "
                "arbitrary code", "convert it to safetensors, or pass --allow-pickle (security.allow_pickle) "
                "if you trust its source")
        fmt = "pickle"
        tensors = _pickle_tensors(folder, files)
    if not tensors:
        raise CheckpointError(f"the weight files in {folder} hold no tensors", "re-save the checkpoint")
    by_dtype: dict[str, int] = {}
    stored = 0
    for entry in tensors.values():
        count = math.prod(entry["shape"])
        by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + count
        stored += entry["bytes"]
    embedding = _find(tensors, EMBEDDING_SUFFIXES)
    lm_head = _find(tensors, LM_HEAD_SUFFIXES)
    return WeightsInfo(
        format=fmt, files=[p.name for p in files], num_tensors=len(tensors), num_parameters=sum(by_dtype.values()),
        stored_bytes=stored, parameters_by_dtype=by_dtype, embedding_tensor=embedding,
        embedding_rows=tensors[embedding]["shape"][0] if embedding else None,
        lm_head_rows=tensors[lm_head]["shape"][0] if lm_head else None,
    )


# --- tokenizer -----------------------------------------------------------------------------------------
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
        data = _read_json(path, MAX_CONFIG_JSON)
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


def _read_tokenizer(folder: Path, config: dict[str, Any]) -> TokenizerInfo:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json (the fast tokenizer file)",
                              "save the tokenizer into the checkpoint: AutoTokenizer.from_pretrained(...)"
                              ".save_pretrained(folder)")
    data = _read_json(path, MAX_TOKENIZER_JSON)
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


# --- the whole checkpoint ------------------------------------------------------------------------------
def read_checkpoint(path: str | Path, *, allow_pickle: bool = False, trust_remote_code: bool = False) -> CheckpointInfo:
    """Summarize the HF checkpoint folder ``path`` from its config, weight headers and tokenizer files."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist",
                              "pass the folder that holds config.json")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} has no config.json", "point at a Hugging Face checkpoint folder "
                              "(config.json, tokenizer files, *.safetensors)")
    raw_config = _read_json(config_path, MAX_CONFIG_JSON)
    if not isinstance(raw_config, dict):
        raise CheckpointError(f"{config_path} is not a JSON object", "use the checkpoint's original config.json")
    remote_code = _refuse_remote_code(folder, raw_config, trust_remote_code)
    config = _text_config(raw_config)
    architectures = raw_config.get("architectures") or config.get("architectures")
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        raise CheckpointError(f"{config_path} names no architectures", "use the config.json written by save_pretrained")
    hidden = _require_int(config, "hidden_size", config_path)
    heads = _require_int(config, "num_attention_heads", config_path)
    kv_heads = _config_value(config, "num_kv_heads")
    if not _positive_int(kv_heads):
        kv_heads = 1 if config.get("multi_query") else heads
    head_dim = config.get("head_dim") if _positive_int(config.get("head_dim")) else hidden // heads
    intermediate = _config_value(config, "intermediate_size")
    max_positions = _config_value(config, "max_position_embeddings")
    rope_theta, rope_scaling = _rope(config)
    dtype = raw_config.get("torch_dtype", raw_config.get("dtype", config.get("torch_dtype", config.get("dtype"))))
    weights = _read_weights(folder, allow_pickle)
    return CheckpointInfo(
        path=str(folder.resolve()),
        architecture=architectures[0],
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        vocab_size=_require_int(config, "vocab_size", config_path),
        hidden_size=hidden,
        num_layers=_require_int(config, "num_layers", config_path),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate if _positive_int(intermediate) else 4 * hidden,
        max_position_embeddings=max_positions if _positive_int(max_positions) else None,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        torch_dtype=dtype if isinstance(dtype, str) else None,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        remote_code=remote_code,
        weights=weights,
        tokenizer=_read_tokenizer(folder, config),
    )


def _refuse_remote_code(folder: Path, config: dict[str, Any], trust_remote_code: bool) -> bool:
    """Checkpoints with an ``auto_map`` need their own Python code to load: refused unless trusted."""
    sources = [("config.json", config)]
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        data = _read_json(tokenizer_config, MAX_CONFIG_JSON)
        sources.append(("tokenizer_config.json", data if isinstance(data, dict) else {}))
    needing = [name for name, data in sources if data.get("auto_map")]
    if needing and not trust_remote_code:
        raise CheckpointError(
            f"{folder / needing[0]} has an auto_map: the checkpoint needs its own Python code to load",
            "use a checkpoint of a built-in transformers architecture, or pass --trust-remote-code "
            "(security.trust_remote_code) if you trust its source")
    return bool(needing)
