"""A draft's sub-vocabulary head: ``head_vocabulary.json`` beside its weights.

A draft whose output head covers only the ids its target uses most (frequency-ranked, as FR-Spec does for
EAGLE heads) costs less per step and stays exact: its distribution is zero outside the listed ids, which is
what the target verifies against. The file holds the ids (most frequent first, unique, inside the draft's
vocabulary) and the SHA-256 of their canonical text (:func:`ids_checksum`), so a list cut or edited by hand
is refused rather than served. Check, convert, build, the engine model and the manifest carry that checksum.
Standard library only (no pydantic): the torch engine reads it on a bare GPU machine (``scripts/gpu-*.sh``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.checkpoint.json_files import read_json
from specbuild.errors import CheckpointError

HEAD_VOCABULARY = "head_vocabulary.json"
FORMAT = "specbuild.head-vocabulary/v1"
MAX_HEAD_VOCABULARY_JSON = 32 * 2**20  # a 256k-id list is ~2 MB
REMAKE = ("make the list again (`specbuild head-vocabulary TARGET DRAFT --replace`; a new draft: `specbuild draft "
          "--head-vocabulary N`), or delete the file to serve the draft's full head")


def ids_checksum(ids: Iterable[int]) -> str:
    """SHA-256 of the ids as comma-separated decimals, in their order."""
    return hashlib.sha256(",".join(str(int(token)) for token in ids).encode("ascii")).hexdigest()


@dataclass(frozen=True)
class HeadVocabulary:
    """The ids a draft's output head covers, in ranked order, and their checksum."""

    ids: tuple[int, ...]
    sha256: str
    provenance: dict[str, Any] = field(default_factory=dict)  # how the ranking was made (prompts, tokens, coverage)

    @classmethod
    def of(cls, ids: Iterable[int], provenance: Mapping[str, Any] | None = None) -> HeadVocabulary:
        ids = tuple(int(token) for token in ids)
        return cls(ids=ids, sha256=ids_checksum(ids), provenance=dict(provenance or {}))

    @property
    def size(self) -> int:
        return len(self.ids)

    def summary(self) -> dict[str, Any]:
        """What a report, a build record or the manifest shows: the size and the checksum, never the ids."""
        return {"size": self.size, "sha256": self.sha256}

    def write(self, folder: Path) -> Path:
        path = folder / HEAD_VOCABULARY
        data = {"format": FORMAT, "size": self.size, "sha256": self.sha256, "provenance": self.provenance,
                "ids": list(self.ids)}
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
        return path


def read_head_vocabulary(folder: Path, vocab_size: int) -> HeadVocabulary | None:
    """The checkpoint folder's head vocabulary, validated against its ``vocab_size``; None where it has none."""
    path = folder / HEAD_VOCABULARY
    if not path.is_file():
        return None
    data = read_json(path, MAX_HEAD_VOCABULARY_JSON)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a head vocabulary (its format must be {FORMAT!r})", REMAKE)
    ids, checksum, provenance = data.get("ids"), data.get("sha256"), data.get("provenance", {})
    if not (isinstance(ids, list) and ids and all(type(token) is int for token in ids)):
        raise CheckpointError(f"{path}: ids must be a non-empty list of integers", REMAKE)
    outside = [token for token in ids if not 0 <= token < vocab_size]
    if outside:
        raise CheckpointError(f"{path}: {len(outside)} ids lie outside the vocabulary [0, {vocab_size}) "
                              f"(first {outside[0]})", REMAKE)
    if len(set(ids)) != len(ids):
        raise CheckpointError(f"{path}: {len(ids) - len(set(ids))} ids appear more than once", REMAKE)
    if data.get("size") != len(ids):
        raise CheckpointError(f"{path}: size {data.get('size')!r} but {len(ids)} ids", REMAKE)
    if checksum != ids_checksum(ids):
        raise CheckpointError(f"{path}: the ids do not match their sha256 (the list was changed after it was made)",
                              REMAKE)
    if not isinstance(provenance, dict):
        raise CheckpointError(f"{path}: provenance must be an object", REMAKE)
    return HeadVocabulary(ids=tuple(ids), sha256=checksum, provenance=provenance)
