"""Atomic outputs: a failed or interrupted write leaves the previous output; config paths stay in their root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specbuild.stages.atomic import atomic_output_dir, atomic_write_text, clean_stale
from specbuild.errors import UsageError

DEAD_PID = 2**22 + 12345  # above the kernel's pid_max default range: never a live process


def _old_output(final: Path) -> None:
    final.mkdir(parents=True)
    (final / "weights.bin").write_bytes(b"old weights")


def _siblings(final: Path) -> list[str]:
    return sorted(path.name for path in final.parent.iterdir())


def test_success_replaces_old_output_whole(tmp_path: Path) -> None:
    final = tmp_path / "engines"
    _old_output(final)
    with atomic_output_dir(final) as scratch:
        assert scratch.parent == final.parent and scratch.name.startswith(".engines.tmp-")
        (scratch / "target").mkdir()
        (scratch / "target" / "rank0.engine").write_bytes(b"new")
        # Until the block ends, the final name still shows the old, complete output.
        assert (final / "weights.bin").read_bytes() == b"old weights"
        assert not (final / "target").exists()
    assert sorted(p.relative_to(final).as_posix() for p in final.rglob("*")) == ["target", "target/rank0.engine"]
    assert _siblings(final) == ["engines"]


@pytest.mark.parametrize("interruption", [RuntimeError("convert crashed"), KeyboardInterrupt()])
def test_interrupted_write_keeps_old_output(tmp_path: Path, interruption: BaseException) -> None:
    final = tmp_path / "engines"
    _old_output(final)
    with pytest.raises(type(interruption)):
        with atomic_output_dir(final) as scratch:
            (scratch / "half.engine").write_bytes(b"partial")
            raise interruption
    assert [p.name for p in final.iterdir()] == ["weights.bin"]
    assert (final / "weights.bin").read_bytes() == b"old weights"
    assert _siblings(final) == ["engines"]


def test_interrupted_first_write_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "out" / "triton_repo"
    with pytest.raises(KeyboardInterrupt):
        with atomic_output_dir(final) as scratch:
            (scratch / "ensemble").mkdir()
            raise KeyboardInterrupt
    assert not final.exists()
    assert _siblings(final) == []


def test_stale_scratch_of_a_dead_run_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    final = tmp_path / "engines"
    _old_output(final)
    dead = tmp_path / f".engines.tmp-{DEAD_PID}-abcd"
    live = tmp_path / f".engines.tmp-{os.getppid()}-abcd"
    for scratch in (dead, live):
        scratch.mkdir()
        (scratch / "partial").write_text("x")
    assert clean_stale(final) == [dead]
    assert live.exists() and (final / "weights.bin").exists()


def test_crash_between_renames_restores_the_old_output(tmp_path: Path) -> None:
    final = tmp_path / "engines"
    _old_output(final)
    os.rename(final, tmp_path / f".engines.old-{DEAD_PID}-abcd")  # as a crash right after moving it aside
    clean_stale(final)
    assert (final / "weights.bin").read_bytes() == b"old weights"
    assert _siblings(final) == ["engines"]


def test_symlinked_output_replaces_the_folder_it_points_to(tmp_path: Path) -> None:
    real = tmp_path / "disk" / "engines"
    _old_output(real)
    link = tmp_path / "engines"
    link.symlink_to(real)
    with atomic_output_dir(link) as scratch:
        (scratch / "new").write_text("n")
    assert link.is_symlink() and [p.name for p in link.iterdir()] == ["new"]


def test_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    final = tmp_path / "engines"
    final.write_text("not a folder")
    with pytest.raises(UsageError, match="not a folder"):
        with atomic_output_dir(final):
            pass
    assert final.read_text() == "not a folder"


def test_atomic_write_text_replaces_and_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "repo" / "manifest.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert _siblings(path) == ["manifest.json"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_output_outside_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="outside"):
        with atomic_output_dir(tmp_path / "root" / ".." / "elsewhere", root=tmp_path / "root"):
            pass
    assert not (tmp_path / "elsewhere").exists()
