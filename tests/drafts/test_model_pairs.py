"""The shared pair machinery: the cached, atomic pair folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbuild.errors import UsageError
from specbuild.drafts.model_pairs import CACHE_ENV, CHECKPOINT_FILES, STAMP_FILE, cached_pair, load_pair, pair_dir


def _fake_build(calls: list[Path]):
    def build(root: Path) -> dict:
        calls.append(root)
        for role in ("target", "draft"):
            (root / role).mkdir()
            for name in CHECKPOINT_FILES:
                (root / role / name).write_text("{}")
        return {"figure": 1}
    return build


def test_cached_pair_builds_once_and_rebuilds_on_new_recipe(tmp_path):
    calls: list[Path] = []
    out = tmp_path / "pair"
    first = cached_pair(out, {"version": 1}, _fake_build(calls))
    again = cached_pair(out, {"version": 1}, _fake_build(calls))
    assert len(calls) == 1 and first.info == again.info == {"recipe": {"version": 1}, "figure": 1}
    assert first.target_dir == out / "target" and first.draft_dir == out / "draft"
    cached_pair(out, {"version": 2}, _fake_build(calls))
    assert len(calls) == 2
    assert json.loads((out / STAMP_FILE).read_text())["recipe"] == {"version": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair"]  # no staging or old folders left
    assert (out.stat().st_mode & 0o777) == 0o755


def test_incomplete_pair_is_not_returned(tmp_path):
    calls: list[Path] = []
    out = tmp_path / "pair"
    cached_pair(out, {"version": 1}, _fake_build(calls))
    (out / "draft" / "model.safetensors").unlink()
    assert load_pair(out, {"version": 1}) is None
    cached_pair(out, {"version": 1}, _fake_build(calls))
    assert len(calls) == 2


def test_failed_build_leaves_nothing(tmp_path):
    def broken(root: Path) -> dict:
        (root / "target").mkdir()
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        cached_pair(tmp_path / "pair", {"version": 1}, broken)
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_foreign_folder(tmp_path):
    out = tmp_path / "pair"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a specbuild model pair"):
        cached_pair(out, {"version": 1}, _fake_build([]))
    assert (out / "notes.txt").read_text() == "mine"


def test_one_cache_folder_for_the_demo_and_the_tests(tiny_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The demo (from its workdir) and the tests (from the repository root) build pairs into one folder."""
    from conftest import REPO_ROOT, TINY_CACHE_DIR, TINY_SEED

    # where `specbuild demo --tiny` looks from the root (a pair from another seed has a folder of its own)
    assert tiny_pair.root == (pair_dir("tiny", REPO_ROOT) if TINY_SEED == 0 else TINY_CACHE_DIR / "tiny-pair")
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert pair_dir("demo", tmp_path) == tmp_path / ".cache" / "demo-pair"
    assert pair_dir("tiny") == Path(".cache") / "tiny-pair"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "shared"))
    assert pair_dir("demo", tmp_path / "elsewhere") == tmp_path / "shared" / "demo-pair"
