"""A CPU rehearsal of a ``tensorrt-llm-llmapi`` release: the release's repository, served by the Triton server bundled
with specbuild, with a torch stand-in for TensorRT-LLM's LLM-API model.

:func:`rehearsal_repository` copies the repository and swaps one thing: ``tensorrt_llm/1/model.py``, a link into the
NGC image, becomes :mod:`specbuild.runtimes.tensorrt_llm_llmapi.stand_in_model` with its specbuild modules beside it
(as every python model of a release has them; the stand-in's also need pydantic and PyYAML, which specbuild's own
environment has). The ensemble, the adapter, the configs and ``model.yaml`` are the release's own, byte for byte;
``stand_in.json`` names the release's TensorRT-LLM line (whose rules the stand-in reads ``model.yaml`` by) and maps
its container paths to the checkpoints on this machine, as ``docker run`` mounts them. The copy has no manifest: it
is not the release, and the release itself is verified first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specbuild.errors import UsageError, VerificationError
from specbuild.package.manifest import MANIFEST_NAME, Release, verify
from specbuild.package.vendor import ALLOWED_THIRD_PARTY, vendor
from specbuild.runtimes.tensorrt_llm_llmapi.contract import IMAGE_MODEL_FILES, LLMAPI_MODEL, STAND_IN_SETTINGS
from specbuild.runtimes.tensorrt_llm_llmapi.launch import container_checkpoint
from specbuild.spec import ROLES

STAND_IN_SOURCE = Path(__file__).parent / "stand_in_model.py"
STAND_IN_THIRD_PARTY = frozenset({"yaml"})  # model.yaml read through its typed model


def rehearsal_repository(found: Release, destination: str | Path) -> Path:
    """Write the CPU rehearsal of the release ``found`` into ``destination`` (a new folder); returns the repository to
    serve."""
    report = verify(found.manifest)
    if not report.ok:
        raise VerificationError(f"the release differs from its manifest ({len(report.changed)} changed, "
                                f"{len(report.missing)} missing, {len(report.extra)} extra files)",
                                "run `specbuild verify` to see which, and package the release again")
    repository = Path(destination) / found.repository.name
    if repository.exists():
        raise UsageError(f"{repository} exists", "rehearse into a new folder")
    shutil.copytree(found.repository, repository, symlinks=True, ignore=shutil.ignore_patterns(MANIFEST_NAME))
    version = repository / LLMAPI_MODEL / "1"
    for name in IMAGE_MODEL_FILES:
        (version / name).unlink()
    shutil.copy2(STAND_IN_SOURCE, version / "model.py")
    vendor(STAND_IN_SOURCE, version, ALLOWED_THIRD_PARTY | STAND_IN_THIRD_PARTY)
    settings = {"tensorrt_llm": found.spec.triton.tensorrt_llm,
                "mounts": {**{container_checkpoint(found.spec, role): str(found.checkpoints[role]) for role in ROLES},
                           found.spec.triton.repository_mount: str(repository)}}
    (version / STAND_IN_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return repository
