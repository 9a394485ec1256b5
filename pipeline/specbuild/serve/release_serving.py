"""Serving a compiled release (``specbuild serve`` and ``specbuild openai``): the plan that serves it, its server run
in the foreground with the OpenAI-compatible API beside it where the release has one, a capturing release's store,
and the release's cost model as a dry run or ``verify`` shows it."""

from __future__ import annotations

import atexit
import contextlib
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.capture.store import default_store, refuse_inside_release
from specbuild.errors import ServerError, UsageError
from specbuild.package.contract import OrchestratorParameters
from specbuild.package.manifest import MANIFEST_NAME, Release, read_release
from specbuild.runtimes.launch_plans import BundledPlan, LaunchPlan
from specbuild.serve.frontend import OpenAIFrontend, serves_openai
from specbuild.serve.processes import reachable_host, run_foreground, stop_signals, wait_until
from specbuild.serve.release_launch import rehearsal_plan, release_launch_plan, repository_plan
from specbuild.serve.server import TritonServer

Announce = Callable[[str], None]


def served_release(repository: str) -> tuple[Release | None, str]:
    """The compiled release in ``repository`` (None for a repository without a manifest) and the model name the
    OpenAI-compatible API serves it as: the release's name, else the folder's."""
    release = read_release(repository) if (Path(repository) / MANIFEST_NAME).is_file() else None
    return release, release.spec.name if release is not None else Path(repository).resolve().name


def serving_plan(repository: str, released: bool, overrides: dict[str, Any], *, rehearse: bool,
                 verify_files: bool) -> LaunchPlan | BundledPlan:
    """What ``serve`` runs: the release's launch plan (its runtime's), its CPU rehearsal, or, for a repository
    without a release manifest, that repository on the bundled server."""
    if rehearse:
        workdir = tempfile.mkdtemp(prefix="specbuild-rehearsal-")
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
        return rehearsal_plan(repository, overrides, Path(workdir))
    if not released:
        return repository_plan(repository, overrides)
    return release_launch_plan(repository, overrides, verify_files=verify_files)


def cost_model(repository: Path) -> tuple[str, dict[str, Any]] | None:
    """The release's cost model and load policy (K by requests in flight), in words and as data, from its
    orchestrator's parameters (None: no orchestrator, as where TensorRT-LLM speculates inside its engine)."""
    from specbuild.package.parameters import ParameterError
    from specbuild.package.repository import orchestrator_settings

    try:
        settings = orchestrator_settings(repository)
    except ParameterError as exc:  # verify checks files; a release packaged before the cost model still verifies
        return f"cost model: not readable from the orchestrator's parameters ({exc.message}; {exc.fix})", {}
    if settings is None:
        return None
    cost, schedule = settings.cost_model, settings.load_schedule
    state = "on" if settings.break_even else "off"
    line = (f"{cost.describe(settings.max_draft_len)}; per-request break-even {state} by default; "
            f"K by load: {schedule.describe(settings.num_draft_tokens)}")
    return line, {**cost.to_dict(), "break_even": settings.break_even,
                  "draft_len_schedule": {str(count): k for count, k in schedule.steps}}


# --- capture ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CaptureNotice:
    """Where a capturing release's server writes, and what it says about it at start."""

    store: Path
    settings: OrchestratorParameters

    def lines(self) -> list[str]:
        """What is captured, where, how it is kept and how to delete it (never any captured data)."""
        s = self.settings
        return [f"capture: this release writes each finished request's prompt and generated token ids (the text: the "
                f"tokenizer decodes them), sampling settings and acceptance to {self.store}",
                f"  files readable by their owner only (0600, folder 0700); a new file every {s.capture_max_file_mib:g} "
                f"MiB or {s.capture_max_file_hours:g} h; deleted after {s.capture_retention_days:g} days",
                "  a request sent with store=false is not captured (generate --no-store; OpenAI's store: false)",
                f"  delete it all: specbuild capture purge {shlex.quote(str(self.store))}"]


def capture_notice(repository: Path, release: str, capture_dir: str | None) -> CaptureNotice | None:
    """The capture store of the release in ``repository`` (``release``: its name): ``capture_dir``, else
    :func:`~specbuild.capture.store.default_store`; None for a release that captures nothing (``capture_dir``
    given for one is a :class:`UsageError`)."""
    from specbuild.package.repository import orchestrator_settings

    settings = orchestrator_settings(repository)
    if settings is None or not settings.capture:
        if capture_dir is not None:
            raise UsageError(f"--capture-dir {capture_dir}: the release in {repository} captures nothing (its spec's "
                             "capture.enabled is false)", "leave --capture-dir out, or package the release with "
                             "capture.enabled: true")
        return None
    store = Path(capture_dir).expanduser().absolute() if capture_dir else default_store(release)
    refuse_inside_release(store, repository)
    return CaptureNotice(store, settings)


# --- a container's Triton (LaunchPlan) ----------------------------------------------------------------------------
def serve_in_container(plan: LaunchPlan, repository: Path, model: str, *, with_openai: bool,
                       announce: Announce) -> int:
    """Run ``plan`` in the foreground until it exits (its exit code), the OpenAI-compatible API on this host beside
    it where the release has one."""
    with contextlib.ExitStack() as beside:
        if with_openai and plan.openai_port is not None and serves_openai(repository):
            frontend = beside.enter_context(OpenAIFrontend(
                repository, f"{reachable_host(plan.host)}:{plan.ports['grpc']}", model, host=plan.host,
                port=plan.openai_port))
            announce(f"OpenAI-compatible API at {frontend.url} (ready once Triton is)")
        return run_foreground(plan.docker_argv)


# --- the bundled Triton (BundledPlan) -----------------------------------------------------------------------------
def bundled_server(plan: BundledPlan, *, timeout: float, log_file: str | None,
                   capture_dir: Path | None = None) -> TritonServer:
    """The bundled server of ``plan`` (the release was verified when its plan was made); ``capture_dir``: a
    capturing release's store."""
    return TritonServer(plan.repository, host=plan.host, startup_timeout=timeout, log_file=log_file, verify=False,
                        capture_dir=capture_dir, **{f"{kind}_port": port for kind, port in plan.ports.items()})


def openai_served_beside(plan: BundledPlan, with_openai: bool) -> bool:
    """Whether ``serve`` runs the OpenAI-compatible API beside ``plan``'s server: asked, given a port, and a
    release it can serve."""
    return with_openai and plan.openai_port is not None and serves_openai(plan.repository)


def openai_beside(plan: BundledPlan, model: str) -> dict[str, Any]:
    """The OpenAI-compatible API ``serve`` runs beside ``plan``'s server: its URL, and the command that runs it
    alone for a server started by hand (``specbuild openai``)."""
    triton = f"{reachable_host(plan.host)}:{plan.ports['grpc']}"
    return {"model": model, "url": f"http://{reachable_host(plan.host)}:{plan.openai_port}/v1",
            "command": ["specbuild", "openai", str(plan.repository), "--triton", triton, "--host", plan.host,
                        "--port", str(plan.openai_port)]}


def serve_bundled(server: TritonServer, plan: BundledPlan, model: str, *, with_openai: bool, announce: Announce,
                  on_ready: Callable[[dict[str, str]], None]) -> None:
    """Serve ``plan`` on ``server`` until a stop signal, the OpenAI-compatible API beside it where ``with_openai``;
    ``on_ready`` gets the endpoints beside Triton's once the models are loaded."""
    endpoints: dict[str, str] = {}
    with contextlib.ExitStack() as beside:
        if with_openai:
            server.start()  # a signal while loading stops it and unwinds
            frontend = beside.enter_context(OpenAIFrontend(plan.repository, server.grpc_url, model, host=plan.host,
                                                           port=plan.openai_port))
            endpoints["OpenAI"] = frontend.url
        server.serve_forever(announce=announce, on_ready=lambda: on_ready(endpoints), endpoints=endpoints)


# --- the API alone, for a Triton elsewhere ------------------------------------------------------------------------
def openai_frontend(repository: str, triton_url: str, *, host: str, port: int) -> tuple[OpenAIFrontend, str]:
    """The OpenAI-compatible API of the release in ``repository`` for the Triton at ``triton_url``, and the model
    name it serves; a repository it cannot serve is a :class:`UsageError`."""
    if not serves_openai(repository):
        raise UsageError(f"{repository} is not a release the OpenAI-compatible API can serve (it needs the "
                         "orchestrator and preprocessing models of a torch or tensorrt-llm release)",
                         "pass the repository folder `specbuild compile` wrote for such a release")
    _, model = served_release(repository)
    return OpenAIFrontend(repository, triton_url, model, host=host, port=port), model


def serve_openai(frontend: OpenAIFrontend, on_ready: Callable[[], None]) -> None:
    """Serve ``frontend`` until Ctrl-C or SIGTERM (``on_ready`` once it listens); its stopping by itself is a
    :class:`ServerError`."""
    with frontend, stop_signals() as stop:
        on_ready()
        if not wait_until(stop, frontend.is_running):
            raise ServerError("the OpenAI-compatible API stopped unexpectedly", "read the errors above")
