"""Check a Python against the rules a release depends on (pipeline/specbuild/runtimes/image_rules.py, loaded by path:
specbuild is not installed where this runs) and compare it with docker/ngc-26.04-python.txt. Exit 1 only on a rule
broken, naming it; every difference from the list (a package missing, a version no reading of the list gives, a
tritonclient specbuild never needs) is printed as information. Standard library and ``packaging`` (which the NGC
image has) only; docker/Dockerfile.trtllm runs it in the image, tests/product/test_release_image.py in its
rehearsal venv and against lists of what an image would report.

Usage: python check_image_python.py LIST [--rehearsal] [--installed FREEZE --python X.Y.Z]

``--rehearsal``: the running Python is the CPU rehearsal's (no [image only] entries, not Python 3.12, no guided
decoding). ``--installed``: read the packages from a ``pip list --format=freeze`` file instead of this Python, and
``--python`` its version.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

IMAGE_ONLY = "[image only]"
RULES = Path(__file__).resolve().parent.parent / "pipeline" / "specbuild" / "runtimes" / "image_rules.py"


def image_rules(path: Path = RULES) -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_rules", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def readings(path: Path) -> dict[str, list[tuple[Requirement, bool, str]]]:
    """Each package of the list: its readings (requirement, whether the rehearsal can install it, source)."""
    found: dict[str, list[tuple[Requirement, bool, str]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        rule, _, comment = line.partition("#")
        if rule.strip():
            requirement = Requirement(rule.strip())
            source = comment.replace(IMAGE_ONLY, "").strip()
            found.setdefault(canonicalize_name(requirement.name), []).append(
                (requirement, IMAGE_ONLY not in comment, source))
    return found


def installed_here(names: list[str]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def frozen(path: Path) -> dict[str, str]:
    """A ``pip list --format=freeze`` file as package -> version."""
    versions = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, separator, version = line.strip().partition("==")
        if separator:
            versions[canonicalize_name(name)] = version
    return versions


def information(listed: Mapping[str, list[tuple[Requirement, bool, str]]], installed: Mapping[str, str | None],
                absent_ok: tuple[str, ...], rehearsal: bool) -> list[str]:
    """How ``installed`` differs from the list, each difference a sentence naming the list's readings."""
    notes = []
    for name, entries in listed.items():
        entries = [entry for entry in entries if entry[1] or not rehearsal]
        if not entries:
            continue
        said = "; ".join(f"{requirement} ({source})" for requirement, _, source in entries)
        version = installed.get(name)
        if version is None:
            notes.append(f"{name} is not installed; the list reads {said}")
        elif not any(requirement.specifier.contains(version, prereleases=True) for requirement, _, _ in entries):
            notes.append(f"{name} is {version}; the list reads {said}")
    for name in absent_ok:
        if installed.get(canonicalize_name(name)) is not None:
            notes.append(f"{name} {installed[canonicalize_name(name)]} is installed; specbuild never needs it")
    return notes


def check(list_path: Path, *, rehearsal: bool, installed: Mapping[str, str | None] | None = None,
          python: str | None = None) -> tuple[list[str], list[str]]:
    """The rules broken and the differences from the list (``installed`` None: this Python's packages)."""
    rules = image_rules()
    listed = readings(list_path)
    names = sorted({*listed, *(canonicalize_name(rule.name) for rule in rules.RULES),
                    *(canonicalize_name(name) for name in rules.ABSENT_OK)})
    if installed is None:
        installed, python = installed_here(names), platform.python_version()
    versions = {name: installed.get(name) for name in names}
    broken = rules.breaches(versions, guided=not rehearsal, python=None if rehearsal else python)
    return broken, information(listed, versions, rules.ABSENT_OK, rehearsal)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("list", type=Path)
    parser.add_argument("--rehearsal", action="store_true")
    parser.add_argument("--installed", type=Path)
    parser.add_argument("--python")
    args = parser.parse_args(argv)
    if (args.installed is None) != (args.python is None):
        parser.error("--installed and --python go together")
    broken, notes = check(args.list, rehearsal=args.rehearsal, python=args.python,
                          installed=frozen(args.installed) if args.installed else None)
    for note in notes:
        print(f"{args.list}: information: {note}")
    for problem in broken:
        print(f"{args.list}: a release depends on this: {problem}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
