"""``specbuild capture show`` and ``purge``: thin over the inventory, a question before deleting, and a folder that
is not a capture store refused."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from specbuild.capture.records import CaptureRecord, capture_files
from specbuild.capture.store import CaptureWriter, Rotation, open_store
from specbuild.cli import main


def store_with_records(folder: Path, count: int) -> Path:
    writer = CaptureWriter(open_store(folder), "orchestrator_0_0", Rotation(1 << 20, 3600.0, 86400.0),
                           warn=print)
    for index in range(count):
        writer.write(CaptureRecord(prompt_ids=(1, index), output_ids=(2, 3), sampling={"top_k": 1}, rounds=((2, 1),),
                                   finish_reason="length", release="a" * 64, tokenizer="t" * 64,
                                   finished_at=1_800_000_000.0 + index, instance="orchestrator_0_0"))
    return folder


def test_show_describes_a_store_without_its_traffic(tmp_path: Path) -> None:
    store = store_with_records(tmp_path / "store", 3)
    result = CliRunner().invoke(main, ["capture", "show", str(store), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert (shown["files"], shown["records"], shown["releases"]) == (1, 3, {"a" * 64: 3})
    assert shown["first"] == "2027-01-15T08:00:00+00:00" and shown["last"] == "2027-01-15T08:00:02+00:00"
    assert "prompt_ids" not in result.stdout


def test_purge_asks_first_and_deletes_only_on_yes(tmp_path: Path) -> None:
    store = store_with_records(tmp_path / "store", 2)
    declined = CliRunner().invoke(main, ["capture", "purge", str(store)], input="n\n")
    assert declined.exit_code == 1 and len(capture_files(store)) == 1
    confirmed = CliRunner().invoke(main, ["capture", "purge", str(store)], input="y\n")
    assert confirmed.exit_code == 0 and "deleted 1 capture files" in confirmed.output
    assert capture_files(store) == [] and (store / ".specbuild-capture-store").is_file()  # still a store


def test_purge_older_than_keeps_recent_files(tmp_path: Path) -> None:
    store = store_with_records(tmp_path / "store", 1)
    result = CliRunner().invoke(main, ["capture", "purge", str(store), "--older-than", "1", "--yes", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["deleted"] == []
    assert len(capture_files(store)) == 1


def test_purge_refuses_a_folder_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "keep.jsonl").write_text("{}\n")
    result = CliRunner().invoke(main, ["capture", "purge", str(tmp_path), "--yes", "--json"])
    assert result.exit_code == 1 and "is not a capture store" in json.loads(result.stdout)["error"]
    assert (tmp_path / "keep.jsonl").is_file()
