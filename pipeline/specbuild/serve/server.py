"""Start, watch and stop the Triton Inference Server bundled in the ``nvidia-pytriton`` wheel.

The wheel ships ``tritonserver`` 2.51 with only the python backend, which is all the ``torch`` runtime
needs. Starting it by hand has sharp edges (see the project's triton-on-cpu notes), handled here:

* a backends folder is assembled in a private temp dir (python backend + the stub for this Python);
* ``LD_LIBRARY_PATH`` gets the wheel's libraries and this Python's LIBDIR, otherwise the stub cannot
  load and the server *hangs* while loading; ``PATH`` starts with this interpreter's ``bin`` so the
  stub's embedded Python finds this environment's packages;
* readiness is awaited with a time limit while the process is watched, so a model that fails to load
  becomes a :class:`ServerError` with that model's error, never a hang;
* stopping sends SIGTERM, then SIGKILL to the server's process group after a grace period, and removes
  the python backend's shared-memory regions (each server uses its own region prefix, so only its own);
* SIGTERM or SIGINT to this process (a pipeline runner timing out a step, Ctrl-C) stops every server it
  started before the program unwinds: the server runs in a session of its own, so without this it would
  outlive its parent, holding ports, memory and shared memory.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Literal, Mapping, Sequence

from specbuild.capture.store import CAPTURE_DIR_ENV, open_store
from specbuild.errors import ServerError, Terminated, UsageError
from specbuild.serve.processes import (STOP_SIGNALS, free_ports, kill_group, reachable_host, stop_signals,
                                       wait_until)
from specbuild.serve.triton_install import TritonInstall, find_triton, log_errors, start_failure_fix
from specbuild.spec import TRITON_DEFAULTS

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


# --- stopping on signals ---------------------------------------------------------------------------------
_RUNNING: set["TritonServer"] = set()  # servers started by this process and not stopped yet
_DEFAULT_HANDLERS = (signal.SIG_DFL, signal.default_int_handler)
_replaced: dict[int, Any] = {}  # signal -> the default handler that _on_stop_signal replaced


def _on_stop_signal(signum: int, frame: Any) -> None:
    """Stop every running server (further signals ignored meanwhile), then unwind as Ctrl-C does."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        for server in list(_RUNNING):
            server.stop()
    finally:
        _restore_signals()
    raise Terminated(signum)


def _guard_signals() -> None:
    """Route SIGTERM and SIGINT to :func:`_on_stop_signal` where they have their default handling (handlers
    can only be set from the main thread; a program that set its own keeps it)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        if current in _DEFAULT_HANDLERS:
            _replaced[sig] = current
            signal.signal(sig, _on_stop_signal)


def _restore_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in list(_replaced.items()):
        if signal.getsignal(sig) in (_on_stop_signal, signal.SIG_IGN):
            signal.signal(sig, handler)
        del _replaced[sig]


# Our own server is local: never send its health checks through an http_proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str, method: str = "GET", timeout: float = 2.0) -> tuple[int, str]:
    """Status code and body of a plain HTTP call; (0, reason) when the server cannot be reached."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


class TritonServer:
    """A ``tritonserver`` process serving one model repository; a context manager.

    >>> with TritonServer("triton_repo") as server:          # doctest: +SKIP
    ...     SpecbuildClient(server.grpc_url).generate("Hello", 16)

    Ports given as 0 are chosen free at start. Addresses are loopback unless ``host`` says otherwise.
    """

    def __init__(
        self,
        repository: str | Path,
        *,
        host: str = TRITON_DEFAULTS.host,
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        log_verbose: int = 0,
        model_control: Literal["none", "explicit"] = "none",
        startup_timeout: float = 120.0,
        stop_timeout: float = 15.0,
        log_file: str | Path | None = None,
        extra_args: Sequence[str] = (),
        verify: bool = True,
        capture_dir: str | Path | None = None,
    ) -> None:
        """``capture_dir``: the capture store of a capturing release (made 0700 at start, named to its models by
        ``SPECBUILD_CAPTURE_DIR``); None: the server's environment decides (a capturing release without one
        does not load)."""
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise UsageError(f"model repository {repository} is not a folder",
                             "pass the folder written by `specbuild compile` (default: triton_repo/)")
        if model_control not in ("none", "explicit"):
            raise UsageError(f"model_control must be 'none' or 'explicit', not {model_control!r}")
        self.host = host
        self.ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self.log_verbose = log_verbose
        self.model_control = model_control
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
        self.verify = verify
        self.capture_dir = Path(capture_dir).expanduser().absolute() if capture_dir else None
        self.shm_prefix = f"{SHM_PREFIX}specbuild_{uuid.uuid4().hex[:12]}_"
        self._log_file = Path(log_file).resolve() if log_file else None
        self._workdir: Path | None = None
        self._bytecode_dirs: set[Path] = set()
        self._process: subprocess.Popen[bytes] | None = None

    # --- endpoints ---------------------------------------------------------------------------------------
    def _address(self, kind: str) -> str:
        return f"{reachable_host(self.host)}:{self.ports[kind]}"

    @property
    def http_url(self) -> str:
        return f"http://{self._address('http')}"

    @property
    def grpc_url(self) -> str:
        """``host:port``, the form ``tritonclient.grpc`` takes."""
        return self._address("grpc")

    @property
    def metrics_url(self) -> str:
        return f"http://{self._address('metrics')}/metrics"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path | None:
        if self._log_file:
            return self._log_file
        return self._workdir / "tritonserver.log" if self._workdir else None

    # --- command -----------------------------------------------------------------------------------------
    def command(self, install: TritonInstall, backends: Path) -> list[str]:
        """The ``tritonserver`` argv (ports must already be chosen)."""
        args = [
            str(install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--cache-directory={install.caches}",
            f"--http-address={self.host}", f"--http-port={self.ports['http']}",
            f"--grpc-address={self.host}", f"--grpc-port={self.ports['grpc']}",
            f"--metrics-address={self.host}", f"--metrics-port={self.ports['metrics']}",
            "--allow-gpu-metrics=false",
            "--exit-on-error=true",
            "--strict-readiness=true",
            "--disable-auto-complete-config",
            f"--exit-timeout-secs={max(1, int(self.stop_timeout) - 2)}",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self.model_control == "explicit":
            args.append("--model-control-mode=explicit")
        return args + list(self.extra_args)

    def environment(self, install: TritonInstall) -> dict[str, str]:
        """The server's environment: wheel libraries, this Python's libpython, this environment first; the capture
        store, if given."""
        env = dict(os.environ)
        libs = [str(install.libs), str(sysconfig.get_config_var("LIBDIR") or "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in [*libs, env.get("LD_LIBRARY_PATH", "")] if p)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        if self.capture_dir is not None:
            env[CAPTURE_DIR_ENV] = str(self.capture_dir)
        return env

    def describe(self) -> str:
        """What :meth:`start` does, as a runnable shell script (``serve --dry-run``); nothing is created."""
        install = find_triton()
        env = self.environment(install)
        sources = (install.python_backend / "libtriton_python.so",
                   install.python_backend / "triton_python_backend_utils.py", install.stub())
        argv = ['--backend-directory="$BACKENDS"' if arg.startswith("--backend-directory=") else shlex.quote(arg)
                for arg in self.command(install, Path("."))]
        libs = env["LD_LIBRARY_PATH"].split(os.pathsep)[:2]
        free = [kind for kind, port in self.ports.items() if port == 0]
        note = [f"# {' and '.join(free)} port{'s' * (len(free) > 1)} 0: picked free by `specbuild serve` at start; set "
                f"{'them' if len(free) > 1 else 'it'} to run this by hand"] if free else []
        return "\n".join([
            *note,
            'BACKENDS="$(mktemp -d)" && mkdir "$BACKENDS/python"',
            f'cp {" ".join(shlex.quote(str(path)) for path in sources)} "$BACKENDS/python/"',
            f"LD_LIBRARY_PATH={shlex.quote(os.pathsep.join(libs))} "
            + (f"{CAPTURE_DIR_ENV}={shlex.quote(env[CAPTURE_DIR_ENV])} " if self.capture_dir else "")
            + f'PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH" \\',
            "  " + " ".join(argv),
        ])

    @staticmethod
    def _assemble_backends(install: TritonInstall, folder: Path) -> Path:
        python = folder / "python"
        python.mkdir(parents=True)
        for source in (install.python_backend / "libtriton_python.so",
                       install.python_backend / "triton_python_backend_utils.py", install.stub()):
            shutil.copy2(source, python / source.name)
        return folder

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> "TritonServer":
        """Start the server and return once it is ready; raise :class:`ServerError` otherwise."""
        if self._process is not None:
            raise ServerError("this server is already started")
        if self.verify:
            from specbuild.package.manifest import refuse_modified_release

            refuse_modified_release(self.repository)
        install = find_triton()
        if self.capture_dir is not None:
            open_store(self.capture_dir)
        self._workdir = Path(tempfile.mkdtemp(prefix="specbuild-triton-"))
        self._bytecode_dirs = self._model_bytecode_dirs()
        _RUNNING.add(self)
        _guard_signals()
        try:
            backends = self._assemble_backends(install, self._workdir / "backends")
            unset = [kind for kind, port in self.ports.items() if not port]
            picked = free_ports(len(unset), self.host if self.host not in ("0.0.0.0", "::") else "",
                                avoid=set(self.ports.values()))
            self.ports.update(zip(unset, picked))
            assert self.log_path is not None
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "wb") as log:
                # A session of its own: Ctrl-C in a terminal reaches us, and we stop the server cleanly.
                self._process = subprocess.Popen(
                    self.command(install, backends), env=self.environment(install), cwd=self._workdir,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            atexit.register(self.stop)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _model_bytecode_dirs(self) -> set[Path]:
        """``__pycache__`` folders in the repository: the stubs' embedded Python writes them when importing model.py
        and the specbuild modules shipped beside it (it ignores PYTHONDONTWRITEBYTECODE), and left there they would
        clutter a verified release."""
        return set(self.repository.glob("*/*/**/__pycache__"))

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                excerpt = self._log_excerpt()  # read once, for the message and its fix
                raise ServerError(self._failure(f"tritonserver exited with code {code} while starting", excerpt),
                                  start_failure_fix(excerpt))
            if _http_status(f"{self.http_url}/v2/health/ready", timeout=1.0)[0] == 200:
                return
            time.sleep(0.1)
        raise ServerError(
            self._failure(f"tritonserver was not ready after {self.startup_timeout:g} s", self._log_excerpt()),
            "read the server log above; raise the startup timeout if the models are large and slow to load",
        )

    def _log_excerpt(self) -> list[str]:
        """The server log's errors worth showing (:func:`log_errors`), else its last 20 lines."""
        log = self.read_log()
        return log_errors(log) or log.splitlines()[-20:]

    def _failure(self, headline: str, excerpt: list[str]) -> str:
        where = f" (log: {self._log_file})" if self._log_file else ""
        return headline + where + ":\n" + "\n".join(f"  {line}" for line in excerpt)

    def read_log(self) -> str:
        path = self.log_path
        return path.read_text("utf-8", "replace") if path and path.is_file() else ""

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_timeout``) and clean up; idempotent. The process is
        forgotten only once its group is gone, so a stop interrupted by a signal is completed by the signal's."""
        atexit.unregister(self.stop)
        code = None
        process = self._process
        if process is not None:
            code = process.poll()
            if code is None:
                process.send_signal(signal.SIGTERM)
                try:
                    code = process.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    code = None
            # The python backend's stub processes live in the server's process group: end them all.
            kill_group(process.pid)
            if code is None:
                code = process.wait()
            self._process = None
        for region in SHM_DIR.glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)
        for folder in self._model_bytecode_dirs() - self._bytecode_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        if self._workdir is not None:  # the default log goes too: errors were already raised with its lines
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        _RUNNING.discard(self)
        if not _RUNNING:
            _restore_signals()
        return code

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- processes ---------------------------------------------------------------------------------------
    def processes(self) -> dict[str, int]:
        """PIDs of the server (``"tritonserver"``) and of its python model stubs, by instance (``"draft_0_0"``).

        Stubs are found by this server's private shm prefix in their command line (argv: model path, shm
        region, sizes, parent pid, backend dir, ipc handle, instance name, ...).
        """
        found = {"tritonserver": self.pid} if self.is_running() and self.pid else {}
        prefix = self.shm_prefix.encode()
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
            except OSError:
                continue
            if len(argv) > 8 and argv[0].endswith(b"triton_python_backend_stub") and argv[2].startswith(prefix):
                found[argv[8].decode("utf-8", "replace")] = int(entry.name)
        return found

    def shm_bytes(self) -> int:
        """Bytes of /dev/shm held by this server's python backend regions."""
        total = 0
        for region in SHM_DIR.glob(f"{self.shm_prefix}*"):
            try:
                total += region.stat().st_size
            except OSError:  # a region removed between listing and stat
                continue
        return total

    # --- models ------------------------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def model_ready(self, name: str) -> bool:
        return _http_status(f"{self.http_url}/v2/models/{name}/ready")[0] == 200

    def load_model(self, name: str) -> None:
        """Load (or reload) ``name``; needs ``model_control="explicit"``."""
        self._repository_call(name, "load")

    def unload_model(self, name: str) -> None:
        self._repository_call(name, "unload")

    def _repository_call(self, name: str, action: str) -> None:
        if self.model_control != "explicit":
            raise UsageError(f"cannot {action} model {name!r}: the server runs with model_control='none'",
                             "start the server with model_control='explicit'")
        status, body = _http_status(f"{self.http_url}/v2/repository/models/{name}/{action}", "POST", timeout=600)
        if status != 200:
            raise ServerError(f"{action} of model {name!r} failed: {body or 'server unreachable'}",
                              f"read the server log at {self.log_path}")

    # --- CLI ---------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The running server's addresses and processes (what ``serve --json`` announces when ready)."""
        return {"repository": str(self.repository), "grpc_url": self.grpc_url, "http_url": self.http_url,
                "metrics_url": self.metrics_url, "pid": self.pid, "processes": self.processes(),
                "shm_prefix": self.shm_prefix, "log": str(self.log_path),
                "capture_dir": str(self.capture_dir) if self.capture_dir else None}

    def serve_forever(self, announce: Callable[[str], None] = print, on_ready: Callable[[], Any] | None = None,
                      endpoints: Mapping[str, str] | None = None) -> int:
        """Start (if needed), announce the endpoints (and ``endpoints``, served beside it; then call ``on_ready``)
        and serve until SIGINT/SIGTERM or the server dies.

        Returns 0 after a requested shutdown; raises :class:`ServerError` if the server exits by itself.
        Must run in the main thread (it installs signal handlers).
        """
        if self._process is None:
            self.start()  # a signal while loading stops the server (see _on_stop_signal) and unwinds
        try:
            with stop_signals() as stop:
                announce(f"serving {self.repository} (tritonserver pid {self.pid})")
                announce(f"  gRPC     {self.grpc_url}")
                announce(f"  HTTP     {self.http_url}")
                announce(f"  metrics  {self.metrics_url}")
                for name, url in (endpoints or {}).items():
                    announce(f"  {name:<8} {url}")
                announce(f"  log      {self.log_path}")
                announce("press Ctrl-C to stop")
                if on_ready is not None:
                    on_ready()
                if not wait_until(stop, self.is_running):
                    raise ServerError(self._failure("tritonserver exited unexpectedly", self._log_excerpt()),
                                      "read the errors above, fix the cause and serve again")
            announce("stopping tritonserver")
            return 0
        finally:
            self.stop()
