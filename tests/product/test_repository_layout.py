"""The clone itself: compile's output folders hold no tracked file (compile replaces them whole, so a tracked
file there would show as deleted after the first compile) and git ignores them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from specbuild.spec import OutputsSpec
from locations import REPO_ROOT

OUTPUT_FOLDERS = [field.default for field in OutputsSpec.model_fields.values()]


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def checkout() -> None:
    if shutil.which("git") is None or git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout (e.g. an unpacked sdist)")


@pytest.mark.parametrize("folder", OUTPUT_FOLDERS)
def test_output_folders_hold_no_tracked_file(checkout: None, folder: str) -> None:
    assert git("ls-files", "--", folder).stdout == ""


@pytest.mark.parametrize("folder", OUTPUT_FOLDERS)
def test_output_folders_are_ignored(checkout: None, folder: str) -> None:
    assert git("check-ignore", "--no-index", "-q", f"{folder}/anything").returncode == 0
