"""The weights of a checkpoint from their headers: safetensors headers (never the tensor data) or, only when
the user allows pickles, PyTorch state dicts through a restricted, memory-mapped unpickler."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from specbuild.checkpoint.json_files import MAX_CONFIG_JSON, inside, read_json
from specbuild.errors import CheckpointError

# safetensors refuses headers over 100 MB itself; a header that claims more is corrupt.
MAX_SAFETENSORS_HEADER = 100_000_000

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
    index = read_json(index_path, MAX_CONFIG_JSON)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path} has no weight_map", "re-save the checkpoint with save_pretrained")
    return weight_map, sorted({inside(index_path.parent, name, index_path) for name in weight_map.values()})


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


def read_weights(folder: Path, allow_pickle: bool) -> WeightsInfo:
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

