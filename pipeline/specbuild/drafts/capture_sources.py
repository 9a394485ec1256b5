"""What ``specbuild draft --from-capture`` reads and writes outside its run: capture stores, a release's models,
and the held-out records it leaves in each store for ``bench`` to replay.

Only records made with the target's tokenizer are used (their ids mean other text under any other); the rest
are counted by tokenizer checksum. Held-out records go back into the store they came from, in a ``held-out/``
subfolder (not read as capture: a store's capture files are its top level), so they stay in the store's access
domain and ``specbuild capture purge`` removes them with it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.capture.records import SUFFIX, CaptureRecord, capture_files, read_file
from specbuild.errors import CheckpointError, UsageError
from specbuild.stages.atomic import atomic_write_bytes

HELD_OUT_FOLDER = "held-out"
PRIVATE_FOLDER, PRIVATE_FILE = 0o700, 0o600  # captured ids are the text: the owner only


@dataclass(frozen=True)
class CapturedTraffic:
    """The usable records of the stores (in store order, each store's files oldest first), each with the index of
    its store, and what was left out."""

    records: tuple[CaptureRecord, ...]
    stores: tuple[int, ...]
    other_tokenizers: dict[str, int] = field(default_factory=dict)  # checksum -> records made with it
    without_answer: int = 0
    bytes: int = 0  # of the usable records, as stored


def read_capture(stores: Sequence[Path], tokenizer: str) -> CapturedTraffic:
    """The records of ``stores`` made with the ``tokenizer`` checksum that have an answer; a clear error where a
    store is not one, holds nothing, or no record is usable."""
    records: list[CaptureRecord] = []
    indices: list[int] = []
    others: Counter[str] = Counter()
    without_answer = size = 0
    for index, store in enumerate(stores):
        if not store.is_dir():
            raise UsageError(f"--from-capture {store} is not a folder", "pass a capture store (a folder of "
                             f"*{SUFFIX} files written by a release with capture on)")
        files = capture_files(store)
        found = 0
        for path in files:
            for record in read_file(path):
                found += 1
                if record.tokenizer != tokenizer:
                    others[record.tokenizer] += 1
                elif not record.output_ids:
                    without_answer += 1
                else:
                    records.append(record)
                    indices.append(index)
                    size += len(record.to_line())
        if not found:
            raise UsageError(f"the capture store {store} holds no records ({len(files)} capture files)",
                             "serve traffic with capture on first, or pass the store that holds it")
    if not records:
        mismatch = ", ".join(f"{count} made with tokenizer {checksum[:12]}" for checksum, count in others.items())
        raise UsageError(f"no captured record can train this draft: {mismatch or 'none'}"
                         f"{f', {without_answer} without an answer' if without_answer else ''}; the target's "
                         f"tokenizer is {tokenizer[:12]}",
                         "pass the target (or --release) whose traffic the stores captured")
    return CapturedTraffic(tuple(records), tuple(indices), dict(others), without_answer, size)


def release_models(repository: Path) -> tuple[Path, Path]:
    """The target and draft checkpoints of a release (a torch release's engines are its checkpoints, copied; another
    runtime's release points at the checkpoints it was compiled from)."""
    from specbuild.doctor.checked_release import FoundRelease, Unreadable

    try:
        release = FoundRelease(repository, None, {})
    except Unreadable as exc:
        raise UsageError(f"--release {repository} is not a specbuild release repository ({exc})",
                         "pass the triton_repo folder that `specbuild compile` wrote") from None
    found = {}
    for role in ("target", "draft"):
        path, looked = release.checkpoint(role)
        if path is None:
            raise CheckpointError(f"the release {repository} has no {role} checkpoint here (looked in "
                                  f"{', '.join(looked) or 'nothing it names'})",
                                  "pass TARGET and --base with the checkpoints instead of --release")
        found[role] = path
    return found["target"], found["draft"]


def write_held_out(store: Path, name: str, records: Sequence[CaptureRecord]) -> Path:
    """``store/held-out/<name>.jsonl``: the records, owner-only (the folder is made owner-only first, so the file is
    never readable by anyone else, not even before its mode is set)."""
    folder = store / HELD_OUT_FOLDER
    folder.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
    os.chmod(folder, PRIVATE_FOLDER)
    path = atomic_write_bytes(folder / f"{name}{SUFFIX}", b"".join(record.to_line() for record in records))
    os.chmod(path, PRIVATE_FILE)
    return path
