"""The capture record format, ``specbuild-capture/1``: one finished request row per line of a JSON Lines file.

Why JSON Lines: a record is appended with one ``write`` of one line, so a reader tells a complete record from
the one a killed writer left torn (no newline at the end of the file) without any index; each line is read on
its own by any tool (``jq``), and the version travels in every record, so files of two versions can sit in one
store and a reader refuses the one it does not know by name. Token ids are stored as JSON integers (about 6
bytes a token): a capture is a few hundred bytes a request, so a binary format would save little and cost the
readability.

**Token ids are the text**: the release's tokenizer decodes them. A capture store is as private as the traffic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specbuild.errors import SpecbuildError

FORMAT = "specbuild-capture/1"
SUFFIX = ".jsonl"  # a capture file; the store's other files (a lock, a file being written by nobody) are not read


class CaptureFormatError(SpecbuildError):
    """A capture file holds a line that is not a record this version reads."""


@dataclass(frozen=True)
class CaptureRecord:
    """One finished request row, as the orchestrator served it.

    ``rounds``: each target call's ``[drafted, accepted]`` (0 drafted: the target alone that round);
    ``sampling``: the row's sampling settings by their ensemble input names (``temperature``, ``top_p``,
    ``top_k``, ``random_seed``, ...), greedy rows included; ``release``: the SHA-256 of the release's
    ``manifest.json``; ``tokenizer``: the release tokenizer's
    :func:`~specbuild.checkpoint.tokenizer_files.tokenizer_hash`, so a record is never read against another
    tokenizer (a reader compares it with its checkpoint's)."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    sampling: dict[str, Any]
    rounds: tuple[tuple[int, int], ...]
    finish_reason: str
    release: str
    tokenizer: str
    finished_at: float  # Unix seconds
    instance: str  # the model instance that wrote it (its file's name says so too)
    format: str = field(default=FORMAT)

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ValueError(f"format {self.format!r}: this specbuild reads {FORMAT}")

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens (None: nothing drafted)."""
        drafted = sum(item[0] for item in self.rounds)
        return sum(item[1] for item in self.rounds) / drafted if drafted else None

    @property
    def greedy(self) -> bool:
        """Greedy as the backend decides it: top_k 1 or temperature 0 (both leave every other draw alone)."""
        return self.sampling.get("top_k") == 1 or self.sampling.get("temperature", 1.0) == 0.0

    def to_line(self) -> bytes:
        """The record as one line, newline included: written with one ``write`` so it lands whole or torn last."""
        data = asdict(self)
        data["format"] = self.format
        return (json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_line(cls, line: bytes | str) -> CaptureRecord:
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}: this specbuild reads {FORMAT}")
        return cls(prompt_ids=tuple(int(i) for i in data["prompt_ids"]),
                   output_ids=tuple(int(i) for i in data["output_ids"]),
                   sampling=dict(data["sampling"]),
                   rounds=tuple((int(d), int(a)) for d, a in data["rounds"]),
                   finish_reason=str(data["finish_reason"]), release=str(data["release"]),
                   tokenizer=str(data["tokenizer"]), finished_at=float(data["finished_at"]),
                   instance=str(data["instance"]))


def capture_files(store: Path) -> list[Path]:
    """A store's capture files, oldest name first (names start with their creation time)."""
    return sorted(path for path in store.glob(f"*{SUFFIX}") if path.is_file())


def read_file(path: Path) -> Iterator[CaptureRecord]:
    """The complete records of one capture file. A last line without its newline is the one a killed writer
    tore: skipped. Any other line that is not a record is an error naming the file and line."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                return  # torn: the writer died in this record's write; it was never acknowledged
            try:
                yield CaptureRecord.from_line(line)
            except (ValueError, KeyError, TypeError) as exc:
                raise CaptureFormatError(f"{path}:{number}: not a {FORMAT} record ({exc})",
                                         "capture files are written by specbuild releases only; move this file "
                                         "out of the store (or `specbuild capture purge` it)") from None


def read_records(paths: Iterable[Path]) -> Iterator[CaptureRecord]:
    """The records of capture files and stores (a folder: its capture files, oldest first), in order."""
    for path in paths:
        for item in capture_files(path) if path.is_dir() else [path]:
            yield from read_file(item)
