"""Soak: a compiled release served on loopback under sustained concurrent load, bounded in time and count.

Requests mix streaming and not, K from 0 to 4 and greedy and sampled decoding. The run reports requests
served, errors (there must be none), latency percentiles per time window, the orchestrator's counters,
and the resident memory of the server and of each python model process and the server's ``/dev/shm``
use, sampled at every window: memory is *stable* when its growth from the first sample (taken after a
warm-up at full concurrency) to the last stays within the stated tolerance.

    specbuild demo --tiny --workdir /tmp/tiny          # a release to soak (or any compiled repository)
    python benchmarks/soak.py /tmp/tiny/triton_repo --concurrency 8 --duration 300 --json soak.json

Exit status: 0 when every request succeeded and memory was stable, 1 otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import click
from rich.console import Console
from rich.table import Table

from specbuild.bench.figures import percentiles
from specbuild.bench.sweep import read_counters
from specbuild.serve.client import GenerationRequest, SpecbuildClient
from specbuild.errors import RequestError, ServerError
from specbuild.serve.server import TritonServer

MIB = 2**20
# Growth allowed from the first memory sample to the last: allocator arenas and the engines' bounded prefix
# KV caches settle within the warm-up; a leak grows with every request and soon passes these.
RSS_TOLERANCE_FRACTION = 0.10
RSS_TOLERANCE_BYTES = 64 * MIB
SHM_TOLERANCE_BYTES = 8 * MIB

PROMPTS = (
    "def parse(text):",
    "The quick brown fox",
    "import json\n\nclass Decoder:",
    "Write a haiku about the sea.",
    "for key, value in sorted(items):",
    "Explain why the sky is blue, in one sentence.",
)


@dataclass(frozen=True)
class SoakConfig:
    concurrency: int = 8
    duration_s: float = 60.0
    max_requests: int = 100_000
    window_s: float = 10.0
    max_tokens: tuple[int, int] = (8, 48)  # drawn uniformly per request
    max_k: int = 4
    seed: int = 0


@dataclass(frozen=True)
class Outcome:
    finished_at: float  # seconds from the start of the measured run
    latency: float
    first_chunk: float | None
    tokens: int
    stream: bool
    error: str | None = None


@dataclass
class MemorySample:
    at: float
    rss: dict[str, int]  # process ("tritonserver", "draft_0_0", ...) -> resident bytes
    shm: int
    load: float  # the machine's 1-minute load average: other work on the cores slows requests down

    @property
    def total_rss(self) -> int:
        return sum(self.rss.values())


@dataclass
class SoakReport:
    config: SoakConfig
    seconds: float
    served: int
    errors: int
    error_messages: list[str]
    latency: dict[str, float | None]
    first_chunk: dict[str, float | None]
    windows: list[dict[str, Any]]
    memory: list[MemorySample]
    counters: dict[str, Any] | None
    server_alive: bool
    growth: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.errors == 0 and self.served > 0 and self.server_alive and self.growth.get("stable", False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def sample_memory(server: TritonServer, at: float) -> MemorySample:
    return MemorySample(at=round(at, 2), rss={name: rss_bytes(pid) for name, pid in sorted(server.processes().items())},
                        shm=server.shm_bytes(), load=round(os.getloadavg()[0], 2))


def memory_growth(first: MemorySample, last: MemorySample) -> dict[str, Any]:
    """Growth from ``first`` to ``last`` and whether it stays within the tolerances (a vanished or new
    process, e.g. a crashed stub, is never stable)."""
    rss_allowed = max(RSS_TOLERANCE_BYTES, RSS_TOLERANCE_FRACTION * first.total_rss)
    rss_growth = last.total_rss - first.total_rss
    shm_growth = last.shm - first.shm
    same_processes = first.rss.keys() == last.rss.keys()
    return {
        "rss_growth_bytes": rss_growth, "rss_allowed_bytes": int(rss_allowed),
        "shm_growth_bytes": shm_growth, "shm_allowed_bytes": SHM_TOLERANCE_BYTES,
        "per_process_growth_bytes": {name: last.rss.get(name, 0) - first.rss[name] for name in first.rss},
        "same_processes": same_processes,
        "stable": same_processes and rss_growth <= rss_allowed and shm_growth <= SHM_TOLERANCE_BYTES,
    }


def mixed_requests(config: SoakConfig) -> Iterator[GenerationRequest]:
    """An endless, seeded mix: stream or not, K in 0..max_k, greedy or sampled (top-k/top-p, seeded)."""
    rng = random.Random(config.seed)
    for index in itertools.count():
        sampled = rng.random() < 0.5
        yield GenerationRequest(
            prompt=rng.choice(PROMPTS), max_tokens=rng.randint(*config.max_tokens), stream=rng.random() < 0.5,
            num_draft_tokens=rng.randint(0, config.max_k),
            temperature=0.8 if sampled else None, top_k=rng.choice([0, 20]) if sampled else None,
            top_p=rng.choice([0.9, 1.0]) if sampled else None, seed=index if sampled else None,
        )


def _one(client: SpecbuildClient, request: GenerationRequest, started: float) -> Outcome:
    sent = time.perf_counter()
    try:
        generation = client.run(request)
    except (RequestError, ServerError) as exc:
        now = time.perf_counter()
        return Outcome(now - started, now - sent, None, 0, request.stream, exc.message)
    now = time.perf_counter()
    return Outcome(now - started, generation.total_time, generation.time_to_first_chunk,
                   generation.output_token_count or 0, request.stream)


def _load(client: SpecbuildClient, requests: Iterator[GenerationRequest], config: SoakConfig,
          deadline: float, started: float) -> list[Outcome]:
    """Run ``config.concurrency`` workers until the deadline or ``max_requests``; outcomes in finishing order."""
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    budget = itertools.count()

    def worker() -> None:
        while time.perf_counter() < deadline:
            with lock:
                if next(budget) >= config.max_requests:
                    return
                request = next(requests)
            outcome = _one(client, request, started)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(config.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _windows(outcomes: list[Outcome], window_s: float) -> list[dict[str, Any]]:
    rows = []
    for index, group in itertools.groupby(sorted(outcomes, key=lambda o: o.finished_at),
                                          key=lambda o: int(o.finished_at // window_s)):
        group = list(group)
        rows.append({"from_s": index * window_s, "requests": len(group),
                     "errors": sum(o.error is not None for o in group),
                     "tokens": sum(o.tokens for o in group),
                     **percentiles(o.latency for o in group if o.error is None)})
    return rows


def run_soak(server: TritonServer, config: SoakConfig, console: Console | None = None) -> SoakReport:
    """Load the running ``server`` as ``config`` says and measure it (see the module docstring)."""
    client = SpecbuildClient(server.grpc_url, timeout=120)
    requests = mixed_requests(config)
    _load(client, requests, replace(config, max_requests=config.concurrency), time.perf_counter() + 600,
          time.perf_counter())  # warm-up: caches and allocator arenas at full concurrency
    before = read_counters(server.metrics_url)
    started = time.perf_counter()
    deadline = started + config.duration_s
    memory = [sample_memory(server, 0.0)]
    done = threading.Event()
    result: list[list[Outcome]] = []

    def load() -> None:
        result.append(_load(client, requests, config, deadline, started))
        done.set()

    threading.Thread(target=load, daemon=True).start()
    while not done.wait(config.window_s):
        memory.append(sample_memory(server, time.perf_counter() - started))
        if console is not None:
            console.print(f"  {memory[-1].at:7.1f} s: rss {memory[-1].total_rss / MIB:.0f} MiB, "
                          f"shm {memory[-1].shm / MIB:.0f} MiB, load {memory[-1].load:.1f}", highlight=False)
    seconds = time.perf_counter() - started
    memory.append(sample_memory(server, seconds))
    outcomes = result[0]
    after = read_counters(server.metrics_url)
    errors = [o.error for o in outcomes if o.error is not None]
    return SoakReport(
        config=config, seconds=round(seconds, 2), served=len(outcomes) - len(errors), errors=len(errors),
        error_messages=sorted(set(errors))[:20],
        latency=percentiles(o.latency for o in outcomes if o.error is None),
        first_chunk=percentiles(o.first_chunk for o in outcomes if o.error is None and o.stream),
        windows=_windows(outcomes, config.window_s), memory=memory,
        counters=(after - before).as_dict() if before is not None and after is not None else None,
        server_alive=server.is_running(), growth=memory_growth(memory[0], memory[-1]),
    )


def report_table(report: SoakReport) -> Table:
    table = Table(title=f"soak: {report.served} served, {report.errors} errors in {report.seconds:.0f} s "
                        f"(concurrency {report.config.concurrency})", title_justify="left")
    for column in ("window", "requests", "errors", "tokens", "p50 s", "p95 s", "p99 s", "rss MiB", "shm MiB", "load"):
        table.add_column(column, justify="right")
    samples = {int(sample.at // report.config.window_s): sample for sample in report.memory}
    for row in report.windows:
        sample = samples.get(int(row["from_s"] // report.config.window_s) + 1)
        cells = [f"{row[q]:.3f}" if row[q] is not None else "-" for q in ("p50", "p95", "p99")]
        table.add_row(f"{row['from_s']:.0f}s", str(row["requests"]), str(row["errors"]), str(row["tokens"]), *cells,
                      f"{sample.total_rss / MIB:.0f}" if sample else "-", f"{sample.shm / MIB:.0f}" if sample else "-",
                      f"{sample.load:.1f}" if sample else "-")
    growth = report.growth
    rss, shm = (f"{growth[f'{kind}_growth_bytes'] / MIB:+.1f} MiB (allowed {growth[f'{kind}_allowed_bytes'] / MIB:.0f})"
                for kind in ("rss", "shm"))
    table.caption = f"memory {'stable' if growth['stable'] else 'GROWING'}: rss {rss}, shm {shm}"
    return table


@click.command()
@click.argument("repository", type=click.Path(exists=True, file_okay=False))
@click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--duration", type=click.FloatRange(1, 24 * 3600), default=60.0, show_default=True, help="seconds")
@click.option("--max-requests", type=click.IntRange(1), default=100_000, show_default=True)
@click.option("--window", type=click.FloatRange(1), default=10.0, show_default=True, help="seconds per window")
@click.option("--max-k", type=click.IntRange(0, 64), default=4, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="write the report here")
def main(repository: str, concurrency: int, duration: float, max_requests: int, window: float, max_k: int,
         json_path: str | None) -> None:
    """Serve REPOSITORY on loopback and soak it; print a table, optionally write JSON."""
    console = Console(stderr=True)
    config = SoakConfig(concurrency=concurrency, duration_s=duration, max_requests=max_requests, window_s=window,
                        max_k=max_k)
    with TritonServer(repository, startup_timeout=300) as server:
        console.print(f"soaking {repository} on {server.grpc_url} for up to {duration:g} s / {max_requests} requests")
        report = run_soak(server, config, console)
    console.print(report_table(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    raise SystemExit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
