"""The Triton Inference Server bundled in the ``nvidia-pytriton`` wheel: where its pieces are, and the errors
worth showing from its log."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from specbuild.errors import ServerError

INSTALL_FIX = "install the serve extra: pip install 'specbuild[serve]' (it brings nvidia-pytriton)"
# Log lines that a CPU-only machine always prints; they say nothing about the repository.
_HARMLESS = re.compile(r"CudaDriverHelper|CUDA driver|unable to create stream|pinned memory", re.IGNORECASE)
_GLOG_ERROR = re.compile(r'^E\d{4} [\d:.]+\s+\d+ \S+\] "?(?P<message>.*?)"?$')
# A failed start whose errors say a socket could not be bound needs other ports, not a model fixed.
_PORT_TAKEN = re.compile(r"already in use|Failed to listen|cannot listen", re.IGNORECASE)
PORT_FIX = ("a port the server was given is taken (see the errors above): stop what holds it, or serve on other "
            "ports (--http-port, --grpc-port and --metrics-port; 0 picks free ones)")
MODEL_FIX = "fix the model named above (its config.pbtxt or model.py), then serve again"


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the wheel's Triton server are."""

    root: Path  # .../site-packages/pytriton/tritonserver
    libs: Path  # .../site-packages/nvidia_pytriton.libs

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    def stub(self, version: str = f"{sys.version_info.major}.{sys.version_info.minor}") -> Path:
        return self.root / "python_backend_stubs" / version / "triton_python_backend_stub"


def find_triton() -> TritonInstall:
    """Locate the Triton server of the installed ``nvidia-pytriton`` wheel."""
    try:
        import pytriton
    except ImportError as exc:
        raise ServerError("the Triton server is not installed (nvidia-pytriton is missing)", INSTALL_FIX) from exc
    package = Path(pytriton.__file__).parent
    install = TritonInstall(package / "tritonserver", package.parent / "nvidia_pytriton.libs")
    if not install.binary.is_file():
        raise ServerError(f"no tritonserver binary at {install.binary}", INSTALL_FIX)
    if not install.stub().is_file():
        raise ServerError(
            f"nvidia-pytriton has no python backend stub for Python {sys.version_info.major}.{sys.version_info.minor}",
            "use Python 3.8-3.13 for the environment that runs the server",
        )
    return install


def log_errors(log: str) -> list[str]:
    """The errors worth showing from a tritonserver log: model load failures first, else every error.

    Triton logs each failing model instance and then the model; the per-model lines
    ("failed to load 'x' version 1: ...", "ensemble 'e' depends on 'x' ...") say it all when present.
    """
    errors: list[str] = []
    for line in log.splitlines():
        match = _GLOG_ERROR.match(line)
        if match and not _HARMLESS.search(line):
            errors.append(match["message"].replace("\\n", "\n").replace('\\"', '"').rstrip())
        elif line.startswith("error: "):
            errors.append(line.removeprefix("error: "))
    per_model = [e for e in errors if e.startswith("failed to load '") or "depends on" in e]
    return list(dict.fromkeys(per_model or errors))


def start_failure_fix(errors: list[str]) -> str:
    """What to do about a server that exited while starting, from its log's errors (:func:`log_errors`)."""
    return PORT_FIX if any(_PORT_TAKEN.search(error) for error in errors) else MODEL_FIX
