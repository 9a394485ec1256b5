"""Where the tests' files are, for test modules at any depth under ``tests/``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent
DATA = TESTS / "data"
# Stand-ins for what the python backend and the NGC image provide (pb_utils, the image's check script's helpers).
IMAGE_PYTHON = TESTS / "image_python"
