"""Bounded reads of the files of a checkpoint we do not trust (sizes checked before anything is parsed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.errors import CheckpointError

MAX_CONFIG_JSON = 16 * 2**20  # config.json, tokenizer_config.json, index files
MAX_TOKENIZER_JSON = 256 * 2**20  # the largest public tokenizer.json files are ~35 MB


def read_json(path: Path, limit: int) -> Any:
    """``path``'s JSON, refused (naming the file) when it is over ``limit`` bytes or not valid JSON."""
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


def inside(folder: Path, name: str, referrer: Path) -> Path:
    """``folder / name`` if it stays inside ``folder``; names come from files we do not trust."""
    if not isinstance(name, str) or Path(name).is_absolute() or \
            not (folder / name).resolve().is_relative_to(folder.resolve()):
        raise CheckpointError(f"{referrer} points outside the checkpoint folder: {name!r}",
                              "use an index whose shard names are files in the same folder")
    return (folder / name).resolve()

