"""The capture store on disk, and the writer each model instance appends its records with.

A store is one folder (mode 0700, never writable by others) of capture files (mode 0600), marked as a store by
:data:`MARKER` so that ``specbuild capture purge`` never deletes from a folder that is not one. Each model instance
writes its own file, named ``<UTC creation time>-<host>-<pid>-<instance>.jsonl`` (so a store's files sort oldest
first and no two writers share one), opened ``O_APPEND|O_CREAT|O_WRONLY``; each record is one ``os.write`` of one
line (:meth:`~specbuild.capture.records.CaptureRecord.to_line`). A file is closed and a new one begun past
``max_bytes`` or ``max_seconds``; files last written longer ago than ``retention_seconds`` are deleted.

Durability: the served path writes a row's record before the row's last response goes, so a record a client saw
acknowledged is in the file whole (the kernel has it); a killed process loses at most the record it was writing,
left as a torn last line that readers skip. No ``fsync``: a machine crash loses what the page cache had not yet
written back (the kernel's dirty-page writeback, about 30 s on Linux's defaults).

A write that fails (disk full, permissions, a store folder gone) drops that record: it is counted by cause, logged
once per cause, and never fails the request. A short write is cut back off, so the file never holds a torn line
before a whole one.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from specbuild.capture.records import FORMAT, SUFFIX, CaptureRecord, capture_files
from specbuild.errors import SpecbuildError

CAPTURE_DIR_ENV = "SPECBUILD_CAPTURE_DIR"  # where a capturing release's server writes (Triton's stubs inherit it)
CAPTURE_MOUNT = "/capture"  # the store inside a container or pod (mounted read-write there)
MARKER = ".specbuild-capture-store"  # written into a store when a writer opens it: what purge looks for
STORE_MODE = 0o700
FILE_MODE = 0o600
MIB = 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class CaptureStoreError(SpecbuildError):
    """A capture store folder that cannot be used: not a folder, writable by others, or not a store."""


@dataclass(frozen=True)
class Rotation:
    """When a writer begins a new file (past ``max_bytes``, or ``max_seconds`` after its file began) and how long
    files are kept (``retention_seconds`` after their last write)."""

    max_bytes: int
    max_seconds: float
    retention_seconds: float

    @classmethod
    def of(cls, *, max_file_mib: float, max_file_hours: float, retention_days: float) -> Rotation:
        """From the spec's capture section's units."""
        return cls(max_bytes=max(1, int(max_file_mib * MIB)), max_seconds=max_file_hours * 3600.0,
                   retention_seconds=retention_days * 86400.0)


def check_store_folder(folder: Path) -> None:
    """Refuse a store folder that is not a folder or that others may write (they could plant or swap files)."""
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CaptureStoreError(f"capture store {folder} is not a folder (a link or a file)",
                                "point the capture store at a real folder (SPECBUILD_CAPTURE_DIR, --capture-dir)")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CaptureStoreError(f"capture store {folder} is writable by others (mode {stat.S_IMODE(info.st_mode):o})",
                                f"chmod 700 {folder}, or choose a folder only you can write")


def refuse_inside_release(store: Path, repository: Path) -> None:
    """Refuse a store inside the release's repository: captured data must never enter a release (its manifest
    would not match, and a copy of the release would carry the traffic)."""
    if Path(store).resolve().is_relative_to(Path(repository).resolve()):
        raise CaptureStoreError(f"capture store {store} is inside the release {repository}: captured traffic must "
                                "never enter a release", "choose a capture folder outside the release (the default "
                                "is ~/.local/state/specbuild/capture/<release name>)")


def open_store(folder: Path) -> Path:
    """``folder`` made ready to hold captures (created mode 0700 with its parents, marked as a store), refused if
    others may write it; the folder, absolute."""
    folder = Path(folder).expanduser().absolute()
    folder.mkdir(mode=STORE_MODE, parents=True, exist_ok=True)
    check_store_folder(folder)
    marker = folder / MARKER
    if not marker.exists():
        descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.write(descriptor, f"{FORMAT}: a specbuild capture store; token ids are the text\n".encode())
        finally:
            os.close(descriptor)
    return folder


def default_store(release: str) -> Path:
    """Where ``specbuild serve`` keeps a release's captures unless told: ``$XDG_STATE_HOME`` (``~/.local/state``)
    ``/specbuild/capture/<release name>``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state) / "specbuild" / "capture" / release


def is_store(folder: Path) -> bool:
    """Whether ``folder`` is a capture store a writer opened (it holds the :data:`MARKER`)."""
    return (Path(folder) / MARKER).is_file()


def file_name(created: float, host: str, pid: int, instance: str) -> str:
    """A capture file's name: its UTC creation time first (to the microsecond, so names sort oldest first), then
    who writes it."""
    stamp = datetime.fromtimestamp(created, tz=timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    who = "-".join(_UNSAFE.sub("_", part) for part in (host, str(pid), instance))
    return f"{stamp}-{who}{SUFFIX}"


def expired(folder: Path, retention_seconds: float, now: float) -> list[Path]:
    """The capture files of ``folder`` last written more than ``retention_seconds`` before ``now``."""
    found = []
    for path in capture_files(folder):
        try:
            if now - path.stat().st_mtime > retention_seconds:
                found.append(path)
        except FileNotFoundError:  # deleted meanwhile (another instance's sweep, a purge)
            continue
    return found


def delete_files(paths: list[Path], *, keep: Path | None = None) -> list[Path]:
    """Delete ``paths`` but ``keep`` (a file being written); the ones deleted here (not already gone)."""
    deleted = []
    for path in paths:
        if path == keep:
            continue
        try:
            path.unlink()
            deleted.append(path)
        except FileNotFoundError:
            continue
    return deleted


class CaptureWriter:
    """One model instance's writer: appends records to its own file in ``store`` (see the module notes).

    ``clock`` is wall time (file names, ages, retention); ``warn`` logs a cause of drops once; ``host`` and
    ``pid`` name the files (this machine's, this process's by default). Not thread-safe: one instance's event
    loop calls it."""

    def __init__(self, store: Path, instance: str, rotation: Rotation, *, warn: Callable[[str], None],
                 clock: Callable[[], float] = time.time, host: str | None = None, pid: int | None = None) -> None:
        self.store = Path(store)
        self.instance = instance
        self.rotation = rotation
        self.warn = warn
        self.clock = clock
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.drops: Counter[str] = Counter()  # records dropped, by cause
        self.path: Path | None = None  # the file being written
        self._descriptor: int | None = None
        self._size = 0
        self._opened_at = 0.0
        self._next_sweep = 0.0
        self._warned: set[str] = set()  # causes already logged

    def write(self, record: CaptureRecord) -> int:
        """Append ``record``; the bytes written (0: dropped, counted in :attr:`drops`). Never raises OSError."""
        line = record.to_line()
        now = self.clock()
        self.sweep(now)
        try:
            descriptor = self._file_for(len(line), now)
            written = os.write(descriptor, line)
        except OSError as exc:
            self._drop(exc)
            return 0
        if written != len(line):  # disk full mid-line: cut the torn part off, so the next record starts a line
            self._cut(self._size)
            self._drop(OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)"))
            return 0
        self._size += written
        return written

    def close(self) -> None:
        if self._descriptor is not None:
            descriptor, self._descriptor, self.path = self._descriptor, None, None
            try:
                os.close(descriptor)
            except OSError:  # nothing is buffered here: every record was one write
                pass

    def _file_for(self, length: int, now: float) -> int:
        """The descriptor to append a ``length``-byte line to: the current file, or a new one past the limits."""
        if self._descriptor is not None and os.fstat(self._descriptor).st_nlink == 0:  # purged: begin a new one
            self.close()
        if self._descriptor is not None and self._size > 0 and (
                self._size + length > self.rotation.max_bytes or now - self._opened_at >= self.rotation.max_seconds):
            self.close()
        if self._descriptor is None:
            try:
                check_store_folder(self.store)  # opened safe, then changed: its records are dropped
            except CaptureStoreError as exc:
                raise PermissionError(errno.EPERM, exc.message) from None
            self._descriptor, self.path = self._create(now)
            self._size, self._opened_at = 0, now
        return self._descriptor

    def _create(self, now: float) -> tuple[int, Path]:
        """A new file of this writer's, never one that exists (a name taken, by a rotation within the same
        microsecond: the next microsecond's)."""
        flags = os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
        for step in range(1000):
            path = self.store / file_name(now + step * 1e-6, self.host, self.pid, self.instance)
            try:
                return os.open(path, flags, FILE_MODE), path
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, f"no free capture file name at {now}")

    def sweep(self, now: float | None = None) -> list[Path]:
        """Retention: delete the store's expired files (never the one being written), at most once an hour of
        ``now`` (the clock's); the files deleted."""
        now = self.clock() if now is None else now
        if now < self._next_sweep:
            return []
        self._next_sweep = now + min(3600.0, self.rotation.retention_seconds)
        try:
            return delete_files(expired(self.store, self.rotation.retention_seconds, now), keep=self.path)
        except OSError as exc:  # retention failing must not stop the capture: said once, tried again next time
            self._warn_once(f"retention {_cause(exc)}", f"capture: files past retention in {self.store} could not "
                            f"be deleted ({_cause(exc)}: {exc.strerror or exc}); delete them with `specbuild capture "
                            "purge`")
            return []

    def _cut(self, size: int) -> None:
        try:
            os.ftruncate(self._descriptor, size)  # type: ignore[arg-type]
        except OSError:  # the torn line stays; a new file begins, so it is that file's last line (readers skip it)
            self.close()

    def _drop(self, exc: OSError) -> None:
        cause = _cause(exc)
        self.drops[cause] += 1
        self._warn_once(cause, f"capture: a record was not written to {self.store} ({cause}: {exc.strerror or exc}); "
                        "the request was served; records are dropped while this lasts "
                        "(specbuild_capture_dropped_records_total counts them)")

    def _warn_once(self, cause: str, message: str) -> None:
        if cause not in self._warned:
            self._warned.add(cause)
            self.warn(message)


def _cause(exc: OSError) -> str:
    """An OS error's cause by its errno name (ENOSPC, EACCES, ...)."""
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
