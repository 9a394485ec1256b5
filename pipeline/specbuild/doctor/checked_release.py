"""The release the doctor checks (:mod:`specbuild.doctor.release_doctor`, ``doctor.py`` in a release), where its
parts are in this environment, and what a check answers: a :class:`Check` with its verdict.

Standard library only, no specbuild import: it ships with the doctor into every release, beside ``doctor.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MANIFEST = "manifest.json"
FACTS = "doctor_facts.json"
RULES = "image_rules.py"
PASS, FAIL, UNCHECKABLE = "pass", "fail", "not checkable here"
ROLES = ("target", "draft")
# The NGC Triton image's release, e.g. "26.04" (triton-inference-server/server's qa scripts read it as such:
# REPO_VERSION=${NVIDIA_TRITON_SERVER_VERSION}): where it is unset, this is not the image.
TRITON_VERSION_ENV = "NVIDIA_TRITON_SERVER_VERSION"
LOGITS_PARAMETER_CAP = 2_000_000_000  # larger checkpoints have no logits recorded (fp32 on a CPU)
RECOMPILE = "recompile the release with specbuild (`specbuild compile`) and copy it whole"


@dataclass(frozen=True)
class Check:
    """One check's verdict (pass, fail, not checkable here), what it saw, and what to do about a fail."""

    name: str
    verdict: str
    evidence: str
    fix: str | None = None


class Unreadable(Exception):
    """The release itself cannot be read (no manifest, no facts): nothing can be checked."""


def load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Unreadable(f"{path} is missing or unreadable ({exc})") from None


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def release_number(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


class FoundRelease:
    """The release beside this file, and where its parts are in this environment."""

    def __init__(self, repository: Path, engines: Path | None, checkpoints: Mapping[str, Path]) -> None:
        self.repository = repository
        self.manifest = load_json(repository / MANIFEST)
        self.facts = load_json(repository / FACTS)
        self.spec = self.manifest.get("spec", {})
        self.runtime: str = self.spec.get("runtime", "?")
        self.compatibility = self.manifest.get("compatibility") or {}
        trees = self.manifest.get("trees", {})
        self.engines = engines or (repository / trees["engines"] if "engines" in trees else None)
        self._checkpoints = dict(checkpoints)
        self.triton_version = os.environ.get(TRITON_VERSION_ENV)

    @property
    def gpu(self) -> bool:
        """Served in the NGC image (TensorRT-LLM), not on the Triton bundled with specbuild."""
        return self.runtime != "torch"

    @property
    def guided(self) -> bool:
        """Serves guided decoding in the backend (its xgrammar tokenizer-info file)."""
        return bool(self.facts.get("tokenizer_info"))

    def checkpoint(self, role: str) -> tuple[Path | None, list[str]]:
        """Where ``role``'s Hugging Face checkpoint is here (None: nowhere), and the places looked at."""
        candidates = [self._checkpoints.get(role)]
        if self.runtime == "torch" and self.engines is not None:
            candidates.append(self.engines / role)  # the torch runtime's engine is the checkpoint, copied
        candidates.append(self.manifest.get("checkpoints", {}).get(role))
        candidates.append(self.spec.get(role, {}).get("checkpoint"))
        looked = [str(path) for path in candidates if path]
        for path in looked:
            if (Path(path) / "config.json").is_file():
                return Path(path), looked
        return None, looked
