"""``build_info.json``: the record of one engine of a release, typed.

Each runtime writes it (into the engine folder it builds, or as the record of an engine it only plans, which is
how a runtime without engines records its models' limits); packaging, the manifest and the torch runtime's engine
model read it back through :class:`BuildRecord`, whose unknown keys are refused, so a record from another specbuild
version fails loudly with the fix (recompile) instead of being half-read. TensorRT-LLM's own engine files
(``config.json``) stay in TensorRT-LLM's format and are read only inside that runtime.

The limits are those of a request (prompt + generated tokens), as the spec states them; an engine that verifies
drafted tokens is built for ``max_draft_len`` more positions (:attr:`BuildLimits.engine_seq_len`, the one place that
sum is written, with its inverse :meth:`BuildLimits.from_engine_seq_len`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbuild.checkpoint.head_vocabulary import HeadVocabulary
from specbuild.errors import VerificationError

BUILD_INFO = "build_info.json"  # beside the engine's files in its folder
RECORD_FORMAT = "specbuild.build/v1"
RECOMPILE = "recompile the release with this specbuild (`specbuild compile`), which writes the current record"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BuildLimits(_Record):
    """What an engine was built for, in the request's terms."""

    max_batch_size: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_seq_len: int = Field(ge=2, description="prompt + generated tokens a request may have")
    max_draft_len: int = Field(0, ge=0, description="drafted tokens verified per round beyond them (the target)")

    @property
    def engine_seq_len(self) -> int:
        """The positions the engine holds: a request's whole sequence and the drafts verified after it."""
        return self.max_seq_len + self.max_draft_len

    @classmethod
    def from_engine_seq_len(cls, engine_seq_len: int, *, max_draft_len: int, max_batch_size: int,
                            max_input_len: int) -> BuildLimits:
        """The limits of an engine whose own ``max_seq_len`` counts the drafted positions (TensorRT-LLM's)."""
        return cls(max_batch_size=max_batch_size, max_input_len=max_input_len,
                   max_seq_len=engine_seq_len - max_draft_len, max_draft_len=max_draft_len)


class GpuInfo(_Record):
    name: str
    sm: str  # compute capability, e.g. "9.0"


class HeadVocabularyRecord(_Record):
    """A draft engine's sub-vocabulary head: how many ids and their checksum (the ids lie in its folder)."""

    size: int = Field(ge=1)
    sha256: str = Field(pattern="^[0-9a-f]{64}$")

    @classmethod
    def of(cls, vocabulary: HeadVocabulary | None) -> HeadVocabularyRecord | None:
        return None if vocabulary is None else cls(**vocabulary.summary())


class BuildRecord(_Record):
    """One engine's record: which runtime built it (or plans it) and what for."""

    format: Literal["specbuild.build/v1"] = RECORD_FORMAT
    runtime: str
    role: Literal["target", "draft"]
    dtype: str
    vocab_size: int = Field(ge=1)
    architecture: str
    limits: BuildLimits
    generation_logits: bool = False  # the engine returns its logits (a draft for draft-logits acceptance)
    toolchain: dict[str, str] | None = None  # versions that built it; None: planned, not built here
    gpu: GpuInfo | None = None  # the GPU it was built on (TensorRT-LLM engines)
    head_vocabulary: HeadVocabularyRecord | None = None  # a draft whose head covers only these ids

    @classmethod
    def parse(cls, data: object, source: str) -> BuildRecord:
        """``data`` (a decoded ``build_info.json``) as a record, or a :class:`VerificationError` naming ``source``;
        a record of an older specbuild (no ``format``) is refused with the fix to recompile."""
        if isinstance(data, dict) and "format" not in data:
            raise VerificationError(f"{source} was written by an older specbuild (its build record has no format)",
                                    RECOMPILE)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
            raise VerificationError(f"{source} is not a build record this specbuild reads ({where}: "
                                    f"{problem['msg']})", RECOMPILE) from None

    @classmethod
    def read(cls, engine_dir: Path) -> BuildRecord:
        path = engine_dir / BUILD_INFO
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise VerificationError(f"{path} is missing or unreadable ({exc})", RECOMPILE) from None
        return cls.parse(data, str(path))

    def write(self, engine_dir: Path) -> Path:
        path = engine_dir / BUILD_INFO
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
        return path


@dataclass(frozen=True)
class Engine:
    """An engine folder and its record (of an engine built there, or planned for one that is not)."""

    path: Path
    record: BuildRecord

    @property
    def role(self) -> str:
        return self.record.role
