"""Check the running Python against docker/ngc-26.04-python.txt: every entry installed, at a version its rule
allows (``--rehearsal``: the entries marked ``[image only]`` are skipped), and no tritonclient. Exit 1 naming each
disagreement. Standard library and ``packaging`` (which the NGC image has) only; docker/Dockerfile.trtllm runs it
in the image, tests/product/test_release_image.py in its rehearsal venv.

Usage: python check_image_python.py LIST [--rehearsal]
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

IMAGE_ONLY = "[image only]"
ABSENT = ("tritonclient",)  # packaging must not need it: the image does not have it


def entries(path: Path) -> list[tuple[Requirement, bool]]:
    """Each entry of the list, and whether the rehearsal can install it."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rule, _, comment = line.partition("#")
        if rule.strip():
            found.append((Requirement(rule.strip()), IMAGE_ONLY not in comment))
    return found


def disagreements(path: Path, rehearsal: bool) -> list[str]:
    problems = []
    for requirement, installable in entries(path):
        if rehearsal and not installable:
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{requirement} is not installed")
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name} is {version}, the list says {requirement}")
    for name in ABSENT:
        try:
            problems.append(f"{name} {metadata.version(name)} is installed; the image has none")
        except metadata.PackageNotFoundError:
            pass
    return problems


if __name__ == "__main__":
    problems = disagreements(Path(sys.argv[1]), "--rehearsal" in sys.argv[2:])
    for problem in problems:
        print(f"{sys.argv[1]}: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)
