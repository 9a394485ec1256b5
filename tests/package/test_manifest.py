"""manifest.json and `specbuild verify`: every changed, missing or extra file is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.errors import UsageError, VerificationError
from specbuild.package.manifest import MANIFEST_FORMAT, checkpoint_identity, toolchain, verify, write_manifest
from specbuild.spec import load_spec
from specbuild.stages.runner import StageResult

TOOLCHAIN = {"python": "3.11", "packages": {"specbuild": "0.1.0"}, "gpus": []}


def _release(root: Path) -> tuple[Path, Path]:
    engines, repository = root / "engines", root / "triton_repo"
    (engines / "target").mkdir(parents=True)
    (engines / "target" / "rank0.engine").write_bytes(b"\x01\x02\x03engine")
    (engines / "draft").mkdir()
    (engines / "draft" / "rank0.engine").write_bytes(b"draft")
    for model in ("ensemble", "orchestrator"):
        (repository / model / "1").mkdir(parents=True)
        (repository / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    (repository / "orchestrator" / "1" / "model.py").write_text("print('hi')\n")
    return engines, repository


def _write(root: Path, **overrides) -> Path:
    engines, repository = _release(root) if not (root / "engines").exists() else (root / "engines", root / "triton_repo")
    spec = load_spec(overrides={"target.checkpoint": "/models/target", "draft.checkpoint": "/models/draft"})
    arguments = dict(
        spec=spec,
        inputs={"target": {"path": "/models/target", "config_sha256": "ab"}},
        steps=[StageResult("build", "ok", 1.5, "f" * 64, engines, "ran: first run", {"big": "report"})],
        compatibility={"ok": True, "vocab_size": 49152},
        toolchain_info=TOOLCHAIN,
    )
    arguments.update(overrides)
    return write_manifest(repository, engines, **arguments)


def test_manifest_holds_the_release(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert path == (tmp_path / "triton_repo" / "manifest.json").resolve()
    manifest = json.loads(path.read_text())
    assert manifest["format"] == MANIFEST_FORMAT
    # every path from the repository folder: the unit a pipeline uploads, the engines beside it
    assert "root" not in manifest and manifest["trees"] == {"repository": ".", "engines": "../engines"}
    assert list(manifest["files"]) == [
        "../engines/draft/rank0.engine", "../engines/target/rank0.engine", "ensemble/config.pbtxt",
        "orchestrator/1/model.py", "orchestrator/config.pbtxt",
    ]
    assert manifest["spec"]["target"]["checkpoint"] == "/models/target"
    assert manifest["steps"] == [{"name": "build", "status": "ok", "seconds": 1.5, "fingerprint": "f" * 64,
                                  "output": str(tmp_path / "engines"), "detail": "ran: first run"}]
    assert manifest["compatibility"]["vocab_size"] == 49152 and manifest["toolchain"] == TOOLCHAIN
    assert verify(tmp_path / "triton_repo").ok


def test_profile_id_depends_on_content_only(tmp_path: Path) -> None:
    first = json.loads(_write(tmp_path / "a").read_text())
    again = json.loads(_write(tmp_path / "a", compatibility={"rewritten": True}).read_text())
    elsewhere = json.loads(_write(tmp_path / "b").read_text())
    assert first["profile_id"] == again["profile_id"] == elsewhere["profile_id"]
    (tmp_path / "a" / "engines" / "draft" / "rank0.engine").write_bytes(b"draft2")
    assert json.loads(_write(tmp_path / "a").read_text())["profile_id"] != first["profile_id"]


def test_verify_names_flipped_missing_and_extra_files(tmp_path: Path) -> None:
    _write(tmp_path)
    engine = tmp_path / "engines" / "target" / "rank0.engine"
    data = bytearray(engine.read_bytes())
    data[1] ^= 0x80
    engine.write_bytes(bytes(data))
    (tmp_path / "triton_repo" / "orchestrator" / "1" / "model.py").unlink()
    (tmp_path / "engines" / "draft" / "notes.txt").write_text("added")
    report = verify(tmp_path / "triton_repo" / "manifest.json")
    assert not report.ok and report.checked == 5
    assert report.changed == ["../engines/target/rank0.engine"]
    assert report.missing == ["orchestrator/1/model.py"]
    assert report.extra == ["../engines/draft/notes.txt"]
    assert report.missing_trees == {}


def test_release_moved_as_a_whole_still_verifies(tmp_path: Path) -> None:
    _write(tmp_path / "release")
    shutil.move(tmp_path / "release", tmp_path / "moved")
    report = verify(tmp_path / "moved")  # the folder above the repository works too
    assert report.ok and report.root == (tmp_path / "moved" / "triton_repo").resolve()


def test_repository_and_engines_copied_side_by_side_under_another_name_verify(tmp_path: Path) -> None:
    _write(tmp_path / "build")
    store = tmp_path / "model-store" / "release-42"
    store.mkdir(parents=True)
    shutil.copytree(tmp_path / "build" / "triton_repo", store / "repository-v7")  # the repository's name is free
    shutil.copytree(tmp_path / "build" / "engines", store / "engines")  # the engines keep theirs, beside it
    assert verify(store / "repository-v7").ok


def test_a_repository_copied_without_its_engines_says_where_they_belong(tmp_path: Path) -> None:
    _write(tmp_path / "build")
    shutil.copytree(tmp_path / "build" / "triton_repo", tmp_path / "upload" / "triton_repo")
    report = verify(tmp_path / "upload" / "triton_repo")
    assert not report.ok and report.changed == [] and report.extra == []
    assert report.missing == ["../engines/draft/rank0.engine", "../engines/target/rank0.engine"]
    expected = (tmp_path / "upload" / "engines").resolve()
    assert report.missing_trees == {"engines": f"{expected} (../engines from the repository)"}
    assert report.summary().startswith(f"the engines folder is missing: the manifest expects it at {expected}")
    assert "engines folder beside it" in report.fix
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "upload" / "triton_repo"), "--json"])
    assert result.exit_code == 1
    error = json.loads(result.stdout)
    assert error["missing_trees"] == report.missing_trees and error["error"] == report.summary()


def test_engines_inside_the_repository_are_listed_once_and_the_repository_travels_alone(tmp_path: Path) -> None:
    repository = tmp_path / "triton_repo"
    (repository / "target" / "1").mkdir(parents=True)
    (repository / "target" / "1" / "rank0.engine").write_bytes(b"e")
    path = write_manifest(repository, repository / "target", spec={}, inputs={}, steps=[], toolchain_info=TOOLCHAIN)
    manifest = json.loads(path.read_text())
    assert manifest["trees"] == {"repository": ".", "engines": "target"}
    assert list(manifest["files"]) == ["target/1/rank0.engine"]
    shutil.copytree(repository, tmp_path / "uploaded")
    assert verify(repository).ok and verify(tmp_path / "uploaded").ok


def test_v1_manifests_still_verify(tmp_path: Path) -> None:
    """Releases compiled before v2 named paths from the trees' common folder (``root``)."""
    path = _write(tmp_path)
    manifest = json.loads(path.read_text())
    manifest.update(format="specbuild.manifest/v1", root="..", trees={"engines": "engines", "repository": "triton_repo"},
                    files={("triton_repo/" + p) if not p.startswith("../") else p.removeprefix("../"): digest
                           for p, digest in manifest["files"].items()})
    path.write_text(json.dumps(manifest))
    assert verify(tmp_path / "triton_repo").ok
    (tmp_path / "triton_repo" / "ensemble" / "config.pbtxt").write_text("changed")
    assert verify(tmp_path / "triton_repo").changed == ["ensemble/config.pbtxt"]


def test_manifest_keeps_no_environment_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue0123456789")
    engines, repository = _release(tmp_path)
    text = write_manifest(repository, engines, spec={}, inputs={}, steps=[]).read_text()
    assert "hf_supersecretvalue" not in text
    assert json.loads(text)["toolchain"]["packages"]["specbuild"] == toolchain()["packages"]["specbuild"]


def test_unsafe_or_foreign_manifests_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path)
    manifest = json.loads(path.read_text())
    for name in ("../../etc/passwd", "../engines/../../etc/passwd", "/etc/passwd"):
        path.write_text(json.dumps({**manifest, "files": {**manifest["files"], name: "0" * 64}}))
        with pytest.raises(VerificationError, match="outside the release"):
            verify(path)
    for tree in ("../../..", "engines/../..", "/engines"):
        path.write_text(json.dumps({**manifest, "trees": {**manifest["trees"], "engines": tree}}))
        with pytest.raises(VerificationError, match="manifest tree"):
            verify(path)
    path.write_text(json.dumps({"format": "other/v9"}))
    with pytest.raises(VerificationError, match="format"):
        verify(path)
    path.write_text("{not json")
    with pytest.raises(VerificationError, match="not valid JSON"):
        verify(path)


def test_checkpoint_identity_hashes_config_tokenizer_and_weights(tmp_path: Path) -> None:
    checkpoint = tmp_path / "snapshot"
    checkpoint.mkdir()
    (tmp_path / "blob").write_text("{}")
    (checkpoint / "config.json").symlink_to(tmp_path / "blob")  # as in a Hugging Face cache snapshot
    (checkpoint / "tokenizer.json").write_text('{"model": {}}')
    identity = checkpoint_identity(checkpoint)
    assert identity["path"] == str(checkpoint.resolve())
    assert list(identity["files"]) == ["config.json", "tokenizer.json"]
    (checkpoint / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    assert checkpoint_identity(checkpoint)["digest"] != identity["digest"]


def test_missing_trees_are_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        write_manifest(tmp_path / "triton_repo", tmp_path / "engines", spec={}, inputs={}, steps=[])


# --- CLI -------------------------------------------------------------------------------------------------
def test_cli_verify_ok(tmp_path: Path) -> None:
    _write(tmp_path)
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "triton_repo")])
    assert result.exit_code == 0, result.output
    assert "5 files match" in result.output


def test_cli_verify_mismatch_lists_files_and_exits_1(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "engines" / "draft" / "rank0.engine").unlink()
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "triton_repo")])
    assert result.exit_code == 1
    assert "../engines/draft/rank0.engine" in result.output and "missing" in result.output
    assert "Traceback" not in result.output


def test_cli_verify_json(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "triton_repo" / "extra.txt").write_text("x")
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "triton_repo"), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["extra"] == ["extra.txt"] and report["exit_code"] == 1


def test_cli_verify_without_manifest_exits_2(tmp_path: Path) -> None:
    _release(tmp_path)
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "triton_repo")])
    assert result.exit_code == 2
    assert "no single manifest.json" in result.output


def test_compile_flow_rewrites_manifest_without_rerunning_package(tmp_path: Path) -> None:
    """The flow compile uses: stages with manifest.json excluded from the package output, then the manifest."""
    from specbuild.stages.runner import Stage, StageRunner

    def build(out: Path) -> None:
        (out / "target").mkdir()
        (out / "target" / "rank0.engine").write_bytes(b"engine")

    def package(out: Path) -> None:
        (out / "ensemble").mkdir()
        (out / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\n')

    engines, repository = tmp_path / "engines", tmp_path / "triton_repo"
    stages = [Stage("build", {}, engines, build), Stage("package", {}, repository, package, exclude=("manifest.json",))]
    for expected in ("ok", "skipped"):
        results = StageRunner(tmp_path / "build" / "state.json", json_mode=True).run(stages)
        assert [r.status for r in results] == [expected, expected]
        write_manifest(repository, engines, spec={}, inputs={}, steps=results, toolchain_info=TOOLCHAIN)
        assert verify(repository).ok
    steps = json.loads((repository / "manifest.json").read_text())["steps"]
    assert [step["status"] for step in steps] == ["skipped", "skipped"]
