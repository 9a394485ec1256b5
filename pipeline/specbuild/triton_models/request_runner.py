"""How the orchestrator serves one client request, without Triton: the request's rows run at once, each through
:func:`specbuild.speculation.loop.speculate`; one failing or cancelled row stops its siblings' work; a row stops
after the round that passes its deadline; each response goes out when a row has news, the request's last one
flagged final and sent only after the metrics count the request (so a client that reads the metrics next finds it)
and, where the release captures, after its record is written.

The Triton model (``triton_models/orchestrator_model.py``) hands each request in as an :class:`Exchange` (its tensors in,
its responses out, its cancellation) and the engine models as two async calls; tests hand in their own, so the
policy is tested in the fast tier and the served path by the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import OrchestratorParameters
from specbuild.speculation.drafting import DraftHealth, draft_sources
from specbuild.speculation.engine_call import EngineCall
from specbuild.speculation.guide import Guide, engine_guide
from specbuild.speculation.guide_spec import GuideSpec
from specbuild.speculation.loop import speculate
from specbuild.speculation.round_costs import RoundCosts
from specbuild.speculation.stats import SpeculationStats
from specbuild.triton_models.orchestrator_requests import OrchestratorRowProgress, parse_orchestrator_rows
from specbuild.triton_models.request_capture import RequestCapture

TIME_LIMIT = "time"  # a row's finish reason when its time limit ends it


class RequestCancelled(Exception):
    """The client cancelled the request (or went away)."""


class Exchange(Protocol):
    """One client request: its input tensors, whether its client cancelled it, and its responses."""

    def arrays(self) -> Mapping[str, np.ndarray | None]: ...

    def cancelled(self) -> bool: ...

    def send(self, arrays: Mapping[str, np.ndarray], *, final: bool) -> None: ...

    def send_error(self, message: str) -> None:
        """The final response: an error."""

    def send_cancelled(self) -> None:
        """The final response: Triton's CANCELLED."""


class Recorder(Protocol):
    """The metrics the orchestrator exports (:class:`specbuild.triton_models.metrics.Metrics` in Triton)."""

    @property
    def requests_in_flight(self) -> int: ...

    def in_flight(self, change: int) -> None: ...

    def count(self, key: str, value: float = 1.0) -> None: ...

    def record(self, stats: SpeculationStats, output_tokens: int) -> None: ...

    def observe_latencies(self, *, arrival_ns: int, scheduled_ns: int, first_token_ns: int, last_token_ns: int,
                          output_tokens: int) -> None: ...


class Log(Protocol):
    def log_info(self, message: str) -> None: ...

    def log_warn(self, message: str) -> None: ...

    def log_error(self, message: str) -> None: ...


class RequestRunner:
    """Serves the orchestrator's requests with ``target`` and ``draft`` engine calls (see the module notes); the
    draft's health is shared by every request, so a failing draft model is left alone for a while by all."""

    def __init__(self, settings: OrchestratorParameters, target: EngineCall, draft: EngineCall, metrics: Recorder,
                 log: Log, health: DraftHealth | None = None, clock: Callable[[], float] = time.monotonic,
                 guides: Callable[[GuideSpec, int | None], Guide] | None = None,
                 capture: RequestCapture | None = None) -> None:
        """``guides`` makes a guided row's matcher (GuideCompiler.guide: blocking, so run in a worker thread);
        ``capture`` writes finished rows to the capture store (None: the release captures nothing)."""
        self.settings = settings
        self.guides = guides
        self.capture = capture
        self.target = target
        self.draft = draft
        self.metrics = metrics
        self.log = log
        self.health = health or DraftHealth()
        self.clock = clock
        self._rows_running = 0
        # what rounds cost on this host, for every request's break-even; only from rounds that ran alone
        self.costs = RoundCosts(exclusive=lambda: self._rows_running <= 1 and self.metrics.requests_in_flight <= 1)

    async def serve(self, exchange: Exchange) -> None:
        """Answer one request (counted in flight while it runs); never raises: a failure is the request's error."""
        self.metrics.in_flight(+1)
        try:
            await self._serve(exchange)
        finally:
            self.metrics.in_flight(-1)

    async def _serve(self, exchange: Exchange) -> None:
        arrival_ns, started = time.time_ns(), self.clock()
        try:
            rows = [OrchestratorRowProgress(index, row=row)
                    for index, row in enumerate(parse_orchestrator_rows(exchange.arrays(), self.settings))]
            for row in rows:  # compiled before any engine call: an invalid guide is the request's error
                spec, generation = row.row.guide, row.row.generation
                if spec is not None:
                    if self.guides is None:
                        raise RequestError("guided_decoding_guide_type: this orchestrator compiles no guides",
                                           "serve a release whose orchestrator ships its tokenizer")
                    guide = await asyncio.to_thread(self.guides, spec, generation.end_id)
                    if self.settings.engine_guides:  # compiled here to refuse a bad guide; the target applies it
                        generation.engine_guide = await asyncio.to_thread(engine_guide, spec)
                        generation.target_only_chunk = None
                    else:
                        generation.guide = guide
            unfinished = len(rows)

            def report(row: OrchestratorRowProgress) -> None:
                """After each round of a row: its response when one is due, the last one final (and counted
                before it goes, so a client reading the metrics next finds its request there)."""
                nonlocal unfinished
                unfinished -= row.finished
                if row.finished:
                    self.metrics.observe_latencies(arrival_ns=arrival_ns, scheduled_ns=row.scheduled_ns,
                                                   first_token_ns=row.first_token_ns, last_token_ns=row.last_token_ns,
                                                   output_tokens=row.tokens)
                if not unfinished and any(item.finish_reason == TIME_LIMIT for item in rows):
                    self.metrics.count("timed_out")
                    self.log.log_info("orchestrator: a request reached its time limit; stopped after its round")
                if row.has_news:
                    exchange.send(row.response(arrival_ns), final=not unfinished)

            tasks = [asyncio.create_task(self._run_row(row, exchange, started, report)) for row in rows]
            try:
                await asyncio.gather(*tasks)
            finally:  # one failed or cancelled row ends the request: stop the others' work too
                for task in tasks:
                    task.cancel()
        except RequestCancelled:
            self.metrics.count("cancelled")
            self.log.log_info("orchestrator: the client cancelled a request; its work stopped")
            exchange.send_cancelled()
        except (RequestError, ValueError) as exc:
            self.metrics.count("errors")
            exchange.send_error(f"orchestrator: {exc}")
        except Exception as exc:  # noqa: BLE001 - an engine failure must end this request, never the model
            self.metrics.count("errors")
            self.log.log_error(f"orchestrator: request failed: {exc!r}")
            exchange.send_error(f"orchestrator: {exc}")

    async def _run_row(self, row: OrchestratorRowProgress, exchange: Exchange, started: float,
                       report: Callable[[OrchestratorRowProgress], None]) -> None:
        """Run one row to its end, its time limit, or the client's cancellation (raised after the round that
        sees it: a client that went away stops costing engine time within one round)."""
        settings = self.settings
        generation, limit = row.row.generation, row.row.max_seconds
        schedule = settings.load_schedule
        row.scheduled_ns = time.time_ns()
        if self.capture is not None:
            self.capture.start(row)
        drafts = draft_sources(generation, self.draft, max_draft_len=settings.max_draft_len, stats=row.stats,
                               health=self.health,
                               lookup_draft_fallback=settings.lookup_draft_fallback, on_failure=self._draft_failed,
                               costs=self.costs, draft_window=settings.draft_max_seq_len,
                               draft_context=settings.draft_context or None)
        self._rows_running += 1
        try:
            async for step in speculate(generation, self.target, drafts, stats=row.stats,
                                        load_cap=lambda: schedule.cap(self.metrics.requests_in_flight),
                                        costs=self.costs):
                if exchange.cancelled():
                    raise RequestCancelled
                late = limit is not None and self.clock() - started >= limit
                row.add(step.tokens, time.time_ns(), step.finish_reason or (TIME_LIMIT if late else None),
                        step.drafted, step.accepted)
                if row.finished:  # counted, and captured, before its last response goes
                    self.metrics.record(row.stats, row.tokens)
                    if self.capture is not None and row.rounds is not None:
                        self.capture.write(row)
                report(row)
                if row.finished:
                    return
        finally:
            self._rows_running -= 1
            if not row.finished:  # cancelled or failed: its work so far still counts
                self.metrics.record(row.stats, row.tokens)

    def _draft_failed(self, exc: Exception) -> None:
        self.log.log_warn(f"orchestrator: draft model failed ({exc}); continuing with the target alone")
