"""The request side of ``specbuild bench``: a bounded sweep of streamed requests over (K, adaptive, prompt
lookup, concurrency, sampling profile) cells against a served ensemble on this machine. The math lives in
:mod:`specbuild.bench.figures`.

Cells are measured interleaved, never one after another: on a shared machine the load changes while a sweep
runs, and cells run in sequence drift apart (a K=2 cell measured 1.30x in sequence and 1.07x interleaved;
docs/benchmarks.md). At each concurrency level C the prompts go in blocks of C; every cell of the level
runs each block in turn (C requests in flight, one per prompt), the order of the cells rotating from block
to block so that none always goes first. A cell's wall time is the sum of its blocks' and its counters (and
latency histograms) the sum of the serving model's Prometheus deltas over its blocks, so drift falls on every cell
alike.

Two releases (``bench --incumbent``: a new release against the one in service) run in one sweep, each on its own
server: every cell's block runs on both back to back, which one goes first alternating from block to block, so the
ratio of their speeds is as free of drift as the ratio of two cells.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import ipaddress
import os
import platform
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specbuild.bench.histograms import Latencies
from specbuild.bench.figures import (Cell, CellKey, Counters, RequestTrace, cell_label, chunk_tokens, compare,
                                     drift_warnings, match_baseline, match_incumbent, served_efficiency,
                                     summarize)
from specbuild.package.contract import PREPROCESSING_MODEL
from specbuild.errors import MetricsUnreadable, RequestError, ServerError, UsageError
from specbuild.bench.prompts import Prompt
from specbuild.spec import LOCAL_GRPC_URL, TRITON_DEFAULTS
from specbuild.speculation.traffic import GREEDY, sampling_profile

WARMUP_TOKENS = 8
T = TypeVar("T")


class BenchPlan(BaseModel):
    """What to sweep and the bounds of every cell (count and time)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ks: tuple[int, ...] = (0, 1, 2, 4)
    concurrencies: tuple[int, ...] = (1,)
    adaptive: tuple[bool, ...] = (False,)
    lookup: tuple[bool, ...] = (False,)
    max_tokens: int = Field(64, ge=1)
    requests: int = Field(16, ge=1, description="requests per cell")
    max_seconds: float = Field(300.0, gt=0, description="per cell: no further round of blocks starts once a cell "
                               "has run this long")
    timeout: float = Field(600.0, gt=0, description="per request")
    samplings: tuple[str, ...] = Field((GREEDY,), description="sampling profiles (speculation.traffic): greedy and "
                                       "sampled cells side by side, each against K=0 of its own profile")
    warmup: bool = True

    @field_validator("ks")
    @classmethod
    def _with_zero(cls, ks: tuple[int, ...]) -> tuple[int, ...]:
        if any(k < 0 for k in ks):
            raise ValueError("K must be 0 or more")
        return tuple(sorted({0, *ks}))  # K=0 is the baseline every speedup is measured against

    @field_validator("samplings")
    @classmethod
    def _known_profiles(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if not names:
            raise ValueError("give at least one sampling profile, e.g. greedy")
        for name in names:
            sampling_profile(name)
        return tuple(dict.fromkeys(names))

    @field_validator("concurrencies")
    @classmethod
    def _positive(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if not levels or any(c < 1 for c in levels):
            raise ValueError("concurrency levels must be 1 or more")
        return tuple(sorted(set(levels)))

    def cells(self) -> list[CellKey]:
        """(k, adaptive, lookup, concurrency, sampling) in report order; adaptive K and prompt lookup mean nothing
        at K=0."""
        return [(k, adaptive, lookup, c, sampling) for c in self.concurrencies for sampling in self.samplings
                for k in self.ks for adaptive in (sorted(set(self.adaptive)) if k else [False])
                for lookup in (sorted(set(self.lookup)) if k else [False])]

    def blocks(self, concurrency: int) -> list[list[int]]:
        """The request indices of each block at ``concurrency``: ``requests`` in all, ``concurrency`` at a
        time (the last block may be smaller); request i sends prompt i modulo the number of prompts."""
        return [list(range(first, min(first + concurrency, self.requests)))
                for first in range(0, self.requests, concurrency)]

    def schedule(self, concurrency: int) -> list[tuple[CellKey, list[int]]]:
        """(cell, block) in run order at ``concurrency``: every cell of the level runs each block before the
        next block starts, the cells' order rotating by one from block to block."""
        level = [key for key in self.cells() if key[3] == concurrency]
        return [(key, block) for number, block in enumerate(self.blocks(concurrency))
                for key in rotated(level, number)]

    def runs(self, concurrency: int, releases: int = 1) -> list[tuple[int, CellKey, list[int]]]:
        """(release, cell, block) in run order at ``concurrency`` with ``releases`` servers: each (cell, block) of
        :meth:`schedule` on every release back to back, the releases' order rotating from block to block."""
        width = len([key for key in self.cells() if key[3] == concurrency])
        return [(release, key, block) for position, (key, block) in enumerate(self.schedule(concurrency))
                for release in rotated(range(releases), position // width)]


@dataclass
class IncumbentRun:
    """The incumbent release's side of a sweep against it."""

    url: str
    cells: list[Cell]
    warnings: list[str] = field(default_factory=list)


@dataclass
class BenchReport:
    plan: BenchPlan
    url: str
    prompts: int
    cells: list[Cell]
    metrics: bool  # whether the server's counters were read
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # cells whose figures cannot be trusted, and why
    # --in-process: the concurrency-1 cells again with the release's engines in the bench's process (bench.in_process)
    in_process: list[Cell] = field(default_factory=list)
    # --incumbent: the release in service, measured in the same sweep (its cells against its own K=0)
    incumbent: IncumbentRun | None = None
    # the fewest and most tokens a request asked for (--captured: each record its answer's); (0, 0): plan.max_tokens
    max_tokens_sent: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        if self.max_tokens_sent == (0, 0):
            self.max_tokens_sent = (self.plan.max_tokens, self.plan.max_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "specbuild.bench/v1", "url": self.url, "prompts": self.prompts, "metrics": self.metrics,
                "order": "interleaved", "plan": self.plan.model_dump(mode="json"),
                "max_tokens_sent": list(self.max_tokens_sent), "environment": self.environment,
                "warnings": self.warnings, "cells": [cell.to_dict() for cell in self.cells],
                "in_process": [cell.to_dict() for cell in self.in_process],
                "incumbent": None if self.incumbent is None else {
                    "url": self.incumbent.url, "warnings": self.incumbent.warnings,
                    "cells": [cell.to_dict() for cell in self.incumbent.cells]},
                "served_efficiency": {cell.label: efficiency for cell, efficiency in served_efficiency(self.cells,
                                                                                                  self.in_process)}}


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """``items`` rotated left by ``shift`` (modulo their count): the run order for the ``shift``-th block of
    prompts, so that over consecutive blocks every item runs first, second, ... equally often.

    >>> [rotated("abc", i) for i in range(4)]
    [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]
    """
    items = list(items)
    if not items:
        return []
    shift %= len(items)
    return items[shift:] + items[:shift]


# --- addresses -------------------------------------------------------------------------------------------
def host_of(url: str) -> str:
    parsed = urllib.parse.urlsplit(url if "://" in url else f"//{url}")
    return parsed.hostname or ""


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (every address it resolves to is a loopback address)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host_of(url), None)}
        return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    except (socket.gaierror, ValueError):
        return False


def default_metrics_url(grpc_url: str) -> str:
    host = host_of(grpc_url)
    return f"http://{f'[{host}]' if ':' in host else host}:{TRITON_DEFAULTS.metrics_port}/metrics"


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
METRICS_TIMEOUT_S = 5.0
METRICS_ATTEMPTS = 3  # a loaded machine can miss one read's timeout; three misses in a row: the server is not there
METRICS_RETRY_PAUSE_S = 1.0


def read_metrics(metrics_url: str, *, timeout: float = METRICS_TIMEOUT_S,
                 attempts: int = METRICS_ATTEMPTS) -> tuple[Counters, Latencies]:
    """The serving model's counters and latency histograms from the metrics endpoint. A read that fails (refused,
    timed out, an HTTP error, a cut-off answer) is tried again, ``attempts`` in all; then
    :class:`~specbuild.errors.MetricsUnreadable` names the URL and the last cause."""
    from prometheus_client.parser import text_string_to_metric_families

    for attempt in range(1, attempts + 1):
        try:
            with _DIRECT.open(metrics_url, timeout=timeout) as response:
                text = response.read().decode("utf-8", "replace")
            break
        except (OSError, http.client.HTTPException) as exc:  # URLError and timeouts are OSErrors
            if attempt == attempts:
                cause = exc.reason if type(exc) is urllib.error.URLError else exc  # HTTPError says its status
                raise MetricsUnreadable(f"the metrics endpoint {metrics_url} did not answer in {attempts} tries "
                                        f"({timeout:g} s each): {cause or type(exc).__name__}",
                                        "check that the server is up and its metrics port is reachable from here "
                                        "(--metrics-url)") from exc
            time.sleep(METRICS_RETRY_PAUSE_S)
    samples = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]
    return Counters.from_samples(samples), Latencies.from_samples(samples)


def read_counters(metrics_url: str) -> Counters:
    """The orchestrator's counters from the metrics endpoint (:func:`read_metrics`: tried again, then an error)."""
    return read_metrics(metrics_url)[0]


def optional_metrics(metrics_url: str | None) -> tuple[Counters, Latencies] | None:
    """:func:`read_metrics` for the bench, whose server figures are optional: None where there is no endpoint or it
    did not answer (a cell then goes without server figures rather than with wrong ones)."""
    if metrics_url is None:
        return None
    try:
        return read_metrics(metrics_url)
    except MetricsUnreadable:
        return None


# --- prompts ---------------------------------------------------------------------------------------------
def repository_tokenizer(repository: str | Path) -> Path | None:
    """The tokenizer shipped in a repository's preprocessing model, if there is one."""
    path = Path(repository) / PREPROCESSING_MODEL / "1" / "tokenizer"
    return path if path.is_dir() else None


def chat_prompts(tokenizer_dir: str | Path | None, prompts: Sequence[Prompt]) -> list[str]:
    """Prompt texts wrapped in the tokenizer's chat template when it has one (else as written)."""
    if tokenizer_dir is None:
        return [p.prompt for p in prompts]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=False)
    if not getattr(tokenizer, "chat_template", None):
        return [p.prompt for p in prompts]
    return [tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


@dataclass(frozen=True)
class SentPrompt:
    """A prompt as the bench sends it: its text (in the chat template where there is one), kind and guide; or its
    token ids, sent as they are to the orchestrator (a captured prompt, :mod:`specbuild.bench.captured`), with the
    tokens its answer had (None: the plan's ``max_tokens``)."""

    text: str
    category: str
    guide: dict[str, str] = field(default_factory=dict)
    ids: tuple[int, ...] = ()
    max_tokens: int | None = None


def sent_prompts(tokenizer_dir: str | Path | None, prompts: Sequence[Prompt]) -> list[SentPrompt]:
    return [SentPrompt(text, p.category, p.guide) for text, p in zip(chat_prompts(tokenizer_dir, prompts), prompts)]


# --- requests --------------------------------------------------------------------------------------------
def asked_tokens(prompt: SentPrompt, plan: BenchPlan) -> int:
    """The tokens a measured request of ``prompt`` asks for: its own (a captured record's) or the plan's."""
    return prompt.max_tokens or plan.max_tokens


def _request(prompt: SentPrompt, index: int, plan: BenchPlan, key: CellKey, max_tokens: int | None = None) -> Any:
    """Prompt ``index``'s request in the cell ``key`` (a sampled cell's seed is the prompt's, in every cell alike)."""
    from specbuild.serve.client import GenerationRequest
    from specbuild.serve.orchestrator_client import IdsRequest

    k, adaptive, lookup, _, sampling = key
    settings = {"num_draft_tokens": k, "adaptive_draft": adaptive if k else None,
                "prompt_lookup": lookup if k else None, **sampling_profile(sampling).request_fields(index)}
    tokens = max_tokens or asked_tokens(prompt, plan)
    if prompt.ids:
        return IdsRequest(prompt.ids, tokens, stream=True, settings=settings)
    return GenerationRequest(prompt.text, tokens, stream=True, **settings, **prompt.guide)


def trace_request(client: Any, index: int, category: str, request: Any) -> RequestTrace:
    """Send one streamed request and record its timeline (errors are recorded, not raised)."""
    started = time.perf_counter()
    try:
        generation = client.run(request)
    except (RequestError, ServerError) as exc:
        return RequestTrace(index, category, (), (), time.perf_counter() - started, error=exc.message)
    chunks = generation.chunks
    return RequestTrace(
        prompt_index=index, category=category, chunk_times=tuple(c.elapsed for c in chunks),
        chunk_tokens=tuple(chunk_tokens([c.output_token_count for c in chunks])), total_time=generation.total_time,
        drafted=generation.total_draft_tokens or 0, accepted=generation.total_accepted_draft_tokens or 0,
        text=generation.text,
    )


def prompt_index(request_index: int, prompts: Sequence[Any]) -> int:
    """The prompt a cell's request ``request_index`` asks: request i asks prompt i, from the first again past the
    last."""
    return request_index % len(prompts)


def run_block(client: Any, prompts: Sequence[SentPrompt], plan: BenchPlan, key: CellKey, block: Sequence[int],
              on_done: Callable[[], None] = lambda: None) -> tuple[list[RequestTrace], float]:
    """The requests of one block sent together (one thread each) with the cell's setting; returns the traces
    and the block's wall time (until its last request finished)."""
    def send(request_index: int) -> RequestTrace:
        index = prompt_index(request_index, prompts)
        trace = trace_request(client, index, prompts[index].category, _request(prompts[index], index, plan, key))
        on_done()
        return trace

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(block)) as pool:
        traces = list(pool.map(send, block))
    return traces, time.perf_counter() - started


@dataclass
class _CellRun:
    """What an interleaved cell has gathered so far over its blocks."""

    traces: list[RequestTrace] = field(default_factory=list)
    wall: float = 0.0
    counters: Counters | None = None
    latencies: Latencies | None = None


def run_in_process(release: Any, prompts: Sequence[SentPrompt], plan: BenchPlan, key: CellKey,
                   block: Sequence[int], run: _CellRun) -> None:
    """One block of a concurrency-1 cell answered by the release in this process
    (:class:`~specbuild.bench.in_process.InProcessRelease`), one request after another, added to ``run``."""
    before = release.counts.counters()
    for request_index in block:
        index = prompt_index(request_index, prompts)
        trace = release.trace(index, prompts[index].category, _request(prompts[index], index, plan, key))
        run.traces.append(trace)
        run.wall += trace.total_time
    run.counters = (run.counters or Counters()) + (release.counts.counters() - before)


@dataclass(frozen=True)
class Served:
    """A served release the sweep sends requests to: its address, its client and its metrics endpoint (None: not
    read)."""

    url: str
    client: Any
    metrics_url: str | None = None


def run_level(servers: Sequence[Served], prompts: Sequence[SentPrompt], plan: BenchPlan, concurrency: int,
              on_done: Callable[[], None] = lambda: None,
              in_process: tuple[Any, dict[CellKey, _CellRun]] | None = None) -> list[dict[CellKey, _CellRun]]:
    """Every cell of one concurrency level on each of ``servers``, interleaved block by block (see the module
    docstring); the runs by cell, one mapping per server. After a round of blocks (every cell once on every
    server), no further round starts if a cell has run ``plan.max_seconds``, so every cell has sent the same
    prompts. ``in_process`` (a release in this process and its cells' runs): at concurrency 1, each block runs
    there too, right after the (one) server ran it."""
    runs = [{key: _CellRun(counters=Counters(), latencies=Latencies({})) if server.metrics_url else _CellRun()
             for key in plan.cells() if key[3] == concurrency} for server in servers]
    width = len(runs[0]) * len(servers)
    for position, (number, key, block) in enumerate(plan.runs(concurrency, len(servers))):
        if position % width == 0 and any(run.wall > plan.max_seconds for side in runs for run in side.values()):
            break
        server, run = servers[number], runs[number][key]
        before = optional_metrics(server.metrics_url)
        traces, wall = run_block(server.client, prompts, plan, key, block, on_done)
        after = optional_metrics(server.metrics_url)
        run.traces += traces
        run.wall += wall
        if run.counters is not None and run.latencies is not None and before is not None and after is not None:
            run.counters += after[0] - before[0]
            run.latencies += after[1] - before[1]
        else:  # a missed reading leaves the cell without server figures rather than with wrong ones
            run.counters = run.latencies = None
        if in_process is not None and concurrency == 1:
            release, in_runs = in_process
            run_in_process(release, prompts, plan, key, block, in_runs.setdefault(key, _CellRun()))
    return runs


def cpu_model() -> str | None:
    """The CPU's model name (Linux's ``/proc/cpuinfo``): machines of one kind differ in speed and in their floating
    point results, so every figure says which CPU made it."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return platform.processor() or None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def environment() -> dict[str, Any]:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.machine(), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def run_bench(url: str, prompts: Sequence[Prompt] | Sequence[SentPrompt], plan: BenchPlan, *,
              metrics_url: str | None = None, tokenizer_dir: str | Path | None = None, console: Any = None,
              in_process: Any = None, client: Any = None, incumbent: Served | None = None) -> BenchReport:
    """Sweep ``plan`` against the ensemble at ``url`` (gRPC; another machine only when the user named it) and
    compute every cell's figures. ``prompts``: as written (wrapped in ``tokenizer_dir``'s chat template) or as sent
    (:class:`SentPrompt`, e.g. captured ids); ``client``: what sends them (default: a
    :class:`~specbuild.serve.client.SpecbuildClient` of ``url``). With ``in_process`` (an
    :class:`~specbuild.bench.in_process.InProcessRelease` of the served release) the concurrency-1 cells also run
    there, interleaved, for the served path's efficiency; with ``incumbent`` (the release in service) every cell also
    runs on that release, interleaved, for the ratio of their speeds and texts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specbuild.serve.client import SpecbuildClient

    if not prompts:
        raise UsageError("no prompts to send", "pass a JSONL file with prompts, or use the bundled set")
    metrics_url = metrics_url or default_metrics_url(url)
    if console is not None and not is_loopback(url):
        console.print(f"[yellow]note:[/] {url} is not this machine: the benchmark loads a server elsewhere with "
                      f"{len(plan.cells()) * plan.requests} requests", highlight=False)
    servers = [Served(url, client or SpecbuildClient(url, timeout=plan.timeout), metrics_url),
               *([incumbent] if incumbent is not None else [])]
    sent = list(prompts) if isinstance(prompts[0], SentPrompt) else sent_prompts(tokenizer_dir, prompts)
    for server in servers:
        warm_up(lambda request, index: trace_request(server.client, index, "warmup", request), sent, plan)
    if in_process is not None:
        warm_up(lambda request, index: in_process.trace(index, "warmup", request), sent, plan)
    servers = [replace(server, metrics_url=server.metrics_url if optional_metrics(server.metrics_url) else None)
               for server in servers]
    cells: list[list[Cell]] = [[] for _ in servers]
    outputs: list[dict[CellKey, dict[int, str]]] = [{} for _ in servers]
    in_runs: dict[CellKey, _CellRun] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("bench (interleaved)", total=len(plan.cells()) * plan.requests * len(servers))
        for concurrency in plan.concurrencies:
            progress.update(task, description=f"bench (interleaved), concurrency {concurrency}")
            runs = run_level(servers, sent, plan, concurrency, on_done=lambda: progress.advance(task),
                             in_process=(in_process, in_runs) if in_process is not None else None)
            for side, side_runs in enumerate(runs):
                for key, run in side_runs.items():
                    if run.traces and all(t.error for t in run.traces):
                        raise ServerError(f"every request failed at {cell_label(*key[:3], key[4])} concurrency "
                                          f"{concurrency}{' on the incumbent' if side else ''}: "
                                          f"{run.traces[0].error}",
                                          "check the server log; lower K below the engine's max_draft_len")
                    cells[side].append(_summarized(key, run, server_latency=run.latencies
                                                   and run.latencies.percentiles()))
                    outputs[side][key] = run_texts(run)
    cells = [compare(side) for side in cells]
    for side, side_cells in enumerate(cells):
        match_baseline(side_cells, outputs[side])
    local = compare([_summarized(key, run) for key, run in in_runs.items()])
    # in process, the same greedy texts as the served target alone: the served path changes no token
    match_baseline(local, {key: run_texts(run) for key, run in in_runs.items()},
                   baseline=outputs[0].get((0, False, False, 1, GREEDY), {}))
    asked = [asked_tokens(sent[prompt_index(index, sent)], plan) for index in range(plan.requests)]
    report = BenchReport(plan=plan, url=url, prompts=len(prompts), cells=cells[0],
                         metrics=servers[0].metrics_url is not None, environment=environment(),
                         warnings=drift_warnings(cells[0]), in_process=local, max_tokens_sent=(min(asked), max(asked)))
    if incumbent is not None:
        match_incumbent(report.cells, cells[1], outputs[0], outputs[1])
        report.incumbent = IncumbentRun(incumbent.url, cells[1], drift_warnings(cells[1]))
    return report


def warm_up(send: Callable[[Any, int], RequestTrace], prompts: Sequence[SentPrompt], plan: BenchPlan) -> None:
    """Before anything is timed (``plan.warmup``): load both engines and their first-call paths, then have the target
    read every other prompt the cells will send once (K=0, one token), so its prefix cache holds them. A prompt's
    prefill is the same work in every cell; left in, each long prompt's would land on whichever cell met it first
    (docs/benchmarks.md, "Long prompts and the draft's window", run 1). The draft's own reading of a prompt stays in
    the cells that draft: it is what speculation costs."""
    if not plan.warmup:
        return
    requests = [_request(prompts[0], 0, plan, (k, False, False, 1, GREEDY), max_tokens=WARMUP_TOKENS)
                for k in {0, max(plan.ks)}]
    sent = sorted({prompt_index(request, prompts) for request in range(plan.requests)} - {0})
    requests += [_request(prompts[index], index, plan, (0, False, False, 1, GREEDY), max_tokens=1) for index in sent]
    for index, request in enumerate(requests):
        trace = send(request, index)
        if trace.error:
            raise ServerError(f"the warm-up request failed: {trace.error}",
                              "check that the server at the given address serves a specbuild ensemble")


def _summarized(key: CellKey, run: _CellRun, **figures: Any) -> Cell:
    k, adaptive, lookup, concurrency, sampling = key
    return summarize(k, concurrency, adaptive, run.traces, run.wall, run.counters, lookup=lookup, sampling=sampling,
                     **figures)


def run_texts(run: _CellRun) -> dict[int, str]:
    return {trace.prompt_index: trace.text for trace in run.traces if trace.error is None}


@contextlib.contextmanager
def bench_server(url: str | None, repository: str | Path | None,
                 startup_timeout: float = 300.0) -> Iterator[tuple[str, str | None]]:
    """The (gRPC url, metrics url) to benchmark: a server started on ``repository`` (stopped afterwards), or
    the running one at ``url``.

    A release that captures its traffic (the release in service, measured against a candidate) writes the bench's
    requests to a temporary store, deleted when the server stops: the capture path's cost is measured, and no
    measurement lands in a real store."""
    if (url is None) == (repository is None):
        raise UsageError("give either --url (a running server) or --repository (one to start), not both or neither",
                         f"e.g. --repository triton_repo, or --url {LOCAL_GRPC_URL}")
    if url is not None:
        yield url, None
        return
    from specbuild.package.repository import orchestrator_settings
    from specbuild.serve.server import TritonServer

    settings = orchestrator_settings(Path(repository))
    with contextlib.ExitStack() as scratch:
        store = (scratch.enter_context(tempfile.TemporaryDirectory(prefix="specbuild-bench-capture-"))
                 if settings is not None and settings.capture else None)
        with TritonServer(repository, startup_timeout=startup_timeout, capture_dir=store) as server:  # loopback
            yield server.grpc_url, server.metrics_url

