"""``specbuild doctor``: run the doctor a release ships (``doctor.py``, :mod:`specbuild.doctor.release_doctor`) here,
or in the release's image with the release mounted as ``serve`` mounts it, and read its report.

The doctor runs in a process of its own in both places (in the image there is no specbuild to import), so what it
says here is what it says there, up to what each environment has installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.doctor.facts import DOCTOR
from specbuild.doctor.checked_release import FAIL, PASS, UNCHECKABLE, Check
from specbuild.errors import UsageError, VerificationError

__all__ = ["FAIL", "PASS", "UNCHECKABLE", "Check", "DoctorReport", "doctor_command", "run_doctor"]
IMAGE_PYTHON = "python3"  # the NGC image's interpreter on its PATH (the python backend's venv)
TIMEOUT_S = 1800  # a large checkpoint's files are hashed and its config read; logits only below the parameter cap


@dataclass(frozen=True)
class DoctorReport:
    """The doctor's checks of one release in one environment (``image``: None for here)."""

    release: str
    runtime: str
    image: str | None
    python: str
    triton: str | None
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.verdict == FAIL)

    def refusal_to_serve(self) -> VerificationError:
        """Why ``serve`` refuses to start the release after this report's fails, each check's fix the fix."""
        return VerificationError(f"the doctor failed {', '.join(check.name for check in self.failed)} in {self.image}",
                                 "; ".join(check.fix for check in self.failed if check.fix) + "; or serve with "
                                 "--no-doctor to skip it (the failures stand)", details=self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "runtime": self.runtime, "image": self.image, "python": self.python,
                "triton": self.triton, "ok": self.ok,
                "checks": [{"name": c.name, "verdict": c.verdict, "evidence": c.evidence, "fix": c.fix}
                           for c in self.checks]}


def _repository(release: str | Path) -> tuple[Path, dict[str, Any]]:
    """The repository folder of the release at ``release`` and its manifest (read as JSON: a release packaged
    without engines has its doctor too)."""
    from specbuild.package.manifest import find_manifest

    manifest_path = find_manifest(release).resolve()
    repository = manifest_path.parent
    if not (repository / DOCTOR).is_file():
        raise VerificationError(f"{repository} ships no {DOCTOR} (packaged by a specbuild before the doctor)",
                                "package the release again with this specbuild (`specbuild compile`)")
    return repository, json.loads(manifest_path.read_text(encoding="utf-8"))


def doctor_command(release: str | Path, *, image: str | None = None) -> list[str]:
    """The command that runs the release's doctor: here with this Python, or in ``image`` with ``docker run``, the
    release mounted as its launch plan mounts it (read-only), its GPUs given."""
    repository, manifest = _repository(release)
    if image is None:
        return [sys.executable, str(repository / DOCTOR), "--json"]
    from specbuild.runtimes.launch_plans import LaunchPlan
    from specbuild.runtimes.registry import runtime_for
    from specbuild.serve.release_launch import release_launch_spec
    from specbuild.spec import BuildSpec

    spec = release_launch_spec(BuildSpec.model_validate(manifest["spec"]), {"triton.image": image})
    # a release packaged without engines has no engines tree: nothing of them is mounted
    engines = (repository / manifest["trees"]["engines"]).resolve() if "engines" in manifest["trees"] else None
    checkpoints = {role: Path(path) for role, path in (manifest.get("checkpoints") or {}).items()}
    runtime = runtime_for(spec.runtime)
    planned_engines = engines or repository / "engines-not-built"
    plan = runtime.launch_plan(spec, repository, planned_engines, checkpoints) if spec.runtime != "torch" else None
    if not isinstance(plan, LaunchPlan):
        raise UsageError(f"a {spec.runtime} release is served by the Triton bundled with specbuild, not in an image",
                         f"run `specbuild doctor {release}` without --image")
    argv = ["docker", "run", "--rm", "--gpus", str(plan.gpu_count)]
    args = [f"{spec.triton.repository_mount.rstrip('/')}/{DOCTOR}", "--json"]
    for mount in plan.mounts:
        if engines is None and Path(mount.source) == planned_engines.resolve():
            continue  # no engines built yet: the doctor says so
        argv += ["--mount", f"type=bind,source={mount.source},target={mount.target},readonly"]
        if Path(mount.source) == engines and spec.runtime == "tensorrt-llm":
            args += ["--engines", mount.target]
        args += [f"--checkpoint={role}={mount.target}" for role, path in checkpoints.items()
                 if Path(mount.source) == path.resolve()]
    for key, value in plan.env.items():
        argv += ["-e", f"{key}={value}"]
    return [*argv, spec.triton.image, IMAGE_PYTHON, *args]


def run_doctor(release: str | Path, *, image: str | None = None) -> DoctorReport:
    """Run the release's doctor (see :func:`doctor_command`) and read its report; a doctor that could not run at
    all is a :class:`VerificationError` with its output."""
    command = doctor_command(release, image=image)
    if shutil.which(command[0]) is None:
        raise VerificationError(f"{command[0]} is not installed on this machine, so the release's doctor cannot run",
                                f"install {command[0]}, or print the command with --dry-run and run it where it is")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VerificationError(f"the doctor did not run: {exc}",
                                "run the printed command by hand (`specbuild doctor --dry-run`) to see why") from None
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VerificationError(f"the doctor exited {result.returncode} without a report: "
                                f"{(result.stderr or result.stdout).strip()[-2000:]}",
                                "run the printed command by hand (`specbuild doctor --dry-run`) to see why") from None
    checks = tuple(Check(**check) for check in data["checks"])
    return DoctorReport(release=data["release"], runtime=data["runtime"], image=image, python=data["python"],
                        triton=data["triton"], checks=checks)
