"""What every command shares: the main group, ``--json`` output, error reporting and the spec options."""


from __future__ import annotations

import dataclasses
import functools
import json
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.markup import escape

from specbuild.errors import SpecbuildError, Terminated
from specbuild.spec import DEFAULT_SPEC_FILE, RUNTIME_CHOICES, load_spec
from specbuild.spec_sources import parse_override
from specbuild.terminal import make_console

console = make_console()
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
    """Turn a :class:`SpecbuildError` (or an interrupt) into a readable message and its exit code.

    A stop signal wins over whatever followed it: its handler stops the servers and raises
    :class:`Terminated`, but a signal landing in a finalizer has that exception swallowed, and the command then
    fails on the stopped server (or even returns). Either way it reports the interrupt and exits 128 + signal."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_mode = bool(kwargs.get("json_mode"))
        Terminated.received = None  # per invocation: tests run many commands in one process
        try:
            result = command(*args, **kwargs)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGINT while servers run (errors.Terminated)
            _exit_interrupted(getattr(exc, "signum", signal.SIGINT), isinstance(exc, Terminated), json_mode)
        except (Exception, SystemExit) as exc:
            if Terminated.received is not None:
                _exit_interrupted(Terminated.received, True, json_mode)
            if not isinstance(exc, SpecbuildError):
                raise
            exit_with(exc.to_json(), json_mode)
        if Terminated.received is not None:
            _exit_interrupted(Terminated.received, True, json_mode)
        return result

    return wrapper


def _exit_interrupted(signum: int, servers_stopped: bool, json_mode: bool) -> None:
    stopped = "; the servers it started were stopped first" if servers_stopped else ""
    exit_with({"error": f"interrupted by {signal.Signals(signum).name}{stopped}", "fix": None,
               "exit_code": 128 + signum}, json_mode)


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
    given = {key: (flag, value) for key, (flag, value) in flags.items() if value is not None}
    overrides: dict[str, Any] = {key: value for key, (_, value) in given.items()}
    sources = {key: f"{flag} {value}" for key, (flag, value) in given.items()}
    for item in assignments:
        key, value = parse_override(item)
        overrides[key], sources[key] = value, f"--set {item}"
    return load_spec(spec_file, overrides, override_sources=sources)


@click.group(cls=SpecbuildGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="specbuild")
def main() -> None:
    """Compile a target/draft checkpoint pair into a Triton repository that serves speculative decoding."""


def generation_json(generation: Any) -> dict[str, Any]:
    """A finished generation's text and figures, its chunks left out."""
    fields = {name: value for name, value in dataclasses.asdict(generation).items() if name != "chunks"}
    return {**fields, "chunks": len(generation.chunks), "tokens_per_second": generation.tokens_per_second}

