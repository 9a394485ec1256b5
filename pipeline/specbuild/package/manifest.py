"""``manifest.json``: what a release holds and how it was made, and :func:`verify` to prove it still does.

Where it lives: ``<repository_dir>/manifest.json`` (Triton only treats folders of a model repository as
models, so the file is inert there and ships with the repository). It covers both the repository and the
engines, and names every path relative to the repository folder: the repository is ``"."``, engines built
beside it are e.g. ``"../engines"`` (inside it, e.g. ``"engines"``). So the unit a pipeline uploads is the
repository folder, with the engines folder beside it where the engines are separate: copied or uploaded
under any name, it verifies; a missing part is named with where it is expected. The manifest itself is not
in its file list. (Format v1 named paths from the trees' common folder; such manifests are still read.)

A release of a runtime that builds no engines (``tensorrt-llm-llmapi``: TensorRT-LLM loads the checkpoints
itself) names the checkpoints it serves under ``checkpoints`` (absolute paths); :func:`verify` re-hashes them
against their identities in ``inputs``, as it re-hashes the trees.

It never records environment variables, tokens or credentials: only the resolved spec, the inputs'
identities the caller passes, package versions and GPU names.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import platform
import posixpath
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rich.table import Table

from specbuild.errors import UsageError, VerificationError
from specbuild.package.build_record import RECOMPILE, BuildRecord
from specbuild.package.contract import MANIFEST_NAME
from specbuild.stages.atomic import atomic_write_text, clean_stale
from specbuild.stages.hashing import digest_json, hash_tree
from specbuild.stages.runner import StageResult

if TYPE_CHECKING:
    from specbuild.spec import BuildSpec

MANIFEST_FORMAT = "specbuild.manifest/v2"
MANIFEST_FORMAT_V1 = "specbuild.manifest/v1"

_TOOLCHAIN_PACKAGES = ("specbuild", "torch", "transformers", "tokenizers", "safetensors", "numpy", "tritonclient",
                       "nvidia-pytriton", "tensorrt_llm", "tensorrt")


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpus() -> list[dict[str, str]]:
    """Name, driver and SM of each visible NVIDIA GPU (from nvidia-smi; empty without one)."""
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in output.strip().splitlines():
        name, driver, compute_cap = (part.strip() for part in line.split(",", 2))
        gpus.append({"name": name, "driver": driver, "sm": compute_cap.replace(".", "")})
    return gpus


def toolchain() -> dict[str, Any]:
    """Versions of the tools that made a release, read from package metadata (nothing is imported)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _package_version(name) for name in _TOOLCHAIN_PACKAGES},
        "gpus": _gpus(),
    }


def checkpoint_identity(path: str | Path) -> dict[str, Any]:
    """An input's identity for the manifest: its resolved path and the sha256 of each of its files.

    Symlinks are followed (Hugging Face cache snapshots link to blobs). Hashing reads the weights, so
    compute it in the ``check`` stage and carry it in that stage's returned data, which a skip hands back.
    """
    folder = Path(path).resolve()
    files = hash_tree(folder, symlinks="follow")
    return {"path": str(folder), "digest": digest_json(files), "files": files}


def _trees(repository_dir: Path, engines_dir: Path | None) -> dict[str, str]:
    """Each tree of the release (the repository, and the engines when built) as a path from the repository."""
    trees = {"repository": repository_dir.resolve()}
    if engines_dir is not None:
        trees["engines"] = engines_dir.resolve()
    for role, path in trees.items():
        if not path.is_dir():
            raise UsageError(f"the {role} folder {path} does not exist", "build and package the release first")
    return {role: Path(os.path.relpath(path, trees["repository"])).as_posix() for role, path in trees.items()}


BYTECODE_DIR = "__pycache__"


def _inside(path: str, tree: str) -> bool:
    """Whether the relative ``path`` lies in the relative ``tree`` (both normalized, ``"."`` is everything that does
    not climb out of it)."""
    if tree == ".":
        return not path.startswith("../") and path != ".."
    return path.startswith(tree + "/")


def _outermost(trees: Mapping[str, str]) -> list[str]:
    """The trees not inside another one (engines inside the repository are hashed once, as part of it)."""
    paths = sorted(set(trees.values()))
    return [tree for tree in paths if not any(other != tree and _inside(tree, other) for other in paths)]


def _hash_release(base: Path, trees: Mapping[str, str], manifest: Path) -> dict[str, str]:
    """``{path relative to base: sha256}`` of every file in the trees (paths relative to ``base``, the repository
    folder), the manifest itself and Python bytecode caches (which the server's model processes write next to
    their ``model.py``) excluded."""
    files: dict[str, str] = {}
    for tree in _outermost(trees):
        tree_dir = base / tree
        if not tree_dir.is_dir():
            continue
        prefix = "" if tree == "." else f"{tree}/"
        exclude = {manifest.name} if tree == "." else set()
        for relative, digest in hash_tree(tree_dir, symlinks="record", exclude=exclude).items():
            if BYTECODE_DIR in relative.split("/"):
                continue  # written by a running server's python models, never part of the release
            files[prefix + relative] = digest
    return dict(sorted(files.items()))


def profile_id(files: Mapping[str, str]) -> str:
    """A short id of the release's content: equal files (by relative path and hash) give an equal id."""
    return digest_json(dict(sorted(files.items())))[:16]


def write_manifest(
    repository_dir: str | Path,
    engines_dir: str | Path | None,
    *,
    spec: Any,
    inputs: Mapping[str, Any],
    steps: Sequence[StageResult | Mapping[str, Any]],
    compatibility: Mapping[str, Any] | None = None,
    toolchain_info: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    checkpoints: Mapping[str, str | Path] | None = None,
) -> Path:
    """Hash the release and write ``<repository_dir>/manifest.json`` atomically; returns its path.

    ``spec``: the resolved BuildSpec (or its dict). ``inputs``: the checkpoints' identities (paths, config,
    tokenizer and weight hashes). ``steps``: the :class:`StageResult` list of the run (or dicts).
    ``toolchain_info`` defaults to :func:`toolchain`. ``checkpoints``: ``{role: folder}`` a runtime without
    engines serves (their identities must be in ``inputs``). ``engines_dir`` None without ``checkpoints``: a
    release packaged without the engines its runtime builds (``specbuild package`` where the runtime cannot
    build), marked so that it is never served.
    """
    repository_dir = Path(repository_dir)
    manifest_path = repository_dir.resolve() / MANIFEST_NAME
    trees = _trees(repository_dir, None if engines_dir is None else Path(engines_dir))
    clean_stale(manifest_path)
    files = _hash_release(manifest_path.parent, trees, manifest_path)
    manifest = {
        "format": MANIFEST_FORMAT,
        "profile_id": profile_id(files),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "engines_built": engines_dir is not None or checkpoints is not None,
        "trees": trees,
        **({"checkpoints": {role: str(Path(path).resolve()) for role, path in checkpoints.items()}}
           if checkpoints is not None else {}),
        "files": files,
        "spec": spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec),
        "inputs": dict(inputs),
        "toolchain": dict(toolchain_info) if toolchain_info is not None else toolchain(),
        "steps": [_step(step) for step in steps],
        "compatibility": dict(compatibility or {}),
        "extra": dict(extra or {}),
    }
    return atomic_write_text(manifest_path, json.dumps(manifest, indent=2, default=str) + "\n")


def _step(step: StageResult | Mapping[str, Any]) -> dict[str, Any]:
    data = step.to_json() if isinstance(step, StageResult) else dict(step)
    data.pop("data", None)  # reports returned by actions go in their own manifest sections
    return data


# --- verification -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifyReport:
    manifest: Path
    root: Path  # the repository folder: every path in the report is relative to it
    profile_id: str
    checked: int
    changed: list[str]
    missing: list[str]
    extra: list[str]
    missing_trees: dict[str, str] = field(default_factory=dict)  # tree -> where the manifest expects it

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.extra)

    def summary(self) -> str:
        """The differences in one sentence, a missing folder first (its files are among the missing ones)."""
        counts = (f"{len(self.changed)} changed, {len(self.missing)} missing, {len(self.extra)} extra file(s) "
                  f"under {self.root}")
        folders = [f"the {role} folder is missing: the manifest expects it at {where}"
                   for role, where in self.missing_trees.items()]
        return "; ".join(folders + [counts])

    @property
    def fix(self) -> str:
        if self.missing_trees:
            return ("copy the release whole: the repository folder, with the engines folder beside it under the name "
                    "the manifest gives (its \"trees\"); or verify where the release was compiled")
        return "rebuild the release with `specbuild compile`, or restore the files named above"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "manifest": str(self.manifest), "root": str(self.root),
                "profile_id": self.profile_id, "checked": self.checked, "changed": self.changed,
                "missing": self.missing, "extra": self.extra, "missing_trees": self.missing_trees}


def find_manifest(path: str | Path) -> Path:
    """The manifest for ``path``: the file itself, ``path/manifest.json``, or the one in a single subfolder."""
    path = Path(path)
    if path.is_file():
        return path
    candidates = [path / MANIFEST_NAME] if (path / MANIFEST_NAME).is_file() else sorted(path.glob(f"*/{MANIFEST_NAME}"))
    if len(candidates) == 1:
        return candidates[0]
    found = f"several ({', '.join(str(c) for c in candidates)})" if candidates else "none"
    raise UsageError(f"no single {MANIFEST_NAME} in {path} (found {found})",
                     "pass the repository folder written by `specbuild compile` (it holds manifest.json)")


def _tree_path(value: Any) -> str:
    """A tree's path from the repository: ``"."``, or normalized and relative, climbing only at its start."""
    if not isinstance(value, str) or posixpath.isabs(value) or posixpath.normpath(value) != value:
        raise VerificationError(f"manifest tree {value!r} is not a normalized relative path", "regenerate the manifest")
    parts = value.split("/")
    climbs = len(parts) - len(list(itertools.dropwhile(lambda part: part == "..", parts)))
    if ".." in parts[climbs:] or climbs == len(parts):
        raise VerificationError(f"manifest tree {value!r} is not a folder of the release", "regenerate the manifest")
    return value


def _file_path(value: Any, trees: Mapping[str, str]) -> str:
    if not isinstance(value, str) or posixpath.normpath(value) != value or posixpath.isabs(value) \
            or not any(_inside(value, tree) for tree in trees.values()):
        raise VerificationError(f"manifest file {value!r} leads outside the release", "regenerate the manifest")
    return value


def _from_v1(manifest: dict[str, Any]) -> dict[str, Any]:
    """A v1 manifest (paths from the trees' common folder, ``root``) with v2's paths (from the repository)."""
    trees = manifest["trees"]
    repository = trees.get("repository")  # the manifest's own folder, from the common folder
    if not isinstance(repository, str):
        raise VerificationError("a v1 manifest without its repository tree", "regenerate the manifest")

    def from_repository(path: str) -> str:
        return posixpath.relpath(path, repository) if isinstance(path, str) else path

    return {**manifest, "format": MANIFEST_FORMAT,
            "trees": {role: from_repository(tree) for role, tree in trees.items()},
            "files": {from_repository(relative): digest for relative, digest in manifest["files"].items()}}


def _load(manifest_path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VerificationError(f"{manifest_path} is not valid JSON ({exc})",
                                "the manifest was damaged; rebuild the release or restore it") from None
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found not in (MANIFEST_FORMAT, MANIFEST_FORMAT_V1):
        raise VerificationError(f"{manifest_path} has format {found!r}, expected {MANIFEST_FORMAT!r}",
                                "verify it with the specbuild version that wrote it")
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("trees"), dict):
        raise VerificationError(f"{manifest_path} lacks its files or trees", "regenerate the manifest")
    if found == MANIFEST_FORMAT_V1:
        manifest = _from_v1(manifest)
    trees = {role: _tree_path(tree) for role, tree in manifest["trees"].items()}
    if trees.get("repository") != ".":
        raise VerificationError(f"{manifest_path} does not name its own folder as the repository",
                                "regenerate the manifest")
    files = {_file_path(relative, trees): digest for relative, digest in manifest["files"].items()}
    return {**manifest, "trees": trees, "files": files}


def _require_engines(manifest: Mapping[str, Any], manifest_path: Path) -> None:
    if manifest.get("engines_built") is False:
        runtime = manifest.get("spec", {}).get("runtime")
        raise VerificationError(
            f"{manifest_path} describes a release packaged without engines (`specbuild package` where the "
            f"{runtime} runtime cannot build): it is for inspection, and cannot be verified, served or deployed",
            f"build it with `specbuild compile` on a host that has the {runtime} runtime (docs/deployment.md: "
            "which image serves a release)")


@dataclass(frozen=True)
class Release:
    """What a compiled release says about itself: the spec it was compiled from, its engines' build records, and
    the checkpoints it serves where its runtime builds no engines (empty otherwise)."""

    manifest: Path
    spec: BuildSpec
    build_info: dict[str, BuildRecord]
    repository: Path
    engines: Path
    checkpoints: dict[str, Path]


def read_release(path: str | Path) -> Release:
    """The release at ``path`` (a repository folder or its manifest); refused when it has no engines."""
    from pydantic import ValidationError

    from specbuild.spec import BuildSpec

    manifest_path = find_manifest(path).resolve()
    manifest = _load(manifest_path)
    _require_engines(manifest, manifest_path)
    try:
        spec = BuildSpec.model_validate(manifest.get("spec"))
    except ValidationError as exc:
        raise VerificationError(f"{manifest_path} holds a spec this specbuild cannot read ({exc.errors()[0]['msg']})",
                                "re-package the release with this specbuild version") from None
    engines = (manifest_path.parent / manifest["trees"].get("engines", ".")).resolve()
    return Release(manifest_path, spec, _records(manifest, manifest_path), manifest_path.parent, engines, {role: Path(path) for role, path in _checkpoints(manifest).items()})


def _records(manifest: Mapping[str, Any], manifest_path: Path) -> dict[str, BuildRecord]:
    """The engines' build records the manifest holds (a runtime without engines: its models' limits), read through
    their typed model: a release compiled by an older specbuild is refused with the fix to recompile it."""
    records = (manifest.get("extra") or {}).get("build_info") or {}
    if not isinstance(records, dict):
        raise VerificationError(f"{manifest_path} holds build records that are not a mapping", RECOMPILE)
    return {role: BuildRecord.parse(record, f"{manifest_path} (the {role} engine's build record)")
            for role, record in records.items()}


def _checkpoints(manifest: Mapping[str, Any]) -> dict[str, str]:
    checkpoints = manifest.get("checkpoints") or {}
    if not isinstance(checkpoints, dict) or not all(isinstance(path, str) and PurePosixPath(path).is_absolute()
                                                    for path in checkpoints.values()):
        raise VerificationError("manifest checkpoints must map roles to absolute folders", "regenerate the manifest")
    return checkpoints


def _checkpoint_files(manifest: Mapping[str, Any], *, recorded: bool) -> dict[str, str]:
    """The served checkpoints' files as ``"<role> checkpoint/<path>": sha256``: as the manifest's ``inputs``
    recorded them, or as they are now."""
    files: dict[str, str] = {}
    for role, folder in _checkpoints(manifest).items():
        if recorded:
            identity = manifest.get("inputs", {}).get(role) or {}
            hashes = identity.get("files") if isinstance(identity, dict) else None
            if not isinstance(hashes, dict):
                raise VerificationError(f"the manifest serves the {role} checkpoint but records no identity for it",
                                        "regenerate the manifest")
        else:
            hashes = hash_tree(Path(folder), symlinks="follow") if Path(folder).is_dir() else {}
        files.update({f"{role} checkpoint/{relative}": digest for relative, digest in hashes.items()})
    return files


def verify(path: str | Path) -> VerifyReport:
    """Re-hash the release described by a manifest (or a folder holding one) and name every difference."""
    manifest_path = find_manifest(path).resolve()
    manifest = _load(manifest_path)
    _require_engines(manifest, manifest_path)
    _records(manifest, manifest_path)
    base = manifest_path.parent
    trees = manifest["trees"]
    recorded = {**manifest["files"], **_checkpoint_files(manifest, recorded=True)}
    current = {**_hash_release(base, trees, manifest_path), **_checkpoint_files(manifest, recorded=False)}
    return VerifyReport(
        manifest=manifest_path,
        root=base,
        profile_id=str(manifest.get("profile_id", "")),
        checked=len(recorded),
        changed=sorted(p for p in recorded.keys() & current.keys() if recorded[p] != current[p]),
        missing=sorted(recorded.keys() - current.keys()),
        extra=sorted(current.keys() - recorded.keys()),
        missing_trees={role: f"{(base / tree).resolve()} ({tree} from the repository)"
                       for role, tree in trees.items() if not (base / tree).is_dir()},
    )


def refuse_modified_release(repository: str | Path) -> None:
    """Refuse to serve a release whose files differ from its ``manifest.json`` (when it has one).

    Raises :class:`VerificationError` naming the first changed, missing or extra files.
    """
    if not (Path(repository) / MANIFEST_NAME).is_file():
        return
    report = verify(Path(repository) / MANIFEST_NAME)
    if report.ok:
        return
    problems = [f"{kind} {(Path(repository) / path).resolve()}"
                for kind, paths in (("changed", report.changed), ("missing", report.missing), ("extra", report.extra))
                for path in paths]
    shown = ", ".join(problems[:5]) + (f" and {len(problems) - 5} more" if len(problems) > 5 else "")
    raise VerificationError(f"the release differs from its manifest: {report.summary()}: {shown}",
                            f"{report.fix}; `specbuild serve --no-verify` serves it anyway")


def report_table(report: VerifyReport) -> Table:
    """The differences as a rich table: one row per changed, missing or extra file."""
    table = Table(title=f"{report.manifest}: differences from the manifest", title_justify="left")
    table.add_column("problem", style="bold red")
    table.add_column("file (relative to the repository folder)")
    for problem, paths in (("changed", report.changed), ("missing", report.missing), ("extra", report.extra)):
        for relative in paths:
            table.add_row(problem, relative)
    return table
