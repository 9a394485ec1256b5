"""Content hashes: of files, of folder trees, and fingerprints of a stage's inputs.

Reads stream in 1 MiB blocks, so multi-GB weights never sit in memory. A :class:`HashCache` lets
repeated runs skip re-reading unchanged files (keyed by device, inode, size, mtime and ctime, like git's
index); files modified in the last few seconds are never cached, so an edit within the filesystem's
timestamp granularity cannot hide behind a stale entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Literal

from specbuild.errors import UsageError

SymlinkPolicy = Literal["refuse", "record", "follow"]

_BLOCK = 1 << 20
_RACY_NS = 3_000_000_000


class HashCache:
    """sha256 per file, trusted only while the file's identity and timestamps are unchanged."""

    def __init__(self, entries: dict[str, list[Any]] | None = None) -> None:
        self._entries = dict(entries or {})
        self._used: dict[str, list[Any]] = {}

    @staticmethod
    def _key(st: os.stat_result) -> list[int]:
        return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def lookup(self, path: Path, st: os.stat_result) -> str | None:
        entry = self._entries.get(str(path))
        if entry and entry[:-1] == self._key(st):
            self._used[str(path)] = entry
            return entry[-1]
        return None

    def store(self, path: Path, st: os.stat_result, digest: str) -> None:
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
            return
        self._entries[str(path)] = self._used[str(path)] = [*self._key(st), digest]

    def to_json(self) -> dict[str, list[Any]]:
        """The entries looked up or stored since loading (so files no longer hashed drop out)."""
        return dict(sorted(self._used.items()))


def sha256_file(path: str | Path, *, cache: HashCache | None = None) -> str:
    """Hex sha256 of a file's bytes (following a symlink to its target)."""
    path = Path(path)
    st = os.stat(path)
    real = path.resolve()
    if cache is not None and (hit := cache.lookup(real, st)) is not None:
        return hit
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    value = digest.hexdigest()
    if cache is not None:
        cache.store(real, st, value)
    return value


def hash_tree(
    root: str | Path,
    *,
    symlinks: SymlinkPolicy = "refuse",
    exclude: frozenset[str] | set[str] | tuple[str, ...] = (),
    cache: HashCache | None = None,
) -> dict[str, str]:
    """``{relative posix path: sha256}`` for every file under ``root``, sorted by path.

    Nothing is skipped silently: ``exclude`` names the only relative paths left out; a symlink is refused
    (``"refuse"``), recorded as ``"symlink:<target>"`` without being followed (``"record"``), or followed
    (``"follow"``, for inputs such as Hugging Face cache snapshots whose files are links to blobs);
    fifos, sockets and devices are refused. Empty folders hold no files and do not appear.
    """
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder", "check the path")
    excluded = frozenset(exclude)
    result: dict[str, str] = {}

    def walk(folder: Path, ancestors: frozenset[Path]) -> None:
        real = folder.resolve()
        if real in ancestors:
            raise UsageError(f"symlink loop at {folder}", "remove the link that points back into the tree")
        ancestors = ancestors | {real}
        with os.scandir(folder) as entries:
            for entry in entries:
                path = Path(entry.path)
                relative = path.relative_to(root).as_posix()
                if relative in excluded:
                    continue
                if entry.is_symlink() and symlinks != "follow":
                    if symlinks == "refuse":
                        raise UsageError(f"{path} is a symlink (to {os.readlink(path)})",
                                         "replace it with the file it points to")
                    result[relative] = f"symlink:{os.readlink(path)}"
                    continue
                try:
                    mode = os.stat(path).st_mode
                except FileNotFoundError:
                    raise UsageError(f"{path} is a broken symlink (to {os.readlink(path)})",
                                     "fix or remove the link") from None
                if stat.S_ISDIR(mode):
                    walk(path, ancestors)
                elif stat.S_ISREG(mode):
                    result[relative] = sha256_file(path, cache=cache)
                else:
                    raise UsageError(f"{path} is not a regular file or folder", "remove it from the tree")

    walk(root, frozenset())
    return dict(sorted(result.items()))


def digest_json(value: Any) -> str:
    """sha256 of the canonical JSON of ``value`` (sorted keys, no whitespace)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(value: Any, cache: HashCache | None) -> Any:
    if isinstance(value, Path):
        if value.is_dir():
            return {"$tree": digest_json(hash_tree(value, symlinks="follow", cache=cache))}
        if value.is_file():
            return {"$file": sha256_file(value, cache=cache)}
        return {"$missing": True}
    if hasattr(value, "model_dump"):  # pydantic models, e.g. a BuildSpec section
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"fingerprint: dict keys must be strings, got {list(value)!r}")
        return {key: _canonical(item, cache) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(item, cache) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"fingerprint: cannot hash a {type(value).__name__}; pass JSON values or Paths")


def fingerprint(*parts: Any, cache: HashCache | None = None) -> str:
    """A hex digest of JSON-able values in which every :class:`~pathlib.Path` stands for its content.

    A folder counts as the hashes of its files (symlinks followed), a file as its hash, a missing path
    as missing; the path string itself does not count, so moving an unchanged input changes nothing.
    """
    return digest_json(["specbuild.fingerprint/v1", [_canonical(part, cache) for part in parts]])
