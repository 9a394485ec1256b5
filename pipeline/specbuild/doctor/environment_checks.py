"""The doctor's checks of the environment a release runs in: its files as the manifest lists them, the packages the
image rules name, the python backend's known bugs by the image's Triton release, and the GPUs against the memory
plan. Standard library only; shipped beside ``doctor.py``."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__:  # specbuild.doctor.environment_checks
    from specbuild.doctor.checked_release import (FAIL, HERE, MANIFEST, PASS, RECOMPILE, RULES, TRITON_VERSION_ENV,
                                                  UNCHECKABLE, Check, FoundRelease, importable, installed_version,
                                                  release_number)
else:  # beside doctor.py in a release, which put its folder on sys.path
    from checked_release import (FAIL, HERE, MANIFEST, PASS, RECOMPILE, RULES, TRITON_VERSION_ENV, UNCHECKABLE, Check,
                                 FoundRelease, importable, installed_version, release_number)


def _image_rules() -> Any:
    """image_rules.py beside this file, loaded by path."""
    spec = importlib.util.spec_from_file_location("specbuild_image_rules", HERE / RULES)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _recorded(path: Path) -> str:
    """A file as specbuild's manifest records it: a symlink as ``symlink:<target>``, else its sha256."""
    return f"symlink:{os.readlink(path)}" if path.is_symlink() else _hash(path)


def check_files(release: FoundRelease) -> Iterator[Check]:
    """Every file the manifest lists, here and unchanged; no file in the repository it does not list."""
    files: dict[str, str] = release.manifest.get("files", {})
    engines_tree = release.manifest.get("trees", {}).get("engines")
    if not files:
        yield Check("files", UNCHECKABLE, f"{MANIFEST} lists no files (format {release.manifest.get('format')})")
        return

    def located(relative: str) -> Path:
        if engines_tree and release.engines is not None and relative.startswith(engines_tree + "/"):
            return release.engines / relative[len(engines_tree) + 1:]
        return release.repository / relative

    changed, missing = [], []
    for relative, digest in files.items():
        path = located(relative)
        if not (path.is_file() or path.is_symlink()):
            missing.append(relative)
        elif _recorded(path) != digest:
            changed.append(relative)
    extra = []
    for path in release.repository.rglob("*"):
        relative = path.relative_to(release.repository).as_posix()
        if (path.is_file() or path.is_symlink()) and relative != MANIFEST and "__pycache__" not in path.parts \
                and relative not in files:
            extra.append(relative)  # (a running server's python models write bytecode caches: never the release's)
    for role, identity in (release.manifest.get("inputs") or {}).items():
        if role not in release.manifest.get("checkpoints", {}):
            continue  # only checkpoints the release serves in place of engines count as its files
        folder, _ = release.checkpoint(role)
        if folder is None:
            missing.append(f"the {role} checkpoint")
            continue
        for relative, digest in identity.get("files", {}).items():
            path = folder / relative
            if not path.is_file():
                missing.append(f"{role} checkpoint: {relative}")
            elif _hash(path) != digest:
                changed.append(f"{role} checkpoint: {relative}")
    problems = [f"{kind}: {', '.join(paths)}" for kind, paths in
                (("changed", changed), ("missing", missing), ("not in the manifest", sorted(extra))) if paths]
    if problems:
        yield Check("files", FAIL, "; ".join(problems),
                    "the release differs from what specbuild built: copy it again from its source, or "
                    + RECOMPILE + " (`specbuild verify` lists the same differences)")
    else:
        yield Check("files", PASS, f"{len(files)} files match {MANIFEST}")


def check_packages(release: FoundRelease) -> Iterator[Check]:
    """Python and the packages specbuild depends on in the image (image_rules.py), and TensorRT-LLM's line."""
    if not importable("packaging"):
        yield Check("packages", UNCHECKABLE, f"the packaging module ({RULES} reads versions with it) is not "
                    "installed here (the image has it)")
        return
    rules = _image_rules()
    names = [rule.name for rule in rules.RULES] + list(rules.ABSENT_OK)
    installed = {name: installed_version(name) for name in names}
    python = ".".join(str(part) for part in sys.version_info[:3])
    found = ", ".join(f"{name} {version or 'absent'}" for name, version in installed.items())
    evidence = f"Python {python}; {found}"
    if not release.gpu:
        yield Check("packages", UNCHECKABLE, f"{evidence}; a torch release runs on the Triton bundled with "
                    "specbuild, in specbuild's own environment, not in the NGC image whose rules these are")
        return
    problems = rules.breaches(installed, guided=release.guided, python=python)
    line = release.facts.get("tensorrt_llm")
    installed_trtllm = installed_version("tensorrt_llm") or installed_version("tensorrt-llm")
    if line and installed_trtllm and not installed_trtllm.startswith(line):
        problems.append(f"tensorrt_llm is {installed_trtllm}; the release was made for TensorRT-LLM {line}")
    if release.triton_version is None:
        yield Check("packages", UNCHECKABLE,
                    f"{evidence}; this is not the NGC image ({TRITON_VERSION_ENV} is unset), whose packages the "
                    "release needs" + (f" (here: {'; '.join(problems)})" if problems else ""))
    elif problems:
        yield Check("packages", FAIL, "; ".join(problems),
                    f"serve the release with the image its launch names ({release.spec.get('triton', {}).get('image')})"
                    " or an image whose packages keep these rules (docker/ngc-26.04-python.txt)")
    else:
        yield Check("packages", PASS, f"{evidence}; every rule of {RULES} holds"
                    + (f"; TensorRT-LLM {installed_trtllm}" if installed_trtllm else ""))


def check_python_backend(release: FoundRelease) -> Iterator[Check]:
    """The python backend's known bugs (by the image's Triton release) that the release's python models would hit."""
    bugs = release.facts.get("python_backend_bugs", [])
    hit = [bug for bug in bugs if bug["files"]]
    if not hit:
        yield Check("python-backend", PASS, "the release's python models use none of the python backend's known "
                    f"bugs ({', '.join(bug['name'] for bug in bugs) or 'none recorded'})")
        return
    if release.triton_version is None:
        yield Check("python-backend", UNCHECKABLE,
                    f"the Triton release is unknown here ({TRITON_VERSION_ENV} is unset); the release's python models "
                    + "; ".join(f"use {bug['name']} ({', '.join(bug['files'])}), fixed in r{bug['fixed_in']}"
                                for bug in hit))
        return
    broken = [bug for bug in hit if release_number(release.triton_version) < release_number(bug["fixed_in"])]
    if broken:
        yield Check("python-backend", FAIL, f"Triton {release.triton_version}: " + "; ".join(
            f"{bug['summary']} ({bug['source']}), which {', '.join(bug['files'])} would hit" for bug in broken),
            f"serve from an image of r{max(bug['fixed_in'] for bug in broken)} or later, or package the release with "
            "a specbuild whose models avoid it")
    else:
        yield Check("python-backend", PASS, f"Triton {release.triton_version} has the fixes of "
                    + ", ".join(f"{bug['name']} (r{bug['fixed_in']})" for bug in hit))


def check_gpus(release: FoundRelease) -> Iterator[Check]:
    """The GPUs visible here against the launch's count and the memory plan's least memory per GPU."""
    plan = release.compatibility.get("memory_plan") or {}
    needed, need_bytes = plan.get("gpus", 1), plan.get("min_gpu_bytes")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        yield Check("gpus", UNCHECKABLE, f"no nvidia-smi here; the release needs {needed} GPU(s) of at least "
                    f"{need_bytes / 2**30:.2f} GiB" if need_bytes else "no nvidia-smi here")
        return
    try:
        output = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        yield Check("gpus", UNCHECKABLE, f"nvidia-smi failed: {exc}")
        return
    gpus = [(name.strip(), int(float(mib)) * 2**20) for name, mib in
            (line.rsplit(",", 1) for line in output.strip().splitlines() if "," in line)]
    seen = ", ".join(f"{name} ({size / 2**30:.1f} GiB)" for name, size in gpus) or "none"
    small = [name for name, size in gpus if need_bytes and size < need_bytes]
    if len(gpus) < needed or small:
        yield Check("gpus", FAIL, f"visible: {seen}; the release needs {needed} GPU(s) of at least "
                    f"{(need_bytes or 0) / 2**30:.2f} GiB (its memory plan)",
                    "run on a host (or with `--gpus`) that gives the container enough GPUs, or compile for this one "
                    "(tp/pp, limits)")
    else:
        yield Check("gpus", PASS, f"visible: {seen}; the release needs {needed} of at least "
                    f"{(need_bytes or 0) / 2**30:.2f} GiB")
