"""The orchestrator's capture path: one :class:`~specbuild.capture.records.CaptureRecord` per finished row of a
request that did not opt out (its ``store`` setting), written before the row's last response goes, so a record
whose request was answered exists whole (:mod:`specbuild.capture.store` says what that guarantees).

A release captures when its spec's capture section is enabled (the orchestrator's ``capture`` parameter); its
server names the store with the environment variable :data:`~specbuild.capture.store.CAPTURE_DIR_ENV`, which the
python stubs inherit (``specbuild serve --capture-dir``; ``/capture`` in a container and in Kubernetes). A
capturing release without it does not load: it never captures somewhere nobody chose.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from specbuild.capture.records import CaptureRecord
from specbuild.capture.store import (CAPTURE_DIR_ENV, CaptureStoreError, CaptureWriter, Rotation, open_store,
                                     refuse_inside_release)
from specbuild.package.contract import MANIFEST_NAME, OrchestratorParameters
from specbuild.speculation.stats import CAPTURE_SECONDS
from specbuild.triton_models.orchestrator_requests import OrchestratorRowProgress


class Counts(Protocol):
    """The metrics the capture path feeds (the orchestrator's :class:`~specbuild.triton_models.metrics.Metrics`)."""

    def count(self, key: str, value: float = 1.0) -> None: ...

    def observe(self, key: str, value: float) -> None: ...


class RequestCapture:
    """Writes finished rows of ``release`` (its manifest's sha256, served with the tokenizer ``tokenizer``) through
    ``writer``, counting each record written or dropped, its bytes and the time it took in ``metrics``."""

    def __init__(self, writer: CaptureWriter, *, release: str, tokenizer: str, metrics: Counts,
                 clock: Callable[[], float] = time.time) -> None:
        self.writer = writer
        self.release = release
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.clock = clock

    def write(self, row: OrchestratorRowProgress) -> None:
        """Capture a finished row whose rounds were kept (:meth:`start` made it a captured row); never raises for
        a write that fails (the writer drops and counts it)."""
        started = time.perf_counter()
        record = CaptureRecord(
            prompt_ids=tuple(row.row.generation.prompt_ids), output_ids=tuple(row.token_ids),
            sampling=row.row.sampling_settings(), rounds=tuple(row.rounds or ()),
            finish_reason=str(row.finish_reason), release=self.release, tokenizer=self.tokenizer,
            finished_at=self.clock(), instance=self.writer.instance)
        written = self.writer.write(record)
        self.metrics.count("captured" if written else "capture_drops")
        self.metrics.count("capture_bytes", float(written))
        self.metrics.observe(CAPTURE_SECONDS.key, time.perf_counter() - started)

    @staticmethod
    def start(row: OrchestratorRowProgress) -> None:
        """Keep ``row``'s rounds if it may be captured (it did not opt out)."""
        if row.row.store:
            row.rounds = []


def release_checksum(repository: Path) -> str:
    """The sha256 of the release's ``manifest.json`` (``repository``: the model repository holding it)."""
    path = repository / MANIFEST_NAME
    if not path.is_file():
        raise CaptureStoreError(f"this release captures traffic but {path} is missing, so its records could not name "
                                "the release that served them", "serve the repository `specbuild compile` or "
                                "`specbuild package` wrote, manifest.json included")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def capture_for(settings: OrchestratorParameters, repository: Path, instance: str, metrics: Counts,
                warn: Callable[[str], None], environment: Mapping[str, str] = os.environ) -> RequestCapture | None:
    """The capture path of an orchestrator instance of the release in ``repository`` (None: the release captures
    nothing); a capturing release whose server names no store is refused, naming the fix. Files past retention
    are deleted here, as the instance starts, and then as it writes."""
    if not settings.capture:
        return None
    folder = environment.get(CAPTURE_DIR_ENV, "")
    if not folder:
        raise CaptureStoreError(f"this release captures traffic (its spec's capture.enabled) but {CAPTURE_DIR_ENV} "
                                "is not set, so there is no store to write to",
                                f"serve it with `specbuild serve` (--capture-dir), or set {CAPTURE_DIR_ENV} to a "
                                "folder only the server's user may write; or package it with capture.enabled: false")
    rotation = Rotation.of(max_file_mib=settings.capture_max_file_mib, max_file_hours=settings.capture_max_file_hours,
                           retention_days=settings.capture_retention_days)
    refuse_inside_release(Path(folder), repository)
    try:
        store = open_store(Path(folder))
    except OSError as exc:
        raise CaptureStoreError(f"the capture store {folder} ({CAPTURE_DIR_ENV}) cannot be made: {exc.strerror or exc}",
                                "name a folder the server's user may create and write") from None
    writer = CaptureWriter(store, instance, rotation, warn=warn)
    writer.sweep()
    return RequestCapture(writer, release=release_checksum(repository), tokenizer=settings.tokenizer_hash,
                          metrics=metrics)
