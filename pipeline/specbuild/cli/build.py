"""``specbuild init``, ``check`` and the pipeline commands (``compile``, ``convert``, ``build``, ``package``)."""

from __future__ import annotations

from typing import Any, Callable

import click

from specbuild.cli.common import console, json_option, main, print_json, reports_errors, spec_from_options, spec_options
from specbuild.spec import DEFAULT_SPEC_FILE, RUNTIME_CHOICES, load_spec
from specbuild.terminal import make_console, progress_display


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
    from specbuild.drafts.model_pairs import pair_dir
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
    from specbuild.check.compatibility import BreakEven
    from specbuild.check.pair_report import check, render_check
    from specbuild.errors import IncompatibleError

    spec = load_spec(spec_file, {"target.checkpoint": target, "draft.checkpoint": draft},
                     override_sources={"target.checkpoint": f"TARGET {target}", "draft.checkpoint": f"DRAFT {draft}"})
    report = check(target, draft, spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                   gpu_memory_gib=gpu_memory_gib)
    break_even = BreakEven.of(report.compatibility.cost_ratio, spec.speculation)
    if not json_mode:
        render_check(report, make_console(stderr=False), break_even)
    data = {**report.to_dict(), "break_even": break_even.to_dict()}
    if not report.compatible:
        raise IncompatibleError(f"the draft cannot speculate for the target: {', '.join(r.code for r in report.reasons)}",
                                "apply the fixes listed with each reason", details=data)
    if json_mode:
        print_json(data)


def _run_pipeline(upto: str, options: dict[str, Any], force: bool, dry_run: bool, json_mode: bool) -> None:
    """Shared body of compile/convert/build/package: the spec from file + flags, then the pipeline."""
    from specbuild import compiler

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
        served = (f"checkpoints {' and '.join(result.checkpoints.values())}" if result.checkpoints
                  else f"engines {result.engines}")
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
