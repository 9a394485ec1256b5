"""Files in parts, for machines that move files of limited size (a lent GPU machine takes 64 MiB a call and gives
back 16 MiB a file): ``NAME.part-00``, ``NAME.part-01``, ... in order, as ``split -d -b SIZE NAME NAME.part-``
names them, the whole file's sha256 in a ``SHA256SUMS`` beside them, and one shell line that puts it back
together and checks it. Standard library only: the GPU scripts (``scripts/gpu-*.sh``) use it on a bare machine.
"""

from __future__ import annotations

import glob
import re
import shutil
from pathlib import Path

from specbuild.errors import UsageError
from specbuild.stages.hashing import sha256_file

CHECKSUMS = "SHA256SUMS"
_SIZE = re.compile(r"^(\d+)\s*([KMG]i?B?|B)?$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """Bytes from ``16M``, ``15MiB``, ``500K`` or a plain number (binary units); a :class:`UsageError` otherwise."""
    match = _SIZE.match(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise UsageError(f"--part-size {text!r} is not a size",
                         "give bytes or a size such as 15M or 500K (binary units)")
    return int(match.group(1)) * _UNITS[(match.group(2) or "")[:1].upper()]


def read_checksums(path: Path) -> dict[str, str]:
    """``sha256sum`` lines (``HASH  NAME``) as {name: hash}; a ValueError for a line that is not one."""
    recorded = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            recorded[name.lstrip("*")] = digest
    return recorded


def part_paths(path: Path) -> list[Path]:
    """The parts of ``path`` beside it, in order (none where it was not split)."""
    return sorted(path.parent.glob(f"{glob.escape(path.name)}.part-*"))


def reassembly(path: Path) -> str:
    """The one shell line, run in the file's folder, that joins its parts and checks the whole against SHA256SUMS."""
    return f"cat {path.name}.part-* > {path.name} && sha256sum -c --ignore-missing {CHECKSUMS}"


def split(path: Path, part_size: int) -> list[Path]:
    """Replace ``path`` by its parts of at most ``part_size`` bytes (a file no larger stays whole: no parts).
    The whole file's checksum must already be in the ``SHA256SUMS`` beside it; that is what the joined file is
    checked against."""
    if path.stat().st_size <= part_size:
        return []
    parts = []
    with path.open("rb") as source:
        while block := source.read(part_size):
            part = path.with_name(f"{path.name}.part-{len(parts):02d}")
            part.write_bytes(block)
            parts.append(part)
    path.unlink()
    return parts


def joined(path: Path) -> Path:
    """``path`` itself, or, where only its parts are there, ``path`` joined from them beside them and checked
    against the ``SHA256SUMS`` there when it lists the file; a :class:`UsageError` when neither is there or the
    joined bytes do not match."""
    if path.exists():
        return path
    parts = part_paths(path)
    if not parts:
        raise UsageError(f"{path} is missing, and so are its parts ({path.name}.part-00, ...)",
                         "give a file that is there, or copy all its parts beside each other")
    partial = path.with_name(f"{path.name}.joining")
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as source:
                shutil.copyfileobj(source, out)
    checksums = path.parent / CHECKSUMS
    expected = read_checksums(checksums).get(path.name) if checksums.is_file() else None
    if expected is not None and (actual := sha256_file(partial)) != expected:
        partial.unlink()
        raise UsageError(f"{path.name} joined from {len(parts)} parts has sha256 {actual}, {checksums} says {expected}",
                         "a part is missing or damaged: copy the parts again")
    partial.replace(path)
    return path


def joined_folder(folder: Path) -> Path:
    """``folder`` with each file that is there only as parts joined (:func:`joined`)."""
    for first in sorted(folder.glob("*.part-00")):
        joined(first.with_name(first.name.removesuffix(".part-00")))
    return folder
