"""What a capture store holds, and what a purge deletes: the API under ``specbuild capture show`` and ``purge``
(which deletes :func:`purge_candidates` with :func:`~specbuild.capture.store.delete_files`).

Both refuse a folder that is not a capture store (:func:`~specbuild.capture.store.is_store`): a mistyped path
must never have its ``*.jsonl`` files deleted or read as traffic.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specbuild.capture.records import capture_files, read_file
from specbuild.capture.store import MARKER, CaptureStoreError, expired, is_store

DAY = 86400.0


def require_store(folder: Path) -> Path:
    """``folder``, absolute, if it is a capture store; else a :class:`CaptureStoreError` saying what it is."""
    folder = Path(folder).expanduser().absolute()
    if not folder.is_dir():
        raise CaptureStoreError(f"{folder} is not a folder", "name the capture store folder a release wrote "
                                "(specbuild serve says where at start)")
    if not is_store(folder):
        raise CaptureStoreError(f"{folder} is not a capture store (it has no {MARKER}, which a capturing release "
                                "writes there)", "name the capture store folder a release wrote (specbuild serve "
                                "says where at start)")
    return folder


@dataclass(frozen=True)
class StoreSummary:
    """A store's capture files and their complete records: how many, how large, the window of their
    ``finished_at`` and the releases (manifest sha256) that wrote them, with their record counts."""

    folder: Path
    files: int
    records: int
    bytes: int
    first: float | None  # Unix seconds; None: no records
    last: float | None
    releases: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "files": self.files, "records": self.records, "bytes": self.bytes,
                "first": _utc(self.first), "last": _utc(self.last), "releases": dict(self.releases)}


def _utc(moment: float | None) -> str | None:
    return None if moment is None else datetime.fromtimestamp(moment, tz=timezone.utc).isoformat(timespec="seconds")


def summarize(folder: Path) -> StoreSummary:
    """What the store at ``folder`` holds (a torn last line, a killed writer's, is not a record)."""
    folder = require_store(folder)
    files = capture_files(folder)
    releases: Counter[str] = Counter()
    first = last = None
    for path in files:
        for record in read_file(path):
            releases[record.release] += 1
            first = record.finished_at if first is None else min(first, record.finished_at)
            last = record.finished_at if last is None else max(last, record.finished_at)
    return StoreSummary(folder=folder, files=len(files), records=sum(releases.values()),
                        bytes=sum(path.stat().st_size for path in files), first=first, last=last,
                        releases=dict(releases))


def purge_candidates(folder: Path, older_than_days: float | None = None, now: float | None = None) -> list[Path]:
    """The capture files a purge deletes: all of them, or those last written more than ``older_than_days`` ago."""
    folder = require_store(folder)
    if older_than_days is None:
        return capture_files(folder)
    return expired(folder, older_than_days * DAY, time.time() if now is None else now)

