"""Outputs that appear whole or not at all.

A stage writes into a hidden temporary folder next to its final output (same filesystem, so the final
step is a ``rename``), fsyncs it, and only then swaps it into place. An exception or Ctrl-C removes the
temporary folder and leaves the previous output untouched. Temporary folders carry the writer's pid, so a
later run can tell a crashed run's leftovers (removed) from a live concurrent writer's (kept).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from specbuild.errors import UsageError

_TMP_TAG = ".tmp-"
_OLD_TAG = ".old-"


def _scratch_name(final: Path, tag: str) -> Path:
    return final.with_name(f".{final.name}{tag}{os.getpid()}-{secrets.token_hex(4)}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _writer_pid(scratch: Path, final: Path, tag: str) -> int | None:
    prefix = f".{final.name}{tag}"
    if not scratch.name.startswith(prefix):
        return None
    pid_text = scratch.name[len(prefix):].split("-", 1)[0]
    return int(pid_text) if pid_text.isdigit() else None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_stale(final: Path) -> list[Path]:
    """Remove scratch copies of ``final`` left by crashed runs; returns what was removed.

    If a crash happened between moving the old output aside and renaming the new one in, the old output
    is put back rather than deleted.
    """
    final = Path(final)
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    for tag in (_TMP_TAG, _OLD_TAG):
        for scratch in sorted(final.parent.glob(f".{final.name}{tag}*")):
            pid = _writer_pid(scratch, final, tag)
            if pid is None or _pid_alive(pid):
                continue
            if tag == _OLD_TAG and not final.exists():
                os.rename(scratch, final)
                continue
            _remove(scratch)
            removed.append(scratch)
    return removed


def _fsync_path(path: Path, *, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` to disk (so a power cut cannot leave a renamed but empty tree)."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                _fsync_path(path, directory=False)
        _fsync_path(Path(folder), directory=True)


def _check_root(final: Path, root: str | Path | None) -> Path:
    if root is None:
        return final
    base = Path(root).resolve()
    resolved = final.resolve()
    if not resolved.is_relative_to(base):
        raise UsageError(f"output {final} is outside {base}", f"choose an output folder inside {base}")
    return resolved


@contextlib.contextmanager
def atomic_output_dir(final: str | Path, *, root: str | Path | None = None) -> Iterator[Path]:
    """Yield an empty hidden folder; on success it replaces ``final`` in one rename.

    ``final`` never shows a partial tree: it is the old output until the swap and the complete new one
    after. On any exception (KeyboardInterrupt included) the temporary folder is removed and the old
    output is left as it was. If ``final`` is a symlink to a folder, the folder it points to is replaced.
    With ``root``, ``final`` must resolve inside it.
    """
    final = _check_root(Path(final), root)
    if final.is_symlink():
        final = final.resolve()
    if final.exists() and not final.is_dir():
        raise UsageError(f"output {final} exists and is not a folder", "remove it or choose another output path")
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(final)
    scratch = _scratch_name(final, _TMP_TAG)
    scratch.mkdir()
    try:
        yield scratch
        fsync_tree(scratch)
        _swap_in(scratch, final)
    except BaseException:
        _remove(scratch)
        raise


def _swap_in(scratch: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = _scratch_name(final, _OLD_TAG)
        os.rename(final, old)
    try:
        os.rename(scratch, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    _fsync_path(final.parent, directory=True)
    if old is not None:
        _remove(old)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    scratch = _scratch_name(path, _TMP_TAG)
    try:
        with open(scratch, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    _fsync_path(path.parent, directory=True)


def atomic_write_bytes(path: str | Path, data: bytes, *, root: str | Path | None = None) -> Path:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``: readers see old or new, never half."""
    path = _check_root(Path(path), root)
    _atomic_write(path, data)
    return path


def atomic_write_text(path: str | Path, text: str, *, root: str | Path | None = None) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"), root=root)
