"""``specbuild serve``, ``openai``, ``generate``, ``verify`` and ``doctor``: a compiled release, checked and served
(the serving itself: :mod:`specbuild.serve.release_serving`)."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import click

from specbuild.cli.common import console, generation_json, json_option, main, print_json, reports_errors
from specbuild.spec import LOCAL_GRPC_URL, TRITON_DEFAULTS
from specbuild.spec_sources import parse_override
from specbuild.speculation.request_settings import REQUEST_SETTINGS


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
    from specbuild.serve.release_serving import cost_model

    report = verify_release(directory)
    if not report.ok:
        if not json_mode:
            console.print(report_table(report))
        raise VerificationError(report.summary(), report.fix, details=report.to_json())
    cost = cost_model(report.manifest.parent)
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

    console.print(f"running the release's doctor in {image} (`--no-doctor` skips it)", highlight=False)
    report = run_doctor(repository, image=image)
    if not report.ok:
        _print_doctor(report)
        raise report.refusal_to_serve()


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
@click.option("--capture-dir", type=click.Path(file_okay=False), default=None,
              help="a capturing release (capture.enabled): its capture store, made 0700 (in a container: mounted "
              "read-write at /capture)  [default: ~/.local/state/specbuild/capture/<release name>]")
@click.option("--json", "json_mode", is_flag=True, help="JSON Lines on stdout: one object when the server is ready "
              "(URLs, PIDs), one when it stops (or the error); with --dry-run, one document")
@reports_errors
def serve(repository: str, host: str | None, http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, openai_port: int | None, no_openai: bool, timeout: float, log_file: str | None,
          assignments: tuple[str, ...], dry_run: bool, no_verify: bool, no_doctor: bool, rehearse: bool,
          capture_dir: str | None, json_mode: bool) -> None:
    """Serve the release in REPOSITORY (default: triton_repo) with Triton, and specbuild's OpenAI-compatible API
    next to it, until Ctrl-C or SIGTERM.

    A torch release runs on the Triton server bundled with specbuild (loopback by default); a tensorrt-llm or
    tensorrt-llm-llmapi release in its NGC container, laid out as it was compiled (`--dry-run` prints the
    docker/mpirun commands), or, rehearsed, a tensorrt-llm-llmapi release on the bundled server. The API runs
    for releases with specbuild's orchestrator (torch, tensorrt-llm), on this host beside a container; a
    repository without a release manifest gets Triton only.

    A release packaged with capture.enabled writes each finished request's token ids to its capture store
    (--capture-dir); serve says what and where at start, and how to purge it.
    """
    from specbuild.capture.store import open_store
    from specbuild.runtimes.launch_plans import LaunchPlan
    from specbuild.serve.release_serving import capture_notice, served_release, serving_plan

    release, model = served_release(repository)
    overrides = launch_overrides(assignments, host=host, http_port=http_port, grpc_port=grpc_port,
                                 metrics_port=metrics_port, openai_port=openai_port)
    plan = serving_plan(repository, release is not None, overrides, rehearse=rehearse, verify_files=not no_verify)
    capture = capture_notice(release.repository if isinstance(plan, LaunchPlan) else plan.repository, model,
                             capture_dir)
    if capture is not None and not dry_run:
        open_store(capture.store)
        for line in capture.lines():
            console.print(line, highlight=False, soft_wrap=True)
    if isinstance(plan, LaunchPlan):
        _serve_in_container(plan.with_capture(capture.store) if capture else plan, release.repository, model,
                            with_openai=not no_openai, dry_run=dry_run, json_mode=json_mode, doctor=not no_doctor)
    else:
        _serve_bundled(plan, model, with_openai=not no_openai, timeout=timeout, log_file=log_file, dry_run=dry_run,
                       json_mode=json_mode, capture_dir=capture.store if capture else None)


def _serve_in_container(plan: Any, repository: Path, model: str, *, with_openai: bool, dry_run: bool,
                        json_mode: bool, doctor: bool) -> None:
    """Run ``plan`` (a :class:`~specbuild.runtimes.launch_plans.LaunchPlan`) in the foreground, the OpenAI-compatible
    API on this host beside it where the release has one; ``doctor``: the release's doctor in the plan's image
    first, refusing on a fail."""
    from specbuild.doctor import doctor_command
    from specbuild.serve.release_serving import cost_model, serve_in_container

    if dry_run:
        cost = cost_model(repository)
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
    code = serve_in_container(plan, repository, model, with_openai=with_openai,
                              announce=lambda line: console.print(line, highlight=False))
    if json_mode:
        print_json({"event": "stopped", "exit_code": code}, line=True)
    sys.exit(code)


def _serve_bundled(plan: Any, model: str, *, with_openai: bool, timeout: float, log_file: str | None,
                   dry_run: bool, json_mode: bool, capture_dir: Path | None) -> None:
    """Serve ``plan`` (a :class:`~specbuild.runtimes.launch_plans.BundledPlan`) on the Triton server bundled with
    specbuild until a stop signal, the OpenAI-compatible API beside it where the release has one (the release was
    verified when its plan was made)."""
    from specbuild.serve.release_serving import (bundled_server, cost_model, openai_beside, openai_served_beside,
                                                 serve_bundled)

    server = bundled_server(plan, timeout=timeout, log_file=log_file, capture_dir=capture_dir)
    with_openai = openai_served_beside(plan, with_openai)
    if dry_run:
        openai = openai_beside(plan, model) if with_openai else None
        cost = cost_model(plan.repository)
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
    console.print(f"starting tritonserver on {plan.repository} (up to {timeout:g} s to load the models)")

    def ready(endpoints: dict[str, str]) -> None:
        if json_mode:
            print_json({"event": "ready", **server.status(), **{"openai_url": url for url in endpoints.values()}},
                       line=True)

    serve_bundled(server, plan, model, with_openai=with_openai, on_ready=ready,
                  announce=lambda line: console.print(line, highlight=False, soft_wrap=True))
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
    from specbuild.serve.release_serving import openai_frontend, serve_openai

    frontend, model = openai_frontend(repository, triton_url, host=host, port=port)
    if dry_run:
        plan = {"model": model, "url": frontend.url, "triton": triton_url, "repository": str(Path(repository))}
        if json_mode:
            print_json(plan)
        else:
            console.print(f"would serve {model} at {frontend.url} (Triton at {triton_url})", highlight=False)
        return

    def ready() -> None:
        if json_mode:
            print_json({"event": "ready", "model": model, "url": frontend.url, "triton": triton_url}, line=True)
        console.print(f"OpenAI-compatible API for {model} at {frontend.url} (Triton at {triton_url}); "
                      "press Ctrl-C to stop", highlight=False)

    serve_openai(frontend, ready)
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


def launch_overrides(assignments: tuple[str, ...], **settings: Any) -> dict[str, Any]:
    """``--set`` assignments and launch flags (``triton.<key>``: value, None = not given) as dotted overrides."""
    overrides = dict(parse_override(item) for item in assignments)
    overrides.update({f"triton.{key}": value for key, value in settings.items() if value is not None})
    return overrides
