"""A traffic-trained draft's ``specbuild-capture.json``: read with its format checked, recorded in the manifest
(no store path, no content), refused by name when malformed, before compile runs any stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from specbuild.errors import CheckpointError
from specbuild.package.traffic_draft import PROVENANCE_FILE, read_traffic_provenance
from traffic_drafts import provenance


def _draft(folder: Path, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROVENANCE_FILE).write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return folder


def test_the_manifest_records_the_window_size_base_checksum_and_gain(tmp_path: Path):
    record = read_traffic_provenance(_draft(tmp_path, provenance())).manifest_record()
    assert record["capture"] == {"first_finished_at": "2026-12-01T00:00:00Z", "last_finished_at": "2026-12-05T23:59:00Z",
                                 "records": 1200, "bytes": 912345, "stores": 1}  # how many stores, not where
    assert record["base_draft"] == {"path": "/models/draft", "sha256": "ab" * 32}
    assert record["held_out"] == {"records": 120, "acceptance_before": {"1": 0.52, "4": 0.31},
                                  "acceptance_after": {"1": 0.66, "4": 0.45}, "predicted_speedup_before": {"4": 1.2},
                                  "predicted_speedup_after": {"4": 1.5}}
    assert record["bundled"]["prompts"] == 32
    assert "/var/lib/specbuild" not in json.dumps(record)


def test_a_draft_without_the_file_was_not_trained_on_traffic(tmp_path: Path):
    assert read_traffic_provenance(tmp_path) is None


@pytest.mark.parametrize("content, message", [
    (provenance(format=2), "is of format 2; this specbuild reads format 1"),
    ([1, 2], "is of format 'list'"),
    ("{not json", "is not a readable JSON file"),
    (provenance(**{"base_draft.sha256": "xyz"}), "base_draft.sha256: String should match pattern"),
    (provenance(**{"capture.records": None}), "capture.records: Field required"),
    (provenance(**{"held_out.acceptance_after": "high"}), "held_out.acceptance_after"),
    (provenance(**{"capture.first_finished_at": "yesterday"}), "capture.first_finished_at"),
])
def test_a_malformed_file_is_refused_by_name(tmp_path: Path, content: Any, message: str):
    with pytest.raises(CheckpointError, match=message) as caught:
        read_traffic_provenance(_draft(tmp_path, content))
    assert PROVENANCE_FILE in caught.value.message and "--from-capture" in caught.value.fix


def test_compile_refuses_a_malformed_file_before_any_stage_runs(tiny_pair, tmp_path: Path):
    from checkpoint_factory import pair_spec

    from specbuild import compiler

    draft = shutil.copytree(tiny_pair.draft_dir, tmp_path / "draft")
    _draft(draft, provenance(format=0))
    with pytest.raises(CheckpointError, match="format 0"):
        compiler.run(pair_spec(tmp_path / "release", tiny_pair.target_dir, draft))
    assert not (tmp_path / "release").exists()
