"""``specbuild serve``, ``openai``, ``generate``, ``verify``, ``deploy`` and ``monitoring``: a compiled release, served,
deployed or watched."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import click

from specbuild.cli.common import console, generation_json, json_option, main, print_json, reports_errors
from specbuild.monitoring.rules import DEFAULT_MIN_ACCEPTANCE
from specbuild.runtimes.pod_plans import CPU_IMAGE, REPLICA_CEILING, DeployOptions
from specbuild.spec import LOCAL_GRPC_URL, TRITON_DEFAULTS, parse_override
from specbuild.speculation.request_settings import REQUEST_SETTINGS

DEPLOY = DeployOptions()  # `specbuild deploy`'s defaults

@main.command()
@click.argument("directory", type=click.Path())
@json_option
@reports_errors
def verify(directory: str, json_mode: bool) -> None:
    """Re-hash a release against its manifest.json (DIR: the repository folder, or the folder above it).

    Exit 0: every file matches; 1: changed, missing or extra files (listed); 2: no manifest found.
    """
    from specbuild.errors import VerificationError
    from specbuild.package.manifest import report_table
    from specbuild.package.manifest import verify as verify_release

    report = verify_release(directory)
    if not report.ok:
        if not json_mode:
            console.print(report_table(report))
        raise VerificationError(report.summary(), report.fix, details=report.to_json())
    cost = _cost_model(report.manifest.parent)
    if json_mode:
        print_json({**report.to_json(), **({"cost_model": cost[1]} if cost else {})})
    else:
        console.print(f"[green]ok[/]: {report.checked} files match {report.manifest} (profile {report.profile_id})")
        if cost:
            console.print(cost[0], highlight=False)


@main.command()
@click.argument("release", type=click.Path())
@click.option("--image", default=None, help="run it in this container image (`docker run`, the release mounted as "
              "`serve` mounts it, its GPUs given)  [default: here, with this Python]")
@click.option("--dry-run", is_flag=True, help="print the command that runs the doctor instead of running it")
@json_option
@reports_errors
def doctor(release: str, image: str | None, dry_run: bool, json_mode: bool) -> None:
    """Check that this environment (or IMAGE) builds and serves the release in RELEASE as specbuild built it: the
    doctor the release ships, each check a verdict (pass, fail, not checkable here), its evidence and fix.

    Exit 0: nothing failed; 1: a check failed.
    """
    from specbuild.doctor import doctor_command, run_doctor

    if dry_run:
        command = doctor_command(release, image=image)
        print_json({"command": command}) if json_mode else click.echo(shlex.join(command))
        return
    report = run_doctor(release, image=image)
    if json_mode:
        print_json(report.to_json())
    else:
        _print_doctor(report)
    if not report.ok:
        sys.exit(1)


def _print_doctor(report: Any) -> None:
    """A doctor's report, one check a line (its fix below a fail)."""
    colors = {"pass": "green", "fail": "red"}
    where = f"in {report.image}" if report.image else "here"
    console.print(f"doctor of {report.release} ({report.runtime} runtime), {where}: Python {report.python}, "
                  f"Triton {report.triton or 'unknown'}", highlight=False)
    for check in report.checks:
        color = colors.get(check.verdict, "yellow")
        console.print(f"[{color}]{check.verdict}[/] {check.name}: {check.evidence}", highlight=False, soft_wrap=True)
        if check.fix:
            console.print(f"  fix: {check.fix}", highlight=False, soft_wrap=True)


def _doctor_before_serving(repository: Path, image: str) -> None:
    """Run the release's doctor in ``image`` before its server starts; a fail refuses to serve."""
    from specbuild.doctor import run_doctor
    from specbuild.errors import VerificationError

    console.print(f"running the release's doctor in {image} (`--no-doctor` skips it)", highlight=False)
    report = run_doctor(repository, image=image)
    if not report.ok:
        _print_doctor(report)
        failed = report.failed
        raise VerificationError(f"the doctor failed {', '.join(check.name for check in failed)} in {image}",
                                "; ".join(check.fix for check in failed if check.fix) + "; or serve with --no-doctor "
                                "to skip it (the failures stand)", details=report.to_json())


def _cost_model(repository: Path) -> tuple[str, dict[str, Any]] | None:
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


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("--host", default=None, help="bind address  [default: the release's triton.host, "
              f"{TRITON_DEFAULTS.host}]")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None,
              help=f"[default: the release's triton.http_port, {TRITON_DEFAULTS.http_port}; 0 = a free port]")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help=f"[default: the release's triton.grpc_port, {TRITON_DEFAULTS.grpc_port}; 0 = a free port]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help=f"[default: the release's triton.metrics_port, {TRITON_DEFAULTS.metrics_port}; 0 = a free port]")
@click.option("--openai-port", type=click.IntRange(0, 65535), default=None,
              help="the OpenAI-compatible API  [default: the release's triton.openai_port, "
              f"{TRITON_DEFAULTS.openai_port}; 0 = a free port]")
@click.option("--no-openai", is_flag=True, help="serve Triton only, without the OpenAI-compatible API")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="seconds to wait for the models to load (bundled server)")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="keep the server log here (bundled server)")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="launch settings (triton.host, the ports, triton.image, ...); the rest is the release's")
@click.option("--dry-run", is_flag=True, help="print the commands instead of running them")
@click.option("--no-verify", is_flag=True, help="serve even if the release differs from its manifest.json")
@click.option("--no-doctor", is_flag=True, help="a GPU release: start Triton without running the release's doctor "
              "in its image first")
@click.option("--rehearse", is_flag=True, help="a tensorrt-llm-llmapi release: serve it here on the bundled Triton, "
              "a CPU stand-in in place of TensorRT-LLM's LLM-API model")
@click.option("--json", "json_mode", is_flag=True, help="JSON Lines on stdout: one object when the server is ready "
              "(URLs, PIDs), one when it stops (or the error); with --dry-run, one document")
@reports_errors
def serve(repository: str, host: str | None, http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, openai_port: int | None, no_openai: bool, timeout: float, log_file: str | None,
          assignments: tuple[str, ...], dry_run: bool, no_verify: bool, no_doctor: bool, rehearse: bool,
          json_mode: bool) -> None:
    """Serve the release in REPOSITORY (default: triton_repo) with Triton, and specbuild's OpenAI-compatible API
    next to it, until Ctrl-C or SIGTERM.

    A torch release runs on the Triton server bundled with specbuild (loopback by default); a tensorrt-llm or
    tensorrt-llm-llmapi release in its NGC container, laid out as it was compiled (`--dry-run` prints the
    docker/mpirun commands), or, rehearsed, a tensorrt-llm-llmapi release on the bundled server. The API runs
    for releases with specbuild's orchestrator (torch, tensorrt-llm), on this host beside a container; a
    repository without a release manifest gets Triton only.
    """
    from specbuild.runtimes.launch_plans import LaunchPlan

    release, model = _release_and_name(repository)
    overrides = launch_overrides(assignments, host=host, http_port=http_port, grpc_port=grpc_port,
                                 metrics_port=metrics_port, openai_port=openai_port)
    plan = _launch_plan(repository, release is not None, overrides, rehearse=rehearse, verify_files=not no_verify)
    if isinstance(plan, LaunchPlan):
        _serve_in_container(plan, release.repository, model, with_openai=not no_openai, dry_run=dry_run,
                            json_mode=json_mode, doctor=not no_doctor)
    else:
        _serve_bundled(plan, model, with_openai=not no_openai, timeout=timeout, log_file=log_file, dry_run=dry_run,
                       json_mode=json_mode)


def _launch_plan(repository: str, released: bool, overrides: dict[str, Any], *, rehearse: bool,
                 verify_files: bool) -> Any:
    """What ``serve`` runs: the release's launch plan (its runtime's), its CPU rehearsal, or, for a repository
    without a release manifest, that repository on the bundled server."""
    import atexit
    import shutil
    import tempfile

    from specbuild.serve.release_launch import rehearsal_plan, release_launch_plan, repository_plan

    if rehearse:
        workdir = tempfile.mkdtemp(prefix="specbuild-rehearsal-")
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
        return rehearsal_plan(repository, overrides, Path(workdir))
    if not released:
        return repository_plan(repository, overrides)
    return release_launch_plan(repository, overrides, verify_files=verify_files)


def _serve_in_container(plan: Any, repository: Path, model: str, *, with_openai: bool, dry_run: bool,
                        json_mode: bool, doctor: bool) -> None:
    """Run ``plan`` (a :class:`~specbuild.runtimes.launch_plans.LaunchPlan`) in the foreground, the OpenAI-compatible
    API on this host beside it where the release has one; ``doctor``: the release's doctor in the plan's image
    first, refusing on a fail."""
    from specbuild.doctor import doctor_command
    from specbuild.serve.frontend import OpenAIFrontend, serves_openai
    from specbuild.serve.processes import reachable_host, run_foreground

    if dry_run:
        cost = _cost_model(repository)
        check = doctor_command(repository, image=plan.image) if doctor else None
        if json_mode:
            print_json({**plan.to_dict(), "cost_model": cost[1] if cost else None, "doctor_command": check})
        else:
            if cost:
                click.echo(f"# {cost[0]}")
            click.echo("# first the release's doctor in the image (a fail refuses to serve):\n"
                       + shlex.join(check) if check else "# the doctor is skipped (--no-doctor)")
            click.echo(plan.render())
        return
    if doctor:
        _doctor_before_serving(repository, plan.image)
    else:
        console.print("[bold yellow]warning:[/] --no-doctor: Triton starts without the release's doctor, so a package, "
                      "RoPE or python backend mismatch with the image shows only as a failed load or other text",
                      highlight=False)
    if json_mode:
        print_json({"event": "starting", "command": list(plan.docker_argv)}, line=True)
    with contextlib.ExitStack() as beside:
        if with_openai and plan.openai_port is not None and serves_openai(repository):
            frontend = beside.enter_context(OpenAIFrontend(
                repository, f"{reachable_host(plan.host)}:{plan.ports['grpc']}", model, host=plan.host,
                port=plan.openai_port))
            console.print(f"OpenAI-compatible API at {frontend.url} (ready once Triton is)", highlight=False)
        code = run_foreground(plan.docker_argv)
    if json_mode:
        print_json({"event": "stopped", "exit_code": code}, line=True)
    sys.exit(code)


def _openai_beside(plan: Any, model: str) -> dict[str, Any]:
    """The OpenAI-compatible API ``serve`` runs beside ``plan``'s server: its URL, and the command that runs it
    alone for a server started by hand (``specbuild openai``)."""
    from specbuild.serve.processes import reachable_host

    triton = f"{reachable_host(plan.host)}:{plan.ports['grpc']}"
    return {"model": model, "url": f"http://{reachable_host(plan.host)}:{plan.openai_port}/v1",
            "command": ["specbuild", "openai", str(plan.repository), "--triton", triton, "--host", plan.host,
                        "--port", str(plan.openai_port)]}


def _serve_bundled(plan: Any, model: str, *, with_openai: bool, timeout: float, log_file: str | None,
                   dry_run: bool, json_mode: bool) -> None:
    """Serve ``plan`` (a :class:`~specbuild.runtimes.launch_plans.BundledPlan`) on the Triton server bundled with
    specbuild until a stop signal, the OpenAI-compatible API beside it where the release has one (the release was
    verified when its plan was made)."""
    from specbuild.serve.frontend import OpenAIFrontend, serves_openai
    from specbuild.serve.server import TritonServer

    repository = plan.repository
    server = TritonServer(repository, host=plan.host, startup_timeout=timeout, log_file=log_file, verify=False,
                          **{f"{kind}_port": port for kind, port in plan.ports.items()})
    with_openai = with_openai and plan.openai_port is not None and serves_openai(repository)
    if dry_run:
        openai = _openai_beside(plan, model) if with_openai else None
        cost = _cost_model(repository)
        if json_mode:
            print_json({"script": server.describe(), "openai": openai, "cost_model": cost[1] if cost else None})
        else:
            if cost:
                click.echo(f"# {cost[0]}")
            click.echo(server.describe())
            if openai:
                free = " (port 0: picked free at start)" if plan.openai_port == 0 else ""
                click.echo(f"# and the OpenAI-compatible API at {openai['url']}, in the `specbuild serve` process"
                           f"{free}; beside a server started by hand:\n{shlex.join(openai['command'])}")
        return
    console.print(f"starting tritonserver on {repository} (up to {timeout:g} s to load the models)")
    endpoints: dict[str, str] = {}

    def ready() -> None:
        if json_mode:
            print_json({"event": "ready", **server.status(), **{"openai_url": url for url in endpoints.values()}},
                       line=True)

    with contextlib.ExitStack() as beside:
        if with_openai:
            server.start()  # a signal while loading stops it and unwinds
            frontend = beside.enter_context(OpenAIFrontend(repository, server.grpc_url, model, host=plan.host,
                                                           port=plan.openai_port))
            endpoints["OpenAI"] = frontend.url
        server.serve_forever(announce=lambda line: console.print(line, highlight=False, soft_wrap=True),
                             on_ready=ready, endpoints=endpoints)
    if json_mode:
        print_json({"event": "stopped", "exit_code": 0}, line=True)


@main.command("openai")
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("--triton", "triton_url", default=LOCAL_GRPC_URL, show_default=True,
              help="gRPC address of the Triton server that serves the release")
@click.option("--host", default=TRITON_DEFAULTS.host, show_default=True, help="bind address")
@click.option("--port", type=click.IntRange(0, 65535), default=TRITON_DEFAULTS.openai_port, show_default=True,
              help="0 = a free port")
@click.option("--dry-run", is_flag=True, help="say what would be served, and where, without serving it")
@click.option("--json", "json_mode", is_flag=True, help="JSON Lines on stdout: one object when the API is ready "
              "(URL, model), one when it stops (or the error); with --dry-run, one document")
@reports_errors
def openai_command(repository: str, triton_url: str, host: str, port: int, dry_run: bool, json_mode: bool) -> None:
    """Serve the OpenAI-compatible API of the release in REPOSITORY for a Triton server running elsewhere (a
    container, a Kubernetes pod's Triton) until Ctrl-C or SIGTERM."""
    from specbuild.errors import ServerError, UsageError
    from specbuild.serve.frontend import OpenAIFrontend, serves_openai
    from specbuild.serve.processes import stop_signals, wait_until

    if not serves_openai(repository):
        raise UsageError(f"{repository} is not a release the OpenAI-compatible API can serve (it needs the "
                         "orchestrator and preprocessing models of a torch or tensorrt-llm release)",
                         "pass the repository folder `specbuild compile` wrote for such a release")
    _, model = _release_and_name(repository)
    frontend = OpenAIFrontend(repository, triton_url, model, host=host, port=port)
    if dry_run:
        plan = {"model": model, "url": frontend.url, "triton": triton_url, "repository": str(Path(repository))}
        if json_mode:
            print_json(plan)
        else:
            console.print(f"would serve {model} at {frontend.url} (Triton at {triton_url})", highlight=False)
        return
    with frontend, stop_signals() as stop:
        if json_mode:
            print_json({"event": "ready", "model": model, "url": frontend.url, "triton": triton_url}, line=True)
        console.print(f"OpenAI-compatible API for {model} at {frontend.url} (Triton at {triton_url}); "
                      "press Ctrl-C to stop", highlight=False)
        if not wait_until(stop, frontend.is_running):
            raise ServerError("the OpenAI-compatible API stopped unexpectedly", "read the errors above")
    if json_mode:
        print_json({"event": "stopped", "exit_code": 0}, line=True)


def setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """An option for each request setting that has one (``--prompt-lookup/--no-prompt-lookup`` for a flag), passed to
    the command by the setting's name; unset: the release's default."""
    for setting in reversed([setting for setting in REQUEST_SETTINGS if setting.flag]):
        name = "--" + setting.name.replace("_", "-")
        kind = {} if setting.kind is bool else {"type": setting.kind}
        command = click.option(f"{name}/--no-{name[2:]}" if setting.kind is bool else name, setting.name,
                               default=None, help=setting.option_help, **kind)(command)
    return command


@main.command()
@click.argument("prompt")
@click.option("--url", default=LOCAL_GRPC_URL, show_default=True, help="Triton gRPC address")
@click.option("--model", default="ensemble", show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--stream/--no-stream", default=True, show_default=True, help="print text as it is accepted")
@click.option("--raw", is_flag=True, help="continue PROMPT as plain text  [default: a user message in the model's "
              "chat template, for a model that has one]")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="0 or none: greedy; above 0: sampling (the whole distribution unless --top-k/--top-p)")
@click.option("--top-k", type=click.IntRange(min=0), default=None)
@click.option("--top-p", type=click.FloatRange(0, 1), default=None)
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None, help="reproducible sampling")
@setting_options
@click.option("--stop", "stop_words", multiple=True, help="stop after this text (repeatable)")
@click.option("--json-schema", "json_schema", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="hold the answer to the JSON schema in this file (guided decoding)")
@click.option("--regex", default=None, help="hold the answer to this regular expression")
@click.option("--grammar", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="hold the answer to the EBNF grammar in this file (xgrammar's dialect, as TensorRT-LLM's)")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True)
@click.option("--json", "json_mode", is_flag=True, help="one JSON document with the text and figures; with --stream, "
              "JSON Lines: one object per chunk, then the summary")
@reports_errors
def generate(prompt: str, url: str, model: str, max_tokens: int, stream: bool, raw: bool, temperature: float | None,
             top_k: int | None, top_p: float | None, seed: int | None, stop_words: tuple[str, ...],
             json_schema: Path | None, regex: str | None, grammar: Path | None, timeout: float, json_mode: bool,
             **settings: Any) -> None:
    """Send PROMPT (or - for stdin, kept exactly as read) to a served ensemble; text on stdout, figures on
    stderr."""
    from specbuild.errors import UsageError
    from specbuild.serve.client import GenerationRequest, SpecbuildClient
    from specbuild.speculation.rules import explicit_sampling

    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        raise UsageError("the prompt is empty", "pass the prompt as an argument, or pipe it in with -")
    guides = {"json_schema": json_schema and json_schema.read_text(encoding="utf-8"), "regex": regex,
              "ebnf_grammar": grammar and grammar.read_text(encoding="utf-8")}
    chosen = {kind: guide for kind, guide in guides.items() if guide is not None}
    if len(chosen) > 1:
        raise UsageError("--json-schema, --regex and --grammar each guide the whole answer", "pass one of them")
    guide_type, guide = next(iter(chosen.items()), (None, None))
    request = GenerationRequest(text, max_tokens, stream=stream, chat=None if raw else True, seed=seed, **settings,
                                stop_words=list(stop_words) or None, guided_decoding_guide_type=guide_type,
                                guided_decoding_guide=guide, **explicit_sampling(temperature, top_k, top_p))
    client = SpecbuildClient(url, model, timeout=timeout)
    if not json_mode:
        generation = client.run(request, on_chunk=lambda chunk: click.echo(chunk.text, nl=False))
        click.echo()
        console.print(generation.summary(), highlight=False, soft_wrap=True)
    elif stream:
        generation = client.run(request, on_chunk=lambda chunk: print_json({"chunk": dataclasses.asdict(chunk)},
                                                                            line=True))
        print_json({"summary": generation_json(generation)}, line=True)
    else:
        print_json(generation_json(client.run(request)))


def _has_manifest(repository: str) -> bool:
    from specbuild.package.manifest import MANIFEST_NAME

    return (Path(repository) / MANIFEST_NAME).is_file()


def _release_and_name(repository: str) -> tuple[Any, str]:
    """The compiled release in ``repository`` (None for a repository without a manifest) and the model name the
    OpenAI-compatible API serves it as: the release's name, else the folder's."""
    from specbuild.package.manifest import read_release

    release = read_release(repository) if _has_manifest(repository) else None
    return release, release.spec.name if release is not None else Path(repository).resolve().name


def launch_overrides(assignments: tuple[str, ...], **settings: Any) -> dict[str, Any]:
    """``--set`` assignments and launch flags (``triton.<key>``: value, None = not given) as dotted overrides."""
    overrides = dict(parse_override(item) for item in assignments)
    overrides.update({f"triton.{key}": value for key, value in settings.items() if value is not None})
    return overrides


def _label(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """``("release=prometheus",)`` -> ``{"release": "prometheus"}``."""
    labels = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE, e.g. release=prometheus")
        labels[key] = label
    return labels


def alert_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The alerts' thresholds (specbuild.monitoring.rules), for ``deploy`` and ``monitoring``."""
    command = click.option("--ttft-p95", "ttft_p95_seconds", type=click.FloatRange(min=0, min_open=True),
                           default=None, metavar="SECONDS",
                           help="alert when the p95 time to first token stays above this  [default: the release's "
                           "runtime's]")(command)
    return click.option("--min-acceptance", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
                        help="alert when the acceptance rate stays below this (the release's break-even)  "
                        f"[default: {DEFAULT_MIN_ACCEPTANCE:g}]")(command)


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("-o", "--out", "--k8s", "out_dir", required=True, metavar="DIR|-",
              help="folder to write the manifests into (one <kind>.yaml per object, and the prometheus-adapter "
                   "rule), or - for a YAML stream on stdout (kubectl apply -f -)")
@click.option("--replicas", type=click.IntRange(min=1), default=DEPLOY.replicas, show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=None,
              help=f"HPA ceiling  [default: {REPLICA_CEILING} x replicas]")
@click.option("--namespace", default=DEPLOY.namespace, show_default=True)
@click.option("--pvc", default=None, help="PersistentVolumeClaim holding the release's engines and repository folders")
@click.option("--release-image", default=None, help="image with /release/<engines> and /release/<repository> "
              "(docker/Dockerfile.release), copied by an init container")
@click.option("--image", default=None, help="the serving image  [default: the release's triton.image; for a torch "
              f"release {CPU_IMAGE}, built from docker/Dockerfile.cpu]")
@click.option("--cpu", type=click.FloatRange(min=0, min_open=True), default=None,
              help="CPU cores per replica  [default: from the release]")
@click.option("--memory-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="host memory per replica  [default: /dev/shm + engines + server, from the release]")
@click.option("--monitor-label", "monitor_labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="label of the PodMonitor and PrometheusRule, for your Prometheus's podMonitorSelector and "
              "ruleSelector (repeatable)")
@click.option("--dashboard-label", "dashboard_labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="label of the dashboard's ConfigMap, for Grafana's dashboard sidecar (repeatable)  "
              f"[default: {','.join(f'{key}={value}' for key, value in DEPLOY.dashboard_labels.items())}]")
@alert_options
@click.option("--openai-image", default=DEPLOY.openai_image, show_default=True,
              help="a GPU release: the image of the OpenAI-compatible API's container beside Triton "
              "(docker/Dockerfile.cpu)")
@click.option("--kserve", is_flag=True, help="write a KServe ServingRuntime + InferenceService instead")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="launch settings (triton.image, triton.host, ports); the rest is the release's")
@click.option("--json", "json_mode", is_flag=True, help="the files written as JSON; with -o -, the objects as one "
              "JSON document (a v1 List, which kubectl applies too)")
@reports_errors
def deploy(repository: str, out_dir: str, replicas: int, max_replicas: int | None, namespace: str, pvc: str | None,
           release_image: str | None, image: str | None, cpu: float | None, memory_gib: float | None,
           monitor_labels: dict[str, str], dashboard_labels: dict[str, str], min_acceptance: float | None,
           ttft_p95_seconds: float | None, openai_image: str, kserve: bool, assignments: tuple[str, ...],
           json_mode: bool) -> None:
    """Write Kubernetes manifests serving the compiled release in REPOSITORY (default: triton_repo): a GPU release
    as compiled (its launch layout, on the GPU its engines were built on), a torch release on CPUs.

    Each replica gets CPU and memory requests and limits, a PodDisruptionBudget, a Prometheus Operator PodMonitor
    and a HorizontalPodAutoscaler on the requests in flight (prometheus-adapter rule written beside them); the
    release gets a PrometheusRule (recording rules and alerts) and the Grafana dashboard in a ConfigMap.
    """
    from specbuild.package.manifest import read_release
    from specbuild.serve.k8s import release_manifests, to_yaml, write_manifests

    options = DeployOptions(namespace=namespace, replicas=replicas, max_replicas=max_replicas, pvc=pvc,
                            release_image=release_image, image=image, cpu=cpu, memory_gib=memory_gib,
                            monitor_labels=monitor_labels, min_acceptance=min_acceptance,
                            ttft_p95_seconds=ttft_p95_seconds, openai_image=openai_image,
                            **({"dashboard_labels": dashboard_labels} if dashboard_labels else {}))
    objects = release_manifests(read_release(repository), launch_overrides(assignments), options, kserve=kserve)
    if out_dir == "-":
        if json_mode:
            print_json({"apiVersion": "v1", "kind": "List", "items": objects})
        else:
            click.echo(to_yaml(objects), nl=False)
        console.print("the prometheus-adapter rule the autoscaler needs is written with -o DIR", highlight=False)
        return
    paths = write_manifests(out_dir, objects)
    for path in paths:
        console.print(f"wrote {path}", highlight=False)
    if json_mode:
        print_json({"files": [str(path.resolve()) for path in paths], "kinds": [item["kind"] for item in objects]})


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="folder to write prometheus.yml, the rule file and the dashboard into (docker/compose.yaml's "
              "prometheus profile reads ../monitoring)")
@alert_options
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="launch settings (ports: triton.metrics_port is scraped); the rest is the release's")
@json_option
@reports_errors
def monitoring(repository: str, out_dir: str, min_acceptance: float | None, ttft_p95_seconds: float | None,
               assignments: tuple[str, ...], json_mode: bool) -> None:
    """Write a Prometheus for the release in REPOSITORY served outside Kubernetes (docker/compose.yaml, profile
    prometheus): its scrape configuration, its recording and alerting rules, and the Grafana dashboard to import."""
    from specbuild.monitoring.prometheus_config import write_monitoring
    from specbuild.monitoring.rules import release_thresholds
    from specbuild.package.manifest import read_release
    from specbuild.serve.release_launch import release_launch_spec

    spec = release_launch_spec(read_release(repository).spec, launch_overrides(assignments))
    thresholds = release_thresholds(spec, min_acceptance=min_acceptance, ttft_p95_seconds=ttft_p95_seconds)
    paths = write_monitoring(out_dir, thresholds, spec.triton.metrics_port)
    if json_mode:
        print_json({"files": [str(path.resolve()) for path in paths]})
        return
    for path in paths:
        console.print(f"wrote {path}", highlight=False)
