"""``specbuild bench``, ``tune``, ``demo``, ``demo-models`` and ``draft``: measuring a release, and making pairs and drafts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click
from click.core import ParameterSource

from specbuild.cli.common import console, json_option, main, print_json, reports_errors
from specbuild.drafts.distill_options import (ANSWERS, CONTINUE_LEARNING_RATE, DEVICES, PRECISIONS, TEACHERS,
                                              CaptureOptions, DraftOptions)
from specbuild.errors import SpecbuildError, UsageError
from specbuild.spec import DEFAULT_SPEC_FILE, LOCAL_GRPC_URL, TRITON_DEFAULTS
from specbuild.speculation.schedule import TUNED_LOADS
from specbuild.speculation.traffic import GREEDY, PROFILE_NAMES, describe_profiles, parse_mix
from specbuild.terminal import progress_display

DRAFT = DraftOptions()  # `specbuild draft`'s defaults


# Another seed trains another tiny model (as another CPU's kernels do): the tests run against several
# (docs/architecture.md, "Tests that depend on a trained model").
tiny_seed_option = click.option("--tiny-seed", type=click.IntRange(min=0), default=0, show_default=True,
                                help="with --tiny: the seed its models train from")


def _check_tiny_seed(tiny: bool, tiny_seed: int) -> None:
    if tiny_seed and not tiny:
        raise UsageError("--tiny-seed sets the tiny pair's seed, and this run uses the demo pair",
                         "add --tiny, or leave --tiny-seed out")


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="where models/, build/, engines/ and triton_repo/ go")
@click.option("--max-tokens", type=click.IntRange(1, 1024), default=48, show_default=True,
              help="tokens per answer")
@click.option("--num-draft-tokens", type=click.IntRange(1, 64), default=None,
              help="K compared with K=0 (default: the release's)")
@click.option("--tiny", is_flag=True, help="use the tiny pair made from nothing (seconds, meaningless text)")
@tiny_seed_option
@json_option
@reports_errors
def demo(workdir: str, max_tokens: int, num_draft_tokens: int | None, tiny: bool, tiny_seed: int,
         json_mode: bool) -> None:
    """Make the demo pair, measure its cost model, compile it (torch runtime), serve it on Triton and compare
    its speculation with the target alone, interleaved, on a few prompts of each kind."""
    from specbuild.demo import run_demo

    _check_tiny_seed(tiny, tiny_seed)
    result = run_demo(workdir, max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, tiny=tiny,
                      tiny_seed=tiny_seed, console=console)
    data = result.to_dict()
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


def _sampling_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """``"greedy,t0.7"`` -> ``("greedy", "t0.7")``; BenchPlan checks each is a profile of
    :mod:`specbuild.speculation.traffic`."""
    return None if value is None else tuple(item.strip() for item in value.split(",") if item.strip())


SAMPLING_HELP = "sampling profiles, comma-separated, each measured against K=0 of its own: " + describe_profiles()
ADAPTIVE_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}
LOOKUP_CHOICES = {"off": (False,), "on": (True,), "off,on": (False, True)}


def workload_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The prompts and bounds shared by ``bench`` and ``tune``."""
    options = [
        click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
                     help="JSONL file of {category, prompt} lines, each optionally with a json_schema  [default: the "
                     "bundled workload]"),
        click.option("--workload", type=click.Choice(["general", "structured", "long"]), default="general",
                     show_default=True,
                     help="the bundled prompts: general, structured (answers in JSON, each prompt sent with its "
                     "schema and without, interleaved), or long (1k-2k tokens: grounded QA over passages, long chats, "
                     "whole-file code edits; the release's max_input_len must hold them)"),
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
    from specbuild.bench.report import incumbent_table, served_path_table, tables, write_outputs

    if not json_mode:
        for table in tables(report.cells) + served_path_table(report) + incumbent_table(report):
            console.print(table)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if out_dir:
        for path in write_outputs(report, out_dir, with_plots=plots):
            console.print(f"wrote {path}", highlight=False)


@main.command()
@click.option("--url", default=None, help=f"gRPC address of a running server, e.g. {LOCAL_GRPC_URL} (another machine "
              "only when named here)")
@click.option("--metrics-url", default=None, help=f"its metrics endpoint  [default: http://<host>:{TRITON_DEFAULTS.metrics_port}/metrics]")
@click.option("--repository", type=click.Path(file_okay=False), default=None,
              help="start a server on this repository for the run (loopback, free ports)")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="wrap prompts in this tokenizer's chat template  [default: the repository's, if given]")
@click.option("--incumbent", type=click.Path(file_okay=False, exists=True), default=None,
              help="with --repository: the release in service, started too (loopback, free ports); every cell runs "
                   "on both, interleaved, for the ratio of their speeds and their texts (--gate "
                   "faster_than_incumbent=X)")
@click.option("--captured", "captured", multiple=True, type=click.Path(exists=True),
              help="with --repository: replay the prompts of this capture file or store (repeatable) by their token "
                   "ids, each asking for its captured answer's length (--max-tokens when given); one kind, "
                   "captured")
@click.option("--in-process", "in_process", is_flag=True,
              help="with --repository (torch runtime): the concurrency-1 cells run again with the release's own "
                   "engines and orchestrator code in this process, interleaved: what serving keeps of their speed")
@click.option("--k", "ks", default="0,1,2,4", show_default=True, callback=_int_list,
              help="K values, comma-separated (0 is always included)")
@click.option("--concurrency", "concurrencies", default="1", show_default=True, callback=_int_list,
              help="concurrency levels, comma-separated")
@click.option("--adaptive", type=click.Choice(list(ADAPTIVE_CHOICES)), default="off", show_default=True,
              help="adaptive K per request")
@click.option("--lookup", type=click.Choice(list(LOOKUP_CHOICES)), default="off", show_default=True,
              help="prompt lookup drafting (the draft model when lookup finds nothing); not at K=0")
@click.option("--sampling", "samplings", default=GREEDY, show_default=True, callback=_sampling_list,
              help=SAMPLING_HELP)
@workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench_results", show_default=True,
              help="folder for bench.json, bench.md and the plots")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("--gate", "gate", multiple=True, metavar="NAME=VALUE",
              help="a release gate threshold (repeatable): min_speedup=X, min_acceptance=X, greedy_identical, "
                   "max_p95_ms=X, max_error_rate=X, faster_than_incumbent=X (with --incumbent: X times its tokens/s, "
                   "K=0 within X of its, and its greedy text); exit 3 when one fails. Without max_error_rate, any failed request fails "
                   "the run")
@json_option
@reports_errors
def bench(url: str | None, metrics_url: str | None, repository: str | None, tokenizer: str | None,
          incumbent: str | None, captured: tuple[str, ...], in_process: bool,
          ks: tuple[int, ...], concurrencies: tuple[int, ...], adaptive: str, lookup: str, samplings: tuple[str, ...],
          prompts_file: str | None, workload: str, categories: tuple[str, ...], num_prompts: int | None,
          max_tokens: int, requests: int, max_seconds: float, out_dir: str, plots: bool, gate: tuple[str, ...],
          json_mode: bool) -> None:
    """Measure speculative speedup per K and concurrency (streaming): latency percentiles, tokens/s,
    acceptance, and the speedup the analytic model expects from the measured acceptance and step costs.
    The cells of each concurrency level run interleaved, prompt block by prompt block, in rotating order.

    With --gate, a release gate: every speculative cell must meet each threshold (exit 3 otherwise, the failing
    figures in the JSON and in gate.json).

    With --incumbent, a new release against the one in service, both served here and measured in one interleaved
    sweep; with --captured, on the traffic they serve, replayed by token ids."""
    import contextlib

    from pydantic import ValidationError

    from specbuild.bench.gate import evaluate, parse_thresholds
    from specbuild.bench.prompts import load_prompts
    from specbuild.bench.sweep import BenchPlan, Served, bench_server, repository_tokenizer, run_bench
    from specbuild.serve.client import SpecbuildClient
    from specbuild.serve.orchestrator_client import IdsClient

    thresholds = parse_thresholds(gate)
    if thresholds.greedy_identical and GREEDY not in samplings:
        raise UsageError("--gate greedy_identical compares greedy answers, but --sampling has no greedy cells",
                         f"add greedy to --sampling (e.g. --sampling greedy,{samplings[0]}), or drop the threshold")

    try:
        plan = BenchPlan(ks=ks, concurrencies=concurrencies, adaptive=ADAPTIVE_CHOICES[adaptive],
                         lookup=LOOKUP_CHOICES[lookup],
                         max_tokens=max_tokens, requests=requests, max_seconds=max_seconds, samplings=samplings)
    except ValidationError as exc:
        raise UsageError(f"invalid bench options: {exc.errors()[0]['msg']}", "see specbuild bench --help") from None
    _check_release_options(repository, incumbent, captured, in_process, prompts_file, categories, thresholds)
    if captured:
        from specbuild.bench.captured import captured_prompts, release_tokenizer_hash

        hashes = {release_tokenizer_hash(folder) for folder in (repository, incumbent) if folder}
        if len(hashes) > 1:
            raise UsageError("--incumbent has another tokenizer than --repository: captured ids read as other text",
                             "compare releases of one tokenizer (the same target)")
        explicit = click.get_current_context().get_parameter_source("max_tokens") != click.core.ParameterSource.DEFAULT
        prompts: list[Any] = captured_prompts(captured, hashes.pop(), max_tokens=max_tokens if explicit else None,
                                              limit=num_prompts)
    else:
        prompts = load_prompts(prompts_file, workload=workload,  # type: ignore[arg-type]
                               categories=categories or None, limit=num_prompts)
    tokenizer = tokenizer or (repository_tokenizer(repository) if repository else None)
    local = None
    if in_process:
        from specbuild.bench.in_process import InProcessRelease

        local = InProcessRelease(repository)  # before the server starts: its engines' warm-up runs alone
    with contextlib.ExitStack() as servers:
        grpc_url, server_metrics_url = servers.enter_context(bench_server(url, repository))
        versus = None
        if incumbent:
            incumbent_url, incumbent_metrics = servers.enter_context(bench_server(None, incumbent))
            versus = Served(incumbent_url, IdsClient.for_release(incumbent_url, incumbent, timeout=plan.timeout)
                            if captured else SpecbuildClient(incumbent_url, timeout=plan.timeout), incumbent_metrics)
        report = run_bench(grpc_url, prompts, plan, metrics_url=metrics_url or server_metrics_url,
                           tokenizer_dir=tokenizer, console=console, in_process=local, incumbent=versus,
                           client=IdsClient.for_release(grpc_url, repository, timeout=plan.timeout)
                           if captured else None)
    _show_bench(report, out_dir, plots, json_mode)
    verdict = evaluate(report.to_dict(), thresholds)
    _gate_outcome(verdict, {**report.to_dict(), "gate": verdict.to_dict()}, out_dir, json_mode)


def _check_release_options(repository: str | None, incumbent: str | None, captured: tuple[str, ...],
                           in_process: bool, prompts_file: str | None, categories: tuple[str, ...],
                           thresholds: Any) -> None:
    """The options that need a release folder (its tokenizer and models), and those that exclude each other."""
    needs = [name for name, given in (("--incumbent", incumbent), ("--captured", captured),
                                      ("--in-process", in_process)) if given]
    if needs and repository is None:
        raise UsageError(f"{needs[0]} needs --repository: the release's folder (its tokenizer and models; a server "
                         "is started on it)", "pass --repository with the release's folder instead of --url")
    if in_process and (incumbent or captured):
        raise UsageError("--in-process measures one release's served path on text prompts",
                         "run it in a bench of its own, without --incumbent and --captured")
    if captured and (prompts_file or categories):
        raise UsageError("--captured replays captured prompts: --prompts and --category choose other prompts",
                         "leave --prompts and --category out (--num-prompts takes the first N records)")
    if thresholds.faster_than_incumbent is not None and not incumbent:
        raise UsageError("--gate faster_than_incumbent compares with the release in service, and no --incumbent "
                         "was given", "pass --incumbent with that release's folder")


def _gate_outcome(verdict: Any, document: dict[str, Any], out_dir: str | None, json_mode: bool) -> None:
    """Show the gate's checks and keep them in ``gate.json``; refuse the release (exit 3) when one failed."""
    from specbuild.bench.report import gate_table
    from specbuild.errors import GateError
    from specbuild.stages.atomic import atomic_write_text

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
@click.option("--concurrency-schedule", is_flag=True,
              help=f"measure K per load instead: the best fixed K at concurrency {', '.join(map(str, TUNED_LOADS))} "
              "(each cell --requests, at least one block; adaptive K not swept), written as "
              "speculation.draft_len_schedule, on a server it starts on a copy of the release without its load policy")
@click.option("--traffic", default=None, metavar="PROFILE=SHARE,...",
              help="the sampling mix to tune for, e.g. greedy=0.5,t0.7=0.5 (profiles: " + ", ".join(PROFILE_NAMES)
              + "), written as speculation.traffic  [default: the spec's speculation.traffic]")
@workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="also write the bench report")
@click.option("--dry-run", is_flag=True, help="measure and show the choice; change nothing")
@json_option
@reports_errors
def tune(spec_file: str, goal: str, ks: tuple[int, ...] | None, adaptive: str, concurrency: int | None,
         url: str | None, concurrency_schedule: bool, traffic: str | None, prompts_file: str | None, workload: str,
         categories: tuple[str, ...], num_prompts: int | None, max_tokens: int, requests: int, max_seconds: float,
         out_dir: str | None, dry_run: bool, json_mode: bool) -> None:
    """Sweep K and adaptive K, pick the best for a goal, and make it the spec's and repository's default (or, with
    --concurrency-schedule, K per load)."""
    from specbuild.bench.figures import cell_label
    from specbuild.bench.prompts import load_prompts
    from specbuild.bench.tune import tune as run_tune
    from specbuild.bench.tune import tune_schedule

    prompts = load_prompts(prompts_file, workload=workload, categories=categories or None,  # type: ignore[arg-type]
                           limit=num_prompts)
    try:
        mix = parse_mix(traffic) if traffic is not None else None
    except ValueError as exc:
        raise UsageError(f"--traffic: {exc}", "e.g. --traffic greedy=0.5,t0.7=0.5") from None
    bounds = {"max_tokens": max_tokens, "requests": requests, "max_seconds": max_seconds, "write": not dry_run,
              "traffic": mix, "console": console}
    if concurrency_schedule:
        if url is not None or concurrency is not None:
            raise UsageError("--concurrency-schedule measures its own levels on a server it starts (without the "
                             "release's load policy, which would turn the K it measures into K=0)",
                             "drop --url and --concurrency")
        result = tune_schedule(spec_file, goal, prompts, ks=ks, **bounds)  # type: ignore[arg-type]
    else:
        result = run_tune(spec_file, goal, prompts, ks=ks, adaptive=ADAPTIVE_CHOICES[adaptive],  # type: ignore[arg-type]
                          concurrency=concurrency, url=url, **bounds)
    _show_bench(result.report, out_dir, True, json_mode)
    choice = result.choice
    if json_mode:
        print_json({**result.report.to_dict(), "goal": goal, "choice": choice.to_dict(), "spec": spec_file,
                    "draft_len_schedule": result.schedule, "traffic": result.mix,
                    "repository": str(result.compiled.repository) if result.compiled is not None else None})
    chosen = [cell for cell in result.report.cells if cell.key[:4] == choice.key[:4]]
    speedups = ", ".join(f"{cell.sampling} {cell.speedup or 1.0:.2f}x" for cell in chosen)
    mix = ", ".join(f"{name} {share:.0%}" for name, share in result.mix.items())
    label = cell_label(choice.k, choice.adaptive, choice.lookup)  # the setting, without the sampling it ran under
    console.print(f"best for {goal} on the traffic mix {mix}: [bold]{label}[/] (speedup {speedups} at concurrency "
                  f"{choice.concurrency})", highlight=False)
    if result.schedule is not None:
        console.print(f"K per load: {', '.join(f'K={k} from {c} in flight' for c, k in result.schedule.items())}",
                      highlight=False)
    if result.compiled is not None:
        written = f", draft_len_schedule={result.schedule}" if result.schedule is not None else ""
        console.print(f"wrote speculation.num_draft_tokens={choice.k}, adaptive={str(choice.adaptive).lower()}"
                      f"{written} into {spec_file}; re-packaged {result.compiled.repository} (restart its server to "
                      "use it)", highlight=False)


@main.command("demo-models")
@click.argument("out", type=click.Path(file_okay=False), required=False)
@click.option("--tiny", is_flag=True, help="the tiny pair made from nothing (for tests) instead of SmolLM2")
@tiny_seed_option
@json_option
@reports_errors
def demo_models(out: str | None, tiny: bool, tiny_seed: int, json_mode: bool) -> None:
    """Make the demo target/draft pair in OUT, offline (nothing downloaded; reused when already built).

    OUT defaults to the cache the demo and the tests share: .cache/demo-pair (or tiny-pair), or under
    $SPECBUILD_CACHE when set.
    """
    from specbuild.drafts.model_pairs import pair_dir

    _check_tiny_seed(tiny, tiny_seed)
    out = out or str(pair_dir("tiny" if tiny else "demo"))
    with progress_display(console) as progress:
        if tiny:
            from specbuild.drafts.tiny_models import build_tiny_pair

            pair = build_tiny_pair(out, seed=tiny_seed, progress=progress)
        else:
            from specbuild.drafts.demo_models import build_demo_pair

            pair = build_demo_pair(out, progress=progress)
    if json_mode:
        print_json(pair.info)
    console.print(f"target: {pair.target_dir}\ndraft:  {pair.draft_dir}", highlight=False)


CAPTURE = CaptureOptions(stores=())  # `specbuild draft --from-capture`'s defaults
# What a continued draft takes from its base (its architecture) or from the capture (its answers and held-out part).
NOT_WITH_CAPTURE = ("layers", "hidden", "prompts", "held_out", "answers")
ONLY_WITH_CAPTURE = ("base", "release", "held_out_share", "pool_share")


@main.command("draft")
@click.argument("paths", nargs=-1, required=True, metavar="[TARGET] OUT")
@click.option("--layers", type=click.IntRange(min=1), default=DRAFT.layers, show_default=True,
              help="decoder layers of the draft")
@click.option("--hidden", type=click.IntRange(min=1), default=DRAFT.hidden,
              help="hidden size (default: the target's, copying its embeddings, head and spread layers)")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=DRAFT.minutes, show_default=True,
              help="hard wall-clock budget of this run (data, training and the summary)")
@click.option("--steps", type=click.IntRange(min=1), default=DRAFT.steps, show_default=True,
              help="training steps of the schedule (the budget may stop it earlier); with --from-capture, "
                   f"default: {CAPTURE.passes:g} passes over the training data")
@click.option("--prompts", type=click.IntRange(min=2), default=DRAFT.prompts, show_default=True,
              help=f"distillation prompts the target answers (within {DRAFT.data_share:.0%} of the budget)")
@click.option("--held-out", type=click.IntRange(min=1), default=DRAFT.held_out, show_default=True,
              help="of those, kept out of training to measure acceptance")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=DRAFT.max_new_tokens, show_default=True)
@click.option("--seed", type=int, default=DRAFT.seed, show_default=True)
@click.option("--precision", type=click.Choice(PRECISIONS), default=DRAFT.precision, show_default=True,
              help="answers, labels and training matmuls; auto: bfloat16 on CPUs with bfloat16 matrix units and "
                   "on GPUs that support it")
@click.option("--device", type=click.Choice(DEVICES), default=DRAFT.device, show_default=True,
              help="where the target answers and the draft trains; auto: a CUDA GPU when there is one")
@click.option("--generate-batch", type=click.IntRange(min=1), default=DRAFT.generate_batch, show_default=True,
              help="prompts the target answers at once (a GPU takes hundreds)")
@click.option("--batch-tokens", type=click.IntRange(min=64), default=DRAFT.batch_tokens, show_default=True,
              help="padded tokens per training step")
@click.option("--answers", type=click.Choice(ANSWERS), default=DRAFT.answers, show_default=True,
              help="greedy+sampled: the target also answers every training prompt by sampling (temperature "
                   f"{DRAFT.sample_temperature})")
@click.option("--teacher", type=click.Choice(TEACHERS), default=DRAFT.teacher, show_default=True,
              help="labels: the target's top-k stored once; joint: the target runs in every training step and the "
                   "loss is the KL divergence from its full-vocabulary distribution")
@click.option("--head-vocabulary", type=click.IntRange(min=1), default=DRAFT.head_vocabulary, metavar="N",
              help="give the draft a head over the N ids the target uses most, ranked from the answers it distils "
                   "from (a cheaper draft step; the torch runtime serves it)")
@click.option("--from-capture", "stores", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="continue a draft on the traffic these capture stores hold (repeatable): the target's answers "
                   "are in the records; the newest records are held out (written to DIR/held-out/<OUT name>.jsonl "
                   "for bench) and OUT.state holds captured ids while the run lasts")
@click.option("--base", type=click.Path(file_okay=False), default=None, metavar="CHECKPOINT",
              help="with --from-capture: the draft to continue (TARGET is its target)")
@click.option("--release", type=click.Path(file_okay=False), default=None, metavar="REPO",
              help="with --from-capture: continue this release's own draft for its own target (no TARGET)")
@click.option("--held-out-share", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=CAPTURE.held_out_share, show_default=True,
              help="with --from-capture: the newest share of the records held out (no prompt template or "
                   "near-duplicate on both sides)")
@click.option("--pool-share", type=click.FloatRange(0, 1, max_open=True), default=CAPTURE.pool_share,
              show_default=True, help="with --from-capture: the share of training sequences from the original "
              "distillation pool, so kinds the traffic lacks are not forgotten")
@click.option("--resume", is_flag=True, help="continue from OUT.state (data and the last checkpoint)")
@json_option
@reports_errors
def draft_command(paths: tuple[str, ...], layers: int, hidden: int | None, minutes: float, steps: int, prompts: int,
                  held_out: int, max_new_tokens: int, seed: int, precision: str, device: str, generate_batch: int,
                  batch_tokens: int, answers: str, teacher: str, head_vocabulary: int | None,
                  stores: tuple[str, ...], base: str | None, release: str | None, held_out_share: float,
                  pool_share: float, resume: bool, json_mode: bool) -> None:
    """Distil a small draft for TARGET into OUT (same tokenizer; checkpoints and data in OUT.state).

    With --from-capture, continue a draft (--base, or the --release's own) on the traffic a release captured."""
    given = _given_options(click.get_current_context())
    if not stores:
        if len(paths) != 2 or given & set(ONLY_WITH_CAPTURE):
            raise UsageError("specbuild draft takes TARGET and OUT (--base, --release and the shares need "
                             "--from-capture)", "e.g. specbuild draft TARGET OUT, or add --from-capture DIR")
        from specbuild.drafts.distill import make_draft

        options = DraftOptions(layers=layers, hidden=hidden, minutes=minutes, steps=steps, prompts=prompts,
                               held_out=held_out, max_new_tokens=max_new_tokens, seed=seed, precision=precision,
                               device=device, generate_batch=generate_batch, batch_tokens=batch_tokens,
                               answers=answers, teacher=teacher, head_vocabulary=head_vocabulary)
        with progress_display(console) as progress:
            summary = make_draft(paths[0], paths[1], options, resume=resume, progress=progress)
        if json_mode:
            print_json(summary)
        _show_draft(paths[1], summary)
        return
    misplaced = sorted(given & set(NOT_WITH_CAPTURE))
    if misplaced:
        raise UsageError(f"--from-capture continues a draft with its own architecture on the captured answers, so "
                         f"{', '.join('--' + name.replace('_', '-') for name in misplaced)} do not apply",
                         "leave them out (--max-new-tokens and the pool's size follow --pool-share)")
    target, base_dir, out = _capture_models(paths, base, release)
    from specbuild.drafts.capture_distill import continue_draft

    options = DraftOptions(minutes=minutes, steps=steps, max_new_tokens=max_new_tokens, seed=seed,
                           precision=precision, device=device, generate_batch=generate_batch,
                           batch_tokens=batch_tokens, teacher=teacher, head_vocabulary=head_vocabulary,
                           learning_rate=CONTINUE_LEARNING_RATE)
    capture = CaptureOptions(stores=tuple(Path(store) for store in stores), held_out_share=held_out_share,
                             pool_share=pool_share, passes=None if "steps" in given else CAPTURE.passes)
    with progress_display(console) as progress:
        summary = continue_draft(target, base_dir, out, capture, options, resume=resume, progress=progress)
    if json_mode:
        print_json(summary)
    _show_draft(out, summary)
    _show_capture_figures(summary)


def _given_options(context: click.Context) -> set[str]:
    """The options the command line set (not left at their defaults)."""
    return {name for name in context.params
            if context.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


def _capture_models(paths: tuple[str, ...], base: str | None, release: str | None) -> tuple[Path, Path, Path]:
    """(target, base draft, output) for --from-capture: TARGET OUT with --base, or OUT with --release."""
    if (base is None) == (release is None):
        raise UsageError("--from-capture continues one draft: pass --base CHECKPOINT (with TARGET) or --release REPO",
                         "e.g. specbuild draft OUT --from-capture DIR --release triton_repo")
    if release is not None:
        if len(paths) != 1:
            raise UsageError("with --release the target is the release's own: pass OUT alone",
                             "e.g. specbuild draft OUT --from-capture DIR --release triton_repo")
        from specbuild.drafts.capture_sources import release_models

        target, draft = release_models(Path(release))
        return target, draft, Path(paths[0])
    if len(paths) != 2:
        raise UsageError("with --base pass TARGET and OUT", "e.g. specbuild draft TARGET OUT --from-capture DIR "
                         "--base DRAFT")
    return Path(paths[0]), Path(str(base)), Path(paths[1])


def _show_draft(out: str | Path, summary: dict[str, Any]) -> None:
    acceptance = " ".join(f"K={k}: {rate:.2f}" for k, rate in summary["held_out_acceptance"].items())
    head = summary.get("head_vocabulary")
    if head:
        acceptance += f" (a {head['size']}-id head, holding {head['held_out_coverage']:.1%} of the held-out answers)"
    console.print(f"draft: {out} ({summary['parameters'] / 1e6:.1f}M parameters, {summary['steps_done']} steps)\n"
                  f"held-out acceptance {acceptance}\n"
                  f"draft step {summary['draft_step_ms']} ms, target step {summary['target_step_ms']} ms; "
                  f"expected speedup {summary['expected_speedup'][str(summary['best_k'])]:.2f}x at K={summary['best_k']}",
                  highlight=False)


def _show_capture_figures(summary: dict[str, Any]) -> None:
    """Before and after, what was left out, and where the captured data now also lies."""
    provenance = summary["provenance"]
    capture, held, bundled = provenance["capture"], provenance["held_out"], provenance["bundled"]

    def change(before: dict[str, float], after: dict[str, float]) -> str:
        return " ".join(f"K={k}: {before[k]:.2f}->{after[k]:.2f}" for k in after)

    lines = [f"captured: {capture['records']} records ({capture['first_finished_at']} to {capture['last_finished_at']}"
             f", {capture['groups']} prompt groups); {held['records']} newest held out",
             f"rehearsed: {provenance['pool']['sequences']} answers to the original pool (--pool-share "
             f"{provenance['pool']['share']}; none once the data budget is spent)",
             f"held-out acceptance before->after: {change(held['acceptance_before'], held['acceptance_after'])}",
             f"bundled prompts (forgetting): {change(bundled['acceptance_before'], bundled['acceptance_after'])}"]
    skipped = sum(capture["other_tokenizers"].values())
    if skipped:
        lines.append(f"left out: {skipped} records of other tokenizers ("
                     + ", ".join(f"{checksum[:12]}: {n}" for checksum, n in capture["other_tokenizers"].items()) + ")")
    if capture["without_answer"]:
        lines.append(f"left out: {capture['without_answer']} records without an answer")
    if summary["data"].get("captured_unlabelled"):
        lines.append(f"left out: {summary['data']['captured_unlabelled']} older training records, unlabelled when the "
                     "data budget ran out (the newest first; more --minutes label more)")
    head = provenance.get("head_vocabulary")
    if head:
        before = "none" if head["held_out_coverage_before"] is None else f"{head['held_out_coverage_before']:.1%}"
        verdict = ("ranked again from the capture" if head["reranked"]
                   else "the base list kept: it covers as much or more")
        lines.append(f"head vocabulary: held-out coverage {before} (base) -> {head['held_out_coverage_after']:.1%} "
                     f"(ranked again); {verdict}")
    lines += [f"held-out records for bench: {path}" for path in summary["held_out_files"]]
    lines.append(f"{summary['state']} holds the captured token ids (they are the text): remove it once the draft is "
                 "released or rejected; the draft's weights embed the traffic too")
    console.print("\n".join(lines), highlight=False)


@main.command("head-vocabulary")
@click.argument("target", type=click.Path(file_okay=False))
@click.argument("draft", type=click.Path(file_okay=False))
@click.option("--size", type=click.IntRange(min=1), default=16384, show_default=True, help="ids the draft's head keeps")
@click.option("--prompts", type=click.IntRange(min=2), default=256, show_default=True,
              help="distillation prompts the target answers to rank the ids")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=DRAFT.max_new_tokens, show_default=True)
@click.option("--seed", type=int, default=DRAFT.seed, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=DRAFT.threads, show_default=True)
@click.option("--replace", is_flag=True, help="rank again over an existing head_vocabulary.json")
@json_option
@reports_errors
def head_vocabulary_command(target: str, draft: str, size: int, prompts: int, max_new_tokens: int, seed: int,
                            threads: int, replace: bool, json_mode: bool) -> None:
    """Give DRAFT a head over the SIZE ids TARGET uses most (head_vocabulary.json): a cheaper draft step."""
    from specbuild.drafts.target_ranking import write_for_draft

    with progress_display(console) as progress:
        vocabulary = write_for_draft(target, draft, size, replace=replace, prompts=prompts,
                                     max_new_tokens=max_new_tokens, seed=seed, threads=threads, progress=progress)
    if json_mode:
        print_json({**vocabulary.summary(), "provenance": vocabulary.provenance})
        return
    figures = vocabulary.provenance
    console.print(f"{draft}/head_vocabulary.json: {vocabulary.size} ids (sha256 {vocabulary.sha256[:12]}), covering "
                  f"{figures['coverage']:.1%} of {figures['answer_tokens']} answer tokens to {figures['answers']} "
                  f"prompts", highlight=False)
