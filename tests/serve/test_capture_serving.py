"""``specbuild serve`` of a capturing release: the store it names (``--capture-dir``, else the state folder's), what
it says about it, and the stores it refuses (inside the release; for a release that captures nothing)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from specbuild.cli import main
from specbuild.serve.release_serving import capture_notice


def serve_dry_run(repository: Path, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["serve", str(repository), "--dry-run", "--json", *options])
    return result.exit_code, result.stdout


def test_a_capturing_release_is_served_with_its_store_named(capturing_repository, tmp_path: Path) -> None:
    code, out = serve_dry_run(capturing_repository, "--capture-dir", str(tmp_path / "store"))
    assert code == 0, out
    assert f"SPECBUILD_CAPTURE_DIR={tmp_path / 'store'} " in json.loads(out)["script"]
    assert not (tmp_path / "store").exists()  # a dry run makes nothing


def test_the_default_store_is_the_state_folders_and_the_notice_says_what_and_how_to_purge(
        capturing_repository, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    notice = capture_notice(capturing_repository, "tiny", None)
    assert notice is not None and notice.store == tmp_path / "specbuild" / "capture" / "tiny"
    text = "\n".join(notice.lines())
    assert "token ids (the text" in text and "0600" in text and "store=false" in text
    assert f"specbuild capture purge {notice.store}" in text and "30 days" in text


def test_a_store_inside_the_release_is_refused(capturing_repository) -> None:
    code, out = serve_dry_run(capturing_repository, "--capture-dir", str(capturing_repository / "capture"))
    assert code == 1 and "captured traffic must never enter a release" in json.loads(out)["error"]


def test_a_capture_dir_for_a_release_that_captures_nothing_is_a_usage_error(tiny_repository, tmp_path) -> None:
    code, out = serve_dry_run(tiny_repository, "--capture-dir", str(tmp_path))
    assert code == 2 and "captures nothing" in json.loads(out)["error"]
    assert capture_notice(tiny_repository, "tiny", None) is None
