"""A real Prometheus for the tests: Debian's ``prometheus`` package (the server and ``promtool``), fetched once into
the cache folder with ``apt-get download`` and unpacked with ``dpkg -x`` (no root, no system service), and a server
run on loopback with a throwaway storage folder. Off Debian the tests that need it are skipped, except under
``CI=true``, where they fail: CI must run them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import CACHE_DIR
from specbuild.serve.processes import free_port

PACKAGE = "prometheus"  # Debian bookworm: 2.42
FOLDER = CACHE_DIR / "prometheus-deb"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class PrometheusTools:
    server: Path
    promtool: Path


def unavailable(reason: str) -> None:
    """Skip the test, or fail it under CI=true (where the tools must be there)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the Prometheus tests must run)")
    pytest.skip(reason)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def prometheus_tools() -> PrometheusTools:
    """The unpacked package's binaries (fetched on first use)."""
    tools = PrometheusTools(FOLDER / "usr" / "bin" / "prometheus", FOLDER / "usr" / "bin" / "promtool")
    if tools.server.is_file() and tools.promtool.is_file():
        return tools
    if not Path("/etc/debian_version").is_file() or shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        unavailable("Prometheus comes from Debian's package here: this is not a Debian system with apt-get and dpkg")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix=".prometheus-") as scratch_name:
        scratch = Path(scratch_name)
        fetched = _run(["apt-get", "download", PACKAGE], scratch)
        if fetched.returncode != 0 and os.geteuid() == 0:  # no package lists yet: root may fetch them
            _run(["apt-get", "update", "-qq"], scratch)
            fetched = _run(["apt-get", "download", PACKAGE], scratch)
        if fetched.returncode != 0:
            unavailable(f"apt-get download {PACKAGE} failed: {fetched.stderr.strip()[-500:]} (run apt-get update)")
        [deb] = scratch.glob(f"{PACKAGE}_*.deb")
        unpacked = _run(["dpkg", "-x", str(deb), str(scratch / "root")], scratch)
        assert unpacked.returncode == 0, unpacked.stderr
        if not FOLDER.exists():  # another session may have unpacked it meanwhile
            (scratch / "root").rename(FOLDER)
    return tools


def promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run([str(prometheus_tools().promtool), *map(str, args)], cwd)


class PrometheusServer:
    """``prometheus`` on a free loopback port, reading ``config`` (its rule files beside it), storing into a
    folder of its own under ``workdir``; stopped on exit."""

    def __init__(self, config: Path, workdir: Path) -> None:
        self.config, self.workdir = config, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        argv = [str(prometheus_tools().server), f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"]
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError(f"prometheus did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            with _DIRECT.open(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def api(self, path: str, **params: Any) -> Any:
        """The ``data`` of an HTTP API answer (``/api/v1/<path>``); an error answer raises, with Prometheus's
        message."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with _DIRECT.open(url, timeout=30) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            answer = json.load(error)
        if answer.get("status") != "success":
            raise AssertionError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        """An instant query's series (``[{"metric": labels, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr, **params)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]


# --- PromQL read back: which series an expression selects ------------------------------------------------
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})")
KEYWORDS = {"and", "or", "unless", "group_left", "group_right", "bool"}  # operators and their modifiers


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, matchers) of every selector in ``expr``: those with matchers, then any bare metric name left
    once grouping clauses, ranges and function calls are taken out (its matchers "")."""
    rest = SELECTOR.sub(" ", expr)
    rest = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", " ", rest)
    rest = re.sub(r"\[[^\]]*\]|[a-zA-Z_]+\s*\(", " ", rest)
    bare = [name for name in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*", rest) if name not in KEYWORDS]
    return SELECTOR.findall(expr) + [(name, "") for name in bare]
