"""The ``specbuild`` command line: thin Click wrappers that parse flags, call the API and report.

All logic lives in importable modules; every command here is a few lines that a release pipeline can
replace with a Python call. Errors the user can fix print as ``error: ... / fix: ...`` with a meaningful
exit code (README: "Exit codes"), never a traceback. Every command takes ``--json``: stdout then holds exactly
one JSON document, errors included (``{"error": ..., "fix": ..., "exit_code": ...}``), or, for the commands
that stream (``generate --stream``, ``serve``), one JSON object per line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.markup import escape

from specbuild.errors import SpecbuildError, Terminated
from specbuild.spec import DEFAULT_SPEC_FILE, RUNTIME_CHOICES, load_spec, parse_override

console = Console(stderr=True)
JSON_HELP = "machine-readable output: one JSON document on stdout, errors included"


def print_json(data: Any, *, line: bool = False) -> None:
    """A JSON document on stdout; ``line``: compact, one object of a JSON Lines stream."""
    click.echo(json.dumps(data, indent=None if line else 2, default=str))


def exit_with(error: dict[str, Any], json_mode: bool) -> None:
    """Report ``error`` (``{"error", "fix", "exit_code", ...}``) on stderr, and as JSON on stdout under ``--json``;
    exit with its code."""
    # soft_wrap: the terminal wraps, so a path in the message stays whole (copied as one) and no bracket in it
    # is read as markup
    console.print(f"[bold red]error:[/] {escape(error['error'])}", highlight=False, soft_wrap=True)
    if error.get("fix"):
        console.print(f"[bold]fix:[/] {escape(error['fix'])}", highlight=False, soft_wrap=True)
    if json_mode:
        print_json(error, line=True)  # one line: a document, and a valid last line of a JSON Lines stream
    sys.exit(error["exit_code"])


def reports_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a :class:`SpecbuildError` (or an interrupt) into a readable message and its exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_mode = bool(kwargs.get("json_mode"))
        try:
            return command(*args, **kwargs)
        except SpecbuildError as exc:
            exit_with(exc.to_json(), json_mode)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGINT while servers run (errors.Terminated)
            signum = getattr(exc, "signum", signal.SIGINT)
            stopped = "; the servers it started were stopped first" if isinstance(exc, Terminated) else ""
            exit_with({"error": f"interrupted by {signal.Signals(signum).name}{stopped}", "fix": None,
                       "exit_code": 128 + signum}, json_mode)

    return wrapper


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "json_mode", is_flag=True, help=JSON_HELP)(command)


class SpecbuildGroup(click.Group):
    """Click's own errors (an unknown option, a bad value) come as a JSON document too when ``--json`` is on the
    command line."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or "--json" not in argv:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            exc.show()
            where = exc.ctx.command_path if isinstance(exc, click.UsageError) and exc.ctx else "specbuild"
            print_json({"error": exc.format_message(), "fix": f"see `{where} --help`", "exit_code": exc.exit_code},
                       line=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            print_json({"error": "aborted", "fix": None, "exit_code": 1}, line=True)
            sys.exit(1)


def spec_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by commands that read a build spec; file values are overridden by flags."""
    options = [
        click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None,
                     help=f"build spec (default: ./{DEFAULT_SPEC_FILE} if it exists)"),
        click.option("--target", "target", default=None, help="target HF checkpoint folder"),
        click.option("--draft", "draft", default=None, help="draft HF checkpoint folder"),
        click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default=None),
        click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default=None,
                     help="dtype of both models"),
        click.option("--max-draft-len", type=int, default=None),
        click.option("--num-draft-tokens", type=int, default=None, help="default K per request"),
        click.option("--acceptance", type=click.Choice(["token-match", "draft-logits"]), default=None),
        click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                     help="override any spec field, e.g. --set limits.max_seq_len=4096"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def spec_from_options(spec_file: str | None, target: str | None, draft: str | None, runtime: str | None,
                      dtype: str | None, max_draft_len: int | None, num_draft_tokens: int | None,
                      acceptance: str | None, assignments: tuple[str, ...]):
    if spec_file is None and Path(DEFAULT_SPEC_FILE).is_file():
        spec_file = DEFAULT_SPEC_FILE
    flags = {
        "target.checkpoint": ("--target", target),
        "draft.checkpoint": ("--draft", draft),
        "runtime": ("--runtime", runtime),
        "target.dtype": ("--dtype", dtype),
        "draft.dtype": ("--dtype", dtype),
        "speculation.max_draft_len": ("--max-draft-len", max_draft_len),
        "speculation.num_draft_tokens": ("--num-draft-tokens", num_draft_tokens),
        "speculation.acceptance": ("--acceptance", acceptance),
    }
    overrides: dict[str, Any] = {key: value for key, (_, value) in flags.items()}
    sources = {key: f"{flag} {value}" for key, (flag, value) in flags.items()}
    for item in assignments:
        key, value = parse_override(item)
        overrides[key], sources[key] = value, f"--set {item}"
    return load_spec(spec_file, overrides, override_sources=sources)


@click.group(cls=SpecbuildGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="specbuild")
def main() -> None:
    """Compile a target/draft checkpoint pair into a Triton repository that serves speculative decoding."""


@main.command()
@click.argument("target", required=False, type=click.Path(file_okay=False))
@click.argument("draft", required=False, type=click.Path(file_okay=False))
@click.option("--out", "-o", "path", type=click.Path(dir_okay=False), default=DEFAULT_SPEC_FILE, show_default=True,
              help="the spec file to write")
@click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default="auto", show_default=True)
@click.option("--measure/--no-measure", default=True, show_default=True,
              help="time the pair in process (under a minute for the demo pair) to choose the starting K")
@click.option("--force", is_flag=True, help="overwrite an existing file")
@json_option
@reports_errors
def init(target: str | None, draft: str | None, path: str, runtime: str, measure: bool, force: bool,
         json_mode: bool) -> None:
    """Write a commented starter build spec for TARGET and DRAFT (without them: the demo pair's folders).

    With both checkpoints it measures the pair quickly in process and starts from the K predicted fastest,
    or from K=0 (the target alone) when the draft would slow it down; the spec's comment says which and why.
    """
    from specbuild.drafts.model_pairs import pair_dir, progress_display
    from specbuild.starter import make_starter, refuse_existing, write_starter

    refuse_existing(path, force)
    demo = pair_dir("demo")
    with progress_display(console) as progress:
        starter = make_starter(target, draft, path, placeholders=(str(demo / "target"), str(demo / "draft")),
                               runtime=runtime, measure=measure, progress=progress)  # type: ignore[arg-type]
    write_starter(path, starter, force=force)
    console.print(f"wrote {path}: {starter.note}", highlight=False)
    if json_mode:
        print_json({"path": path, "note": starter.note, "speculation": starter.speculation.model_dump(mode="json")})


@main.command()
@click.argument("directory", type=click.Path())
@json_option
@reports_errors
def verify(directory: str, json_mode: bool) -> None:
    """Re-hash a release against its manifest.json (DIR: the repository folder, or the folder above it).

    Exit 0: every file matches; 1: changed, missing or extra files (listed); 2: no manifest found.
    """
    from specbuild.errors import VerificationError
    from specbuild.package.manifest import report_table, verify as verify_release

    report = verify_release(directory)
    if not report.ok:
        if not json_mode:
            console.print(report_table(report))
        raise VerificationError(report.summary(), report.fix, details=report.to_json())
    if json_mode:
        print_json(report.to_json())
    else:
        console.print(f"[green]ok[/]: {report.checked} files match {report.manifest} (profile {report.profile_id})")


@main.command("check")
@click.argument("target")
@click.argument("draft")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None,
              help="build spec for dtypes, parallelism, limits and acceptance (default: built-in defaults)")
@json_option
@click.option("--allow-pickle", is_flag=True, help="read .bin/.pt pickle weights (only checkpoints you trust)")
@click.option("--trust-remote-code", is_flag=True, help="accept checkpoints whose config has an auto_map")
@click.option("--gpu-memory-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="check the memory plan against GPUs of this size")
@reports_errors
def check_command(target: str, draft: str, spec_file: str | None, json_mode: bool, allow_pickle: bool,
                  trust_remote_code: bool, gpu_memory_gib: float | None) -> None:
    """Check that DRAFT can speculate for TARGET: tokenizer, architectures, sizes, memory plan.

    Exit 0: compatible; 1: incompatible (each reason with its fix) or an unreadable checkpoint; 2: usage error.
    """
    from specbuild.check.report import check, render_check
    from specbuild.errors import IncompatibleError

    spec = load_spec(spec_file, {"target.checkpoint": target, "draft.checkpoint": draft},
                     override_sources={"target.checkpoint": f"TARGET {target}", "draft.checkpoint": f"DRAFT {draft}"})
    report = check(target, draft, spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                   gpu_memory_gib=gpu_memory_gib)
    if not json_mode:
        render_check(report, Console())
    if not report.compatible:
        raise IncompatibleError(f"the draft cannot speculate for the target: {', '.join(r.code for r in report.reasons)}",
                                "apply the fixes listed with each reason", details=report.to_dict())
    if json_mode:
        print_json(report.to_dict())


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("--host", default=None, help="bind address  [default: the release's triton.host, 127.0.0.1]")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None, help="[default: 8000; 0 = a free port]")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None, help="[default: 8001; 0 = a free port]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="[default: 8002; 0 = a free port]")
@click.option("--openai-port", type=click.IntRange(0, 65535), default=None,
              help="the OpenAI-compatible API  [default: the release's triton.openai_port, 9000; 0 = a free port]")
@click.option("--no-openai", is_flag=True, help="serve Triton only, without the OpenAI-compatible API")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="seconds to wait for the models to load (bundled server)")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="keep the server log here (bundled server)")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="launch settings of a GPU release (triton.image, ...); the rest is the release's")
@click.option("--dry-run", is_flag=True, help="print the commands instead of running them")
@click.option("--no-verify", is_flag=True, help="serve even if the release differs from its manifest.json")
@click.option("--rehearse", is_flag=True, help="a tensorrt-llm-llmapi release: serve it here on the bundled Triton, "
              "a CPU stand-in in place of TensorRT-LLM's LLM-API model")
@click.option("--json", "json_mode", is_flag=True, help="JSON Lines on stdout: one object when the server is ready "
              "(URLs, PIDs), one when it stops (or the error); with --dry-run, one document")
@reports_errors
def serve(repository: str, host: str | None, http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, openai_port: int | None, no_openai: bool, timeout: float, log_file: str | None,
          assignments: tuple[str, ...], dry_run: bool, no_verify: bool, rehearse: bool, json_mode: bool) -> None:
    """Serve the release in REPOSITORY (default: triton_repo) with Triton, and specbuild's OpenAI-compatible API
    next to it, until Ctrl-C or SIGTERM.

    A torch release runs on the Triton server bundled with specbuild (loopback by default); a tensorrt-llm or
    tensorrt-llm-llmapi release in its NGC container, laid out as it was compiled (`--dry-run` prints the
    docker/mpirun commands), or, rehearsed, a tensorrt-llm-llmapi release on the bundled server. The API runs
    for releases with specbuild's orchestrator (torch, tensorrt-llm), on this host beside a container; a
    repository without a release manifest gets Triton only.
    """
    import atexit
    import shutil
    import tempfile

    from specbuild.build.runtimes import runtime_for
    from specbuild.serve.frontend import OpenAIFrontend, serves_openai

    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port, "openai_port": openai_port}
    release, model = _release_and_name(repository)
    with_openai = not no_openai and not rehearse and release is not None and serves_openai(release.repository)
    if rehearse:
        from specbuild.serve.rehearsal import rehearsal_repository

        workdir = tempfile.mkdtemp(prefix="specbuild-rehearsal-")
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
        repository = str(rehearsal_repository(repository, workdir))
    elif release is not None and runtime_for(release.spec.runtime).container_launch:
        from specbuild.serve.release_launch import release_launch_plan
        from specbuild.serve.processes import reachable_host, run_foreground

        plan = release_launch_plan(repository, launch_overrides(assignments, host=host, **ports),
                                   verify_files=not no_verify)
        if dry_run:
            if json_mode:
                print_json(plan.to_dict())
            else:
                click.echo(plan.render())
            return
        if json_mode:
            print_json({"event": "starting", "command": list(plan.docker_argv)}, line=True)
        with contextlib.ExitStack() as beside:
            if with_openai and plan.openai_port is not None:
                frontend = beside.enter_context(OpenAIFrontend(
                    release.repository, f"{reachable_host(plan.host)}:{plan.ports['grpc']}", model, host=plan.host,
                    port=plan.openai_port))
                console.print(f"OpenAI-compatible API at {frontend.url} (ready once Triton is)", highlight=False)
            code = run_foreground(plan.docker_argv)
        if json_mode:
            print_json({"event": "stopped", "exit_code": code}, line=True)
        sys.exit(code)

    from specbuild.serve.server import TritonServer

    defaults = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}
    spec_openai_port = release.spec.triton.openai_port if release is not None else 9000
    host = host or (release.spec.triton.host if release is not None else "127.0.0.1")
    server = TritonServer(repository, host=host, startup_timeout=timeout, log_file=log_file,
                          verify=not no_verify,
                          **{key: defaults[key] if ports[key] is None else ports[key] for key in defaults})
    if dry_run:
        if json_mode:
            print_json({"script": server.describe()})
        else:
            click.echo(server.describe())
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
            frontend = beside.enter_context(OpenAIFrontend(
                repository, server.grpc_url, model, host=host,
                port=spec_openai_port if openai_port is None else openai_port))
            endpoints["OpenAI"] = frontend.url
        server.serve_forever(announce=lambda line: console.print(line, highlight=False, soft_wrap=True),
                             on_ready=ready, endpoints=endpoints)
    if json_mode:
        print_json({"event": "stopped", "exit_code": 0}, line=True)


@main.command("openai")
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("--triton", "triton_url", default="127.0.0.1:8001", show_default=True,
              help="gRPC address of the Triton server that serves the release")
@click.option("--host", default="127.0.0.1", show_default=True, help="bind address")
@click.option("--port", type=click.IntRange(0, 65535), default=9000, show_default=True, help="0 = a free port")
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


@main.command()
@click.argument("prompt")
@click.option("--url", default="127.0.0.1:8001", show_default=True, help="Triton gRPC address")
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
@click.option("--num-draft-tokens", type=int, default=None, help="K for this request; 0 = target alone")
@click.option("--prompt-lookup/--no-prompt-lookup", default=None,
              help="draft from the request's own tokens first  [default: the server's]")
@click.option("--stop", "stop_words", multiple=True, help="stop after this text (repeatable)")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True)
@click.option("--json", "json_mode", is_flag=True, help="one JSON document with the text and figures; with --stream, "
              "JSON Lines: one object per chunk, then the summary")
@reports_errors
def generate(prompt: str, url: str, model: str, max_tokens: int, stream: bool, raw: bool, temperature: float | None,
             top_k: int | None, top_p: float | None, seed: int | None, num_draft_tokens: int | None,
             prompt_lookup: bool | None, stop_words: tuple[str, ...], timeout: float, json_mode: bool) -> None:
    """Send PROMPT (or - for stdin, kept exactly as read) to a served ensemble; text on stdout, figures on
    stderr."""
    from specbuild.errors import UsageError
    from specbuild.serve.client import GenerationRequest, SpecbuildClient
    from specbuild.speculation.rules import explicit_sampling

    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        raise UsageError("the prompt is empty", "pass the prompt as an argument, or pipe it in with -")
    request = GenerationRequest(text, max_tokens, stream=stream, chat=None if raw else True, seed=seed,
                                num_draft_tokens=num_draft_tokens, prompt_lookup=prompt_lookup,
                                stop_words=list(stop_words) or None, **explicit_sampling(temperature, top_k, top_p))
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


def generation_json(generation: Any) -> dict[str, Any]:
    """A finished generation's text and figures, its chunks left out."""
    fields = {name: value for name, value in dataclasses.asdict(generation).items() if name != "chunks"}
    return {**fields, "chunks": len(generation.chunks), "tokens_per_second": generation.tokens_per_second}


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


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("-o", "--out", "--k8s", "out_dir", required=True, metavar="DIR|-",
              help="folder to write the manifests into (one <kind>.yaml per object, and the prometheus-adapter "
                   "rule), or - for a YAML stream on stdout (kubectl apply -f -)")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=None, help="HPA ceiling (default: 4 x replicas)")
@click.option("--namespace", default="default", show_default=True)
@click.option("--pvc", default=None, help="PersistentVolumeClaim holding the release's engines and repository folders")
@click.option("--release-image", default=None, help="image with /release/<engines> and /release/<repository> "
              "(docker/Dockerfile.release), copied by an init container")
@click.option("--image", default=None, help="the serving image  [default: the release's triton.image; for a torch "
              "release specbuild:cpu, built from docker/Dockerfile.cpu]")
@click.option("--cpu", type=click.FloatRange(min=0, min_open=True), default=None,
              help="CPU cores per replica  [default: from the release]")
@click.option("--memory-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="host memory per replica  [default: /dev/shm + engines + server, from the release]")
@click.option("--monitor-label", "monitor_labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="label of the PodMonitor, for your Prometheus's podMonitorSelector (repeatable)")
@click.option("--openai-image", default="specbuild:cpu", show_default=True,
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
           monitor_labels: dict[str, str], openai_image: str, kserve: bool, assignments: tuple[str, ...],
           json_mode: bool) -> None:
    """Write Kubernetes manifests serving the compiled release in REPOSITORY (default: triton_repo): a GPU release
    as compiled (its launch layout, on the GPU its engines were built on), a torch release on CPUs.

    Each replica gets CPU and memory requests and limits, a PodDisruptionBudget, a Prometheus Operator PodMonitor
    and a HorizontalPodAutoscaler on the requests in flight (prometheus-adapter rule written beside them).
    """
    from specbuild.package.manifest import read_release
    from specbuild.serve.k8s import release_manifests, to_yaml, write_manifests
    from specbuild.serve.k8s_pods import DeployOptions

    options = DeployOptions(namespace=namespace, replicas=replicas, max_replicas=max_replicas, pvc=pvc,
                            release_image=release_image, image=image, cpu=cpu, memory_gib=memory_gib,
                            monitor_labels=monitor_labels, openai_image=openai_image)
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


def _run_pipeline(upto: str, options: dict[str, Any], force: bool, dry_run: bool, json_mode: bool) -> None:
    """Shared body of compile/convert/build/package: the spec from file + flags, then the pipeline."""
    from specbuild import compiler
    from specbuild.build.runtimes import runtime_for

    spec = spec_from_options(**options)
    if dry_run:
        described = compiler.plan(spec)
        if json_mode:
            print_json({key: value for key, value in described.items() if key != "text"})
        else:
            click.echo(described["text"])
        return
    result = compiler.run(spec, "package" if upto == "package-only" else upto, force=force, json_mode=json_mode,
                          console=console, package_only=upto == "package-only")
    if json_mode:
        print_json(result.to_dict())
    elif result.manifest:
        served = (f"engines {result.engines}" if runtime_for(result.spec.runtime).builds_engines else
                  f"checkpoints {result.spec.target.checkpoint} and {result.spec.draft.checkpoint}")
        console.print(f"[green]release ready:[/] repository {result.repository}, {served}, manifest {result.manifest}")


def pipeline_command(upto: str, summary: str) -> Callable[..., Any]:
    @click.option("--force", is_flag=True, help="re-run every step even if its inputs are unchanged")
    @click.option("--dry-run", is_flag=True, help="print what would run (commands, build configs per rank)")
    @json_option
    @spec_options
    @reports_errors
    def command(force: bool, dry_run: bool, json_mode: bool, **options: Any) -> None:
        _run_pipeline(upto, options, force, dry_run, json_mode)

    command.__doc__ = summary
    return command


main.command("compile")(pipeline_command(
    "package", "Check, convert, build and package TARGET+DRAFT into a verified Triton repository."))
main.command("convert")(pipeline_command("convert", "Check, then convert both HF checkpoints (into build/)."))
main.command("build")(pipeline_command("build", "Check, convert, then build both engines (into engines/)."))
main.command("package")(pipeline_command(
    "package-only", "Check and package the Triton repository without building: for the engines in "
    "outputs.engines_dir, or, where none are built (e.g. tensorrt-llm without a GPU), for the engines the runtime "
    "would build, marked as having none (for inspection; verify, serve and deploy refuse it)."))


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="where models/, build/, engines/ and triton_repo/ go")
@click.option("--question", default=None, help="what to ask the demo model")
@click.option("--max-tokens", type=click.IntRange(1, 1024), default=64, show_default=True)
@click.option("--num-draft-tokens", type=click.IntRange(0, 64), default=None, help="K (default: the spec's)")
@click.option("--tiny", is_flag=True, help="use the tiny pair made from nothing (seconds, meaningless text)")
@json_option
@reports_errors
def demo(workdir: str, question: str | None, max_tokens: int, num_draft_tokens: int | None, tiny: bool,
         json_mode: bool) -> None:
    """Make the demo pair, compile it (torch runtime), serve it on Triton and stream one answer."""
    from specbuild.demo import DEFAULT_PROMPT, run_demo

    result = run_demo(workdir, question=question or DEFAULT_PROMPT, max_tokens=max_tokens,
                      num_draft_tokens=num_draft_tokens, tiny=tiny, console=console)
    data = {"repository": str(result.repository), "identical": result.identical,
            "speculative": generation_json(result.speculative), "baseline": generation_json(result.baseline)}
    if not result.identical:
        raise SpecbuildError("greedy output with speculation differed from the target alone",
                             "please report this with the JSON output (--json)", details=data)
    if json_mode:
        print_json(data)


def _int_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """``"0,2,4"`` -> ``(0, 2, 4)``."""
    if value is None:
        return None
    try:
        return tuple(int(item) for item in value.split(",") if item.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 0,2,4") from None


ADAPTIVE_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}
LOOKUP_CHOICES = {"off": (False,), "on": (True,), "off,on": (False, True)}


def workload_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The prompts and bounds shared by ``bench`` and ``tune``."""
    options = [
        click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
                     help="JSONL file of {category, prompt} lines  [default: the bundled set]"),
        click.option("--category", "categories", multiple=True, help="only prompts of this category (repeatable)"),
        click.option("--num-prompts", type=click.IntRange(min=1), default=None, help="use the first N prompts "
                     "(taken round-robin across categories)"),
        click.option("--max-tokens", type=click.IntRange(1, 4096), default=64, show_default=True),
        click.option("--requests", type=click.IntRange(min=1), default=16, show_default=True,
                     help="requests per (K, concurrency) cell"),
        click.option("--max-seconds", type=click.FloatRange(min=1), default=300.0, show_default=True,
                     help="per cell: no further round of blocks starts once a cell has run this long"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _show_bench(report: Any, out_dir: str | None, plots: bool, json_mode: bool) -> None:
    """The report's tables on the terminal (not under ``--json``: the caller prints the document), its files in
    ``out_dir``."""
    from specbuild.bench.report import tables, write_outputs

    if not json_mode:
        for table in tables(report.cells):
            console.print(table)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if out_dir:
        for path in write_outputs(report, out_dir, with_plots=plots):
            console.print(f"wrote {path}", highlight=False)


@main.command()
@click.option("--url", default=None, help="gRPC address of a running server, e.g. 127.0.0.1:8001 (another machine "
              "only when named here)")
@click.option("--metrics-url", default=None, help="its metrics endpoint  [default: http://<host>:8002/metrics]")
@click.option("--repository", type=click.Path(file_okay=False), default=None,
              help="start a server on this repository for the run (loopback, free ports)")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="wrap prompts in this tokenizer's chat template  [default: the repository's, if given]")
@click.option("--k", "ks", default="0,1,2,4", show_default=True, callback=_int_list,
              help="K values, comma-separated (0 is always included)")
@click.option("--concurrency", "concurrencies", default="1", show_default=True, callback=_int_list,
              help="concurrency levels, comma-separated")
@click.option("--adaptive", type=click.Choice(list(ADAPTIVE_CHOICES)), default="off", show_default=True,
              help="adaptive K per request")
@click.option("--lookup", type=click.Choice(list(LOOKUP_CHOICES)), default="off", show_default=True,
              help="prompt lookup drafting (the draft model when lookup finds nothing); not at K=0")
@click.option("--temperature", type=click.FloatRange(min=0), default=None, help="default: greedy")
@workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench_results", show_default=True,
              help="folder for bench.json, bench.md and the plots")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("--gate", "gate", multiple=True, metavar="NAME=VALUE",
              help="a release gate threshold (repeatable): min_speedup=X, min_acceptance=X, greedy_identical, "
                   "max_p95_ms=X, max_error_rate=X; exit 3 when one fails. Without max_error_rate, any failed "
                   "request fails the run")
@json_option
@reports_errors
def bench(url: str | None, metrics_url: str | None, repository: str | None, tokenizer: str | None,
          ks: tuple[int, ...], concurrencies: tuple[int, ...], adaptive: str, lookup: str, temperature: float | None,
          prompts_file: str | None, categories: tuple[str, ...], num_prompts: int | None, max_tokens: int,
          requests: int, max_seconds: float, out_dir: str, plots: bool, gate: tuple[str, ...],
          json_mode: bool) -> None:
    """Measure speculative speedup per K and concurrency (streaming): latency percentiles, tokens/s,
    acceptance, and the speedup the analytic model expects from the measured acceptance and step costs.
    The cells of each concurrency level run interleaved, prompt block by prompt block, in rotating order.

    With --gate, a release gate: every speculative cell must meet each threshold (exit 3 otherwise, the failing
    figures in the JSON and in gate.json)."""
    from pydantic import ValidationError

    from specbuild.bench.gate import evaluate, parse_thresholds
    from specbuild.bench.runner import BenchPlan, bench_server, repository_tokenizer, run_bench
    from specbuild.errors import UsageError
    from specbuild.bench.prompts import load_prompts

    thresholds = parse_thresholds(gate)
    if thresholds.greedy_identical and temperature:
        raise UsageError("--gate greedy_identical compares greedy answers, but --temperature samples",
                         "drop --temperature (greedy), or the greedy_identical threshold")

    try:
        plan = BenchPlan(ks=ks, concurrencies=concurrencies, adaptive=ADAPTIVE_CHOICES[adaptive],
                         lookup=LOOKUP_CHOICES[lookup],
                         max_tokens=max_tokens, requests=requests, max_seconds=max_seconds, temperature=temperature)
    except ValidationError as exc:
        raise UsageError(f"invalid bench options: {exc.errors()[0]['msg']}", "see specbuild bench --help") from None
    prompts = load_prompts(prompts_file, categories=categories or None, limit=num_prompts)
    tokenizer = tokenizer or (repository_tokenizer(repository) if repository else None)
    with bench_server(url, repository) as (grpc_url, server_metrics_url):
        report = run_bench(grpc_url, prompts, plan, metrics_url=metrics_url or server_metrics_url,
                           tokenizer_dir=tokenizer, console=console)
    _show_bench(report, out_dir, plots, json_mode)
    verdict = evaluate(report.to_dict(), thresholds)
    _gate_outcome(verdict, {**report.to_dict(), "gate": verdict.to_dict()}, out_dir, json_mode)


def _gate_outcome(verdict: Any, document: dict[str, Any], out_dir: str | None, json_mode: bool) -> None:
    """Show the gate's checks and keep them in ``gate.json``; refuse the release (exit 3) when one failed."""
    from specbuild.bench.report import gate_table
    from specbuild.build.atomic import atomic_write_text
    from specbuild.errors import GateError

    if out_dir:
        path = atomic_write_text(Path(out_dir) / "gate.json", json.dumps(document["gate"], indent=2) + "\n")
        console.print(f"wrote {path}", highlight=False)
    if not json_mode:
        console.print(gate_table(verdict))
    if not verdict.passed:
        raise GateError(verdict.summary(), "the release missed the thresholds above: improve the draft (specbuild "
                        "draft) or K (specbuild tune), or read the server log for failed requests",
                        details=document)
    if json_mode:
        print_json(document)
    else:
        console.print(f"[green]{verdict.summary()}[/]", highlight=False)


@main.command()
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=DEFAULT_SPEC_FILE, show_default=True,
              help="the release's build spec: its repository is benchmarked, and the choice written into it")
@click.option("--goal", type=click.Choice(["latency", "throughput"]), default="latency", show_default=True,
              help="latency: lowest median end-to-end latency at concurrency 1; throughput: most output tokens/s")
@click.option("--k", "ks", default=None, callback=_int_list,
              help="K values to try, comma-separated  [default: 0,1,2,3,4,6,8 up to max_draft_len]")
@click.option("--adaptive", type=click.Choice(list(ADAPTIVE_CHOICES)), default="both", show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="[default: 1 for latency, min(4, max_batch_size) for throughput]")
@click.option("--url", default=None, help="benchmark this running server instead of starting one")
@workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="also write the bench report")
@click.option("--dry-run", is_flag=True, help="measure and show the choice; change nothing")
@json_option
@reports_errors
def tune(spec_file: str, goal: str, ks: tuple[int, ...] | None, adaptive: str, concurrency: int | None,
         url: str | None, prompts_file: str | None, categories: tuple[str, ...], num_prompts: int | None,
         max_tokens: int, requests: int, max_seconds: float, out_dir: str | None, dry_run: bool,
         json_mode: bool) -> None:
    """Sweep K and adaptive K, pick the best for a goal, and make it the spec's and repository's default."""
    from specbuild.bench.prompts import load_prompts
    from specbuild.bench.tune import tune as run_tune

    prompts = load_prompts(prompts_file, categories=categories or None, limit=num_prompts)
    result = run_tune(spec_file, goal, prompts, ks=ks, adaptive=ADAPTIVE_CHOICES[adaptive],  # type: ignore[arg-type]
                      concurrency=concurrency, max_tokens=max_tokens, requests=requests, max_seconds=max_seconds,
                      url=url, write=not dry_run, console=console)
    _show_bench(result.report, out_dir, True, json_mode)
    choice = result.choice
    if json_mode:
        print_json({**result.report.to_dict(), "goal": goal, "choice": choice.to_dict(), "spec": spec_file,
                    "repository": str(result.compiled.repository) if result.compiled is not None else None})
    console.print(f"best for {goal}: [bold]{choice.label}[/] ({choice.tokens_per_second:.1f} tokens/s, "
                  f"speedup {choice.speedup or 1.0:.2f}x at concurrency {choice.concurrency})", highlight=False)
    if result.compiled is not None:
        console.print(f"wrote speculation.num_draft_tokens={choice.k}, adaptive={str(choice.adaptive).lower()} "
                      f"into {spec_file}; re-packaged {result.compiled.repository} (restart its server to use it)",
                      highlight=False)


@main.command("demo-models")
@click.argument("out", type=click.Path(file_okay=False), required=False)
@click.option("--tiny", is_flag=True, help="the tiny pair made from nothing (for tests) instead of SmolLM2")
@json_option
@reports_errors
def demo_models(out: str | None, tiny: bool, json_mode: bool) -> None:
    """Make the demo target/draft pair in OUT, offline (nothing downloaded; reused when already built).

    OUT defaults to the cache the demo and the tests share: .cache/demo-pair (or tiny-pair), or under
    $SPECBUILD_CACHE when set.
    """
    from specbuild.drafts.model_pairs import pair_dir, progress_display

    out = out or str(pair_dir("tiny" if tiny else "demo"))
    if tiny:
        from specbuild.drafts.tiny_models import build_tiny_pair as build
    else:
        from specbuild.drafts.demo_models import build_demo_pair as build
    with progress_display(console) as progress:
        pair = build(out, progress=progress)
    if json_mode:
        print_json(pair.info)
    console.print(f"target: {pair.target_dir}\ndraft:  {pair.draft_dir}", highlight=False)


@main.command("draft")
@click.argument("target", type=click.Path(file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True, help="decoder layers of the draft")
@click.option("--hidden", type=click.IntRange(min=1), default=None,
              help="hidden size (default: the target's, copying its embeddings, head and spread layers)")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="hard wall-clock budget of this run (data, training and the summary)")
@click.option("--steps", type=click.IntRange(min=1), default=1500, show_default=True,
              help="training steps of the schedule (the budget may stop it earlier)")
@click.option("--prompts", type=click.IntRange(min=2), default=1200, show_default=True,
              help="distillation prompts the target answers (within 40% of the budget)")
@click.option("--held-out", type=click.IntRange(min=1), default=48, show_default=True,
              help="of those, kept out of training to measure acceptance")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=96, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--precision", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="answers, labels and training matmuls; auto: bfloat16 on CPUs with bfloat16 matrix units and "
                   "on GPUs that support it")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="where the target answers and the draft trains; auto: a CUDA GPU when there is one")
@click.option("--generate-batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="prompts the target answers at once (a GPU takes hundreds)")
@click.option("--batch-tokens", type=click.IntRange(min=64), default=2048, show_default=True,
              help="padded tokens per training step")
@click.option("--answers", type=click.Choice(["greedy", "greedy+sampled"]), default="greedy", show_default=True,
              help="greedy+sampled: the target also answers every training prompt by sampling (temperature 0.7)")
@click.option("--teacher", type=click.Choice(["labels", "joint"]), default="labels", show_default=True,
              help="labels: the target's top-k stored once; joint: the target runs in every training step and the "
                   "loss is the KL divergence from its full-vocabulary distribution")
@click.option("--resume", is_flag=True, help="continue from OUT.state (data and the last checkpoint)")
@json_option
@reports_errors
def draft_command(target: str, out: str, layers: int, hidden: int | None, minutes: float, steps: int, prompts: int,
                  held_out: int, max_new_tokens: int, seed: int, precision: str, device: str, generate_batch: int,
                  batch_tokens: int, answers: str, teacher: str, resume: bool, json_mode: bool) -> None:
    """Distil a small draft for TARGET into OUT (same tokenizer; checkpoints and data in OUT.state)."""
    from specbuild.drafts.distill import DraftOptions, make_draft
    from specbuild.drafts.model_pairs import progress_display

    options = DraftOptions(layers=layers, hidden=hidden, minutes=minutes, steps=steps, prompts=prompts,
                           held_out=held_out, max_new_tokens=max_new_tokens, seed=seed, precision=precision,
                           device=device, generate_batch=generate_batch, batch_tokens=batch_tokens, answers=answers,
                           teacher=teacher)
    with progress_display(console) as progress:
        summary = make_draft(target, out, options, resume=resume, progress=progress)
    if json_mode:
        print_json(summary)
    acceptance = " ".join(f"K={k}: {rate:.2f}" for k, rate in summary["held_out_acceptance"].items())
    console.print(f"draft: {out} ({summary['parameters'] / 1e6:.1f}M parameters, {summary['steps_done']} steps)\n"
                  f"held-out acceptance {acceptance}\n"
                  f"draft step {summary['draft_step_ms']} ms, target step {summary['target_step_ms']} ms; "
                  f"expected speedup {summary['expected_speedup'][str(summary['best_k'])]:.2f}x at K={summary['best_k']}",
                  highlight=False)


if __name__ == "__main__":  # pragma: no cover
    main()
