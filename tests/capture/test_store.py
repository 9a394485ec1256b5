"""The capture store: one file per writer, 0600 in a 0700 folder, rotation by size and age, retention, torn tails,
drops that never raise, and the store's inventory (show, purge's candidates)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest

from specbuild.capture import store as store_module
from specbuild.capture.inventory import purge_candidates, require_store, summarize
from specbuild.capture.records import CaptureFormatError, CaptureRecord, capture_files, read_records
from specbuild.capture.store import (MARKER, CaptureStoreError, CaptureWriter, Rotation, default_store, delete_files,
                                     file_name, open_store, refuse_inside_release)

START = 1_800_000_000.0  # 2027-01-15, a fixed wall clock
BIG = Rotation(max_bytes=1 << 30, max_seconds=1e9, retention_seconds=1e9)


class Clock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(index: int = 0, finished_at: float = START, release: str = "r" * 64) -> CaptureRecord:
    return CaptureRecord(prompt_ids=(1, 2, index), output_ids=(7, 8, 9), sampling={"temperature": 0.0, "top_k": 1},
                         rounds=((4, 2), (0, 0)), finish_reason="length", release=release, tokenizer="t" * 64,
                         finished_at=finished_at, instance="orchestrator_0_0")


def writer(folder: Path, rotation: Rotation = BIG, clock: Clock | None = None,
           warnings: list[str] | None = None) -> CaptureWriter:
    log = warnings if warnings is not None else []
    return CaptureWriter(open_store(folder), "orchestrator_0_0", rotation, warn=log.append, clock=clock or Clock(),
                         host="host-a", pid=42)


def test_records_land_whole_in_an_owner_only_file_named_by_time_and_writer(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    capture = writer(folder)
    sizes = [capture.write(record(index)) for index in range(3)]
    assert all(size == len(record(index).to_line()) for index, size in enumerate(sizes))
    (path,) = capture_files(folder)
    assert path.name == "20270115T080000.000000Z-host-a-42-orchestrator_0_0.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert [item.prompt_ids for item in read_records([folder])] == [(1, 2, 0), (1, 2, 1), (1, 2, 2)]
    assert path.stat().st_size == sum(sizes) and not capture.drops
    assert (folder / MARKER).is_file() and require_store(folder) == folder


def test_a_name_keeps_only_safe_characters() -> None:
    assert file_name(START, "a b/c", 7, "orch 0") == "20270115T080000.000000Z-a_b_c-7-orch_0.jsonl"


def test_a_file_rotates_past_its_size_and_after_its_hours(tmp_path: Path) -> None:
    line = len(record().to_line())
    clock = Clock()
    capture = writer(tmp_path, Rotation(max_bytes=2 * line, max_seconds=3600, retention_seconds=1e9), clock)
    for _ in range(3):  # two fit the first file; the third begins a second one
        capture.write(record())
        clock.now += 1
    assert [sum(1 for _ in read_records([path])) for path in capture_files(tmp_path)] == [2, 1]
    clock.now += 3600  # the second file's hour is up: the next record begins a third, under 2 lines or not
    capture.write(record())
    assert [sum(1 for _ in read_records([path])) for path in capture_files(tmp_path)] == [2, 1, 1]


def test_retention_deletes_files_last_written_before_it_but_never_the_one_being_written(tmp_path: Path) -> None:
    clock = Clock()
    day = 86400.0
    capture = writer(tmp_path, Rotation(max_bytes=1 << 30, max_seconds=day, retention_seconds=2 * day), clock)
    old = tmp_path / "20270101T000000.000000Z-other-1-orchestrator_0_0.jsonl"
    old.write_bytes(record().to_line())
    os.utime(old, (START - 3 * day, START - 3 * day))
    capture.write(record())
    assert old not in capture_files(tmp_path) and len(capture_files(tmp_path)) == 1
    clock.now += 10 * day  # its own file is past retention now, but it is the file being written: kept
    current = capture.path
    os.utime(current, (START, START))
    assert capture.sweep() == [] and current.exists()
    capture.write(record(1))  # its day is up: a new file begins (no sweep again within the hour)
    assert capture.path != current and current.exists()
    clock.now += 3601
    capture.write(record(2))  # the next sweep deletes it
    assert not current.exists()


def test_a_killed_writers_torn_last_line_is_skipped_and_the_next_writer_starts_clean(tmp_path: Path) -> None:
    capture = writer(tmp_path)
    for index in range(2):
        capture.write(record(index))
    with open(capture.path, "ab") as handle:  # killed in its third write
        handle.write(record(2).to_line()[:25])
    assert [item.prompt_ids[-1] for item in read_records([tmp_path])] == [0, 1]


def test_a_torn_line_before_a_whole_one_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "20270101T000000.000000Z-h-1-i.jsonl"
    path.write_bytes(record().to_line()[:30] + record().to_line())
    with pytest.raises(CaptureFormatError, match=f"{path.name}:1"):
        list(read_records([path]))


def test_a_short_write_is_cut_back_off_and_counted_as_a_drop(tmp_path: Path, monkeypatch) -> None:
    warnings: list[str] = []
    capture = writer(tmp_path, warnings=warnings)
    capture.write(record(0))
    real = os.write
    monkeypatch.setattr(store_module.os, "write", lambda fd, data: real(fd, data[:10]))
    assert capture.write(record(1)) == 0
    monkeypatch.setattr(store_module.os, "write", real)
    capture.write(record(2))
    assert [item.prompt_ids[-1] for item in read_records([tmp_path])] == [0, 2]
    assert capture.drops == {"ENOSPC": 1} and len(warnings) == 1


def test_an_unwritable_store_drops_records_counts_them_and_warns_once_per_cause(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes any folder")
    warnings: list[str] = []
    capture = writer(tmp_path / "store", warnings=warnings)
    (tmp_path / "store").chmod(0o500)
    try:
        assert [capture.write(record(index)) for index in range(3)] == [0, 0, 0]
    finally:
        (tmp_path / "store").chmod(0o700)
    assert capture.drops == {"EACCES": 3}
    assert len(warnings) == 1 and "EACCES" in warnings[0] and "specbuild_capture_dropped_records_total" in warnings[0]
    assert "1, 2" not in warnings[0]  # where and why, never what: no token ids in the log
    assert capture.write(record(3)) > 0  # writable again: capture goes on


def test_a_full_disk_or_a_store_gone_drops_records_and_the_writer_goes_on(tmp_path: Path, monkeypatch) -> None:
    warnings: list[str] = []
    capture = writer(tmp_path / "store", warnings=warnings)

    def full(descriptor: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "write", full)
    assert capture.write(record(0)) == 0 and capture.write(record(1)) == 0
    monkeypatch.undo()
    capture.close()
    shutil.rmtree(tmp_path / "store")
    assert capture.write(record(2)) == 0
    assert capture.drops == {"ENOSPC": 2, "ENOENT": 1} and len(warnings) == 2
    assert all("the request was served" in line for line in warnings)


def test_a_store_others_may_write_or_a_link_is_refused_by_name(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CaptureStoreError, match=f"{shared} is writable by others") as error:
        open_store(shared)
    assert "chmod 700" in error.value.fix
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(CaptureStoreError, match="not a folder"):
        open_store(tmp_path / "link")


def test_a_store_changed_to_others_writable_after_opening_drops_instead_of_writing(tmp_path: Path) -> None:
    capture = writer(tmp_path / "store")
    (tmp_path / "store").chmod(0o777)
    assert capture.write(record()) == 0 and capture.drops == {"EPERM": 1}


def test_after_a_purge_of_its_file_a_writer_begins_a_new_one(tmp_path: Path) -> None:
    capture = writer(tmp_path)
    capture.write(record(0))
    delete_files(capture_files(tmp_path))
    capture.write(record(1))
    assert [item.prompt_ids[-1] for item in read_records([tmp_path])] == [1]


def test_a_store_inside_the_release_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CaptureStoreError, match="captured traffic must never enter a release"):
        refuse_inside_release(tmp_path / "triton_repo" / "capture", tmp_path / "triton_repo")
    refuse_inside_release(tmp_path / "capture", tmp_path / "triton_repo")


def test_the_default_store_is_under_the_state_folder(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_store("demo") == tmp_path / "specbuild" / "capture" / "demo"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_store("demo") == Path.home() / ".local" / "state" / "specbuild" / "capture" / "demo"


def test_rotation_from_the_spec_units() -> None:
    assert Rotation.of(max_file_mib=0.5, max_file_hours=2, retention_days=1.5) == Rotation(524288, 7200.0, 129600.0)


# --- inventory ---------------------------------------------------------------------------------------------------
def test_show_counts_files_records_bytes_window_and_releases(tmp_path: Path) -> None:
    line = len(record().to_line())
    capture = writer(tmp_path, Rotation(max_bytes=2 * line, max_seconds=1e9, retention_seconds=1e9))
    for index, release in enumerate(("a" * 64, "a" * 64, "b" * 64)):
        capture.write(record(index, finished_at=START + index, release=release))
    summary = summarize(tmp_path)
    assert (summary.files, summary.records, summary.bytes) == (2, 3, 3 * line)
    assert (summary.first, summary.last) == (START, START + 2)
    assert summary.releases == {"a" * 64: 2, "b" * 64: 1}
    assert summary.to_dict()["first"] == "2027-01-15T08:00:00+00:00"


def test_purge_candidates_are_every_capture_file_or_the_old_ones(tmp_path: Path) -> None:
    capture = writer(tmp_path)
    capture.write(record())
    old = tmp_path / "20200101T000000.000000Z-h-1-i.jsonl"
    old.write_bytes(record().to_line())
    os.utime(old, (START - 9 * 86400, START - 9 * 86400))
    os.utime(capture.path, (START, START))
    assert purge_candidates(tmp_path) == [old, capture.path]
    assert purge_candidates(tmp_path, older_than_days=7, now=START + 60) == [old]


@pytest.mark.parametrize("make", ["missing", "plain"])
def test_a_folder_that_is_not_a_store_is_refused(tmp_path: Path, make: str) -> None:
    folder = tmp_path / "home"
    if make == "plain":
        folder.mkdir()
        (folder / "notes.jsonl").write_text("{}\n")
    with pytest.raises(CaptureStoreError, match="not a (capture store|folder)"):
        purge_candidates(folder)
    with pytest.raises(CaptureStoreError):
        summarize(folder)
