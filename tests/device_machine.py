"""A lent GPU machine's Python, here: only what it has (and what those packages need) can be imported.

The GPU scripts (``scripts/gpu-check.sh``, ``scripts/gpu-distill.sh``) run on a machine with torch, transformers
and a few more and nothing else. :func:`device_env` gives a subprocess an environment where every other installed
distribution's modules are unimportable (``None`` in ``sys.modules``, set by a ``sitecustomize`` on PYTHONPATH: an
``import`` fails, ``importlib.util.find_spec`` says absent), so a test runs the scripts as they are and fails when
they reach for anything else.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

# What the device machine has for these scripts (/work/.library/device KINDS.md's list holds these and more).
DEVICE_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyyaml", "click", "rich")
GGUF_PACKAGES = ("gguf", "accelerate")  # a GGUF target: gguf carried as a wheel; transformers requires accelerate
# Not on the device though a newer version here requires it (typer 0.2x requires pydantic; the device's does not).
NOT_ON_THE_DEVICE = ("pydantic", "pydantic-core")
OWN = "specbuild"  # run from its source tree (PYTHONPATH=pipeline), as the scripts do


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def importable_distributions(packages: Iterable[str]) -> set[str]:
    """``packages`` and, recursively, the installed distributions they require (extras left out)."""
    environment = {**default_environment(), "extra": ""}
    seen: set[str] = set()
    pending = [_canonical(name) for name in packages]
    while pending:
        name = pending.pop()
        if name in seen or name in NOT_ON_THE_DEVICE:
            continue
        try:
            requirements = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: nothing of it to allow
        seen.add(name)
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                pending.append(_canonical(requirement.name))
    return seen


def blocked_modules(packages: Iterable[str]) -> list[str]:
    """Top-level modules of installed distributions outside :func:`importable_distributions` (and not specbuild's)."""
    allowed = importable_distributions(packages) | {OWN}
    return sorted(module for module, distributions in importlib.metadata.packages_distributions().items()
                  if module not in sys.stdlib_module_names and module.isidentifier()
                  and not any(_canonical(name) in allowed for name in distributions))


def device_env(folder: Path, packages: Iterable[str] = DEVICE_PACKAGES) -> dict[str, str]:
    """os.environ for a subprocess that can import only ``packages`` (their requirements, the standard library and
    specbuild); ``folder`` receives the ``sitecustomize.py`` that blocks the rest."""
    folder.mkdir(parents=True, exist_ok=True)
    blocked = blocked_modules(packages)
    (folder / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({blocked!r}))\n",
                                             encoding="utf-8")
    return {**os.environ, "PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH"))))}
