"""Triton model ``orchestrator``: the speculative loop as a decoupled, async BLS model.

Each row of a request runs :func:`specbuild.speculation.loop.speculate` with the ``draft`` and ``target`` engine
models called through BLS, so many requests are in flight at once. Each response is about one row
(``batch_index``), as NVIDIA's backend answers: a streamed row sends the tokens accepted in each round, a
non-streamed one its whole answer when it ends; the request's last response is final. Every response carries
the row's acceptance figures and timings so far, and the Prometheus metrics of
:mod:`specbuild.speculation.stats` (counters, the in-flight gauge, each finished row's latencies) are exported
through the python backend's metrics API. A row stops after
the round in which its client cancels (seen when the model is called directly: an ensemble does not pass
cancellation on to a step already running) or its time limit passes (``max_time`` within the parameter
``max_request_seconds``, which also ends requests nobody waits for). Drafts come from
:func:`specbuild.speculation.drafting.draft_sources` (prompt lookup, the draft model, or both); a failing
draft model leaves requests to the target alone (exact) for a while. The request handling itself is in
:mod:`specbuild.triton_models.orchestration` and :mod:`specbuild.triton_models.engine_io` (pure, unit-tested); this file
only moves tensors. Parameters: :class:`specbuild.package.contract.OrchestratorParameters`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncio  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.contract import ORCHESTRATOR_INPUTS, OrchestratorParameters  # noqa: E402
from specbuild.triton_models.engine_io import decode_output, encode_request  # noqa: E402
from specbuild.triton_models.orchestration import RowProgress, parse_rows  # noqa: E402
from specbuild.triton_models.common import (  # noqa: E402
    FINAL,
    model_parameters,
    request_arrays,
    response,
    send_cancelled,
    send_error,
)
from specbuild.triton_models.metrics import Metrics  # noqa: E402
from specbuild.speculation.drafting import DraftHealth, draft_sources  # noqa: E402
from specbuild.speculation.engine import EngineOutput, EngineRequest  # noqa: E402
from specbuild.speculation.loop import speculate  # noqa: E402

TIME_LIMIT = "time"  # a row's finish reason when its time limit ends it


class RequestCancelled(Exception):
    """The client cancelled the request (or went away)."""


class EngineCallError(RuntimeError):
    """An engine model returned an error (its message is kept)."""


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.settings = OrchestratorParameters.from_parameters(model_parameters(args))
        self.metrics = Metrics(args["model_name"])
        self.logger = pb_utils.Logger
        self.draft_health = DraftHealth()

    # -- engine calls through BLS -----------------------------------------------------------------
    async def _call(self, model: str, request: EngineRequest) -> EngineOutput:
        outputs = ["output_ids", "sequence_length"] + (["generation_logits"] if request.return_logits else [])
        inputs = [pb_utils.Tensor(name, value) for name, value in encode_request(request).items()]
        bls = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=inputs)
        answer = await bls.async_exec()
        if answer.has_error():
            raise EngineCallError(answer.error().message())
        arrays = {name: pb_utils.get_output_tensor_by_name(answer, name) for name in outputs}
        return decode_output({name: None if t is None else t.as_numpy() for name, t in arrays.items()}, request,
                             fast_logits=self.settings.fast_logits)

    async def _target(self, request: EngineRequest) -> EngineOutput:
        return await self._call(self.settings.target_model, request)

    async def _draft(self, request: EngineRequest) -> EngineOutput:
        return await self._call(self.settings.draft_model, request)

    def _draft_failed(self, exc: Exception) -> None:
        self.logger.log_warn(f"orchestrator: draft model failed ({exc}); continuing with the target alone")

    # -- requests ---------------------------------------------------------------------------------
    async def execute(self, requests: list[Any]) -> None:
        await asyncio.gather(*(self._serve_counted(request) for request in requests))
        return None

    async def _serve_counted(self, request: Any) -> None:
        self.metrics.in_flight(+1)
        try:
            await self._serve(request)
        finally:
            self.metrics.in_flight(-1)

    async def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        arrival_ns, started = time.time_ns(), time.monotonic()
        try:
            rows = [RowProgress(index, row) for index, row in
                    enumerate(parse_rows(request_arrays(request, ORCHESTRATOR_INPUTS), self.settings))]
            unfinished = len(rows)

            def report(row: RowProgress) -> None:
                """After each round of a row: its response when one is due, the last one final (and counted
                before it goes, so a client reading the metrics next finds its request there)."""
                nonlocal unfinished
                unfinished -= row.finished
                if row.finished:
                    self.metrics.observe_latencies(arrival_ns=arrival_ns, scheduled_ns=row.scheduled_ns,
                                                   first_token_ns=row.first_token_ns,
                                                   last_token_ns=row.last_token_ns, output_tokens=len(row.tokens))
                if not unfinished and any(item.finish_reason == TIME_LIMIT for item in rows):
                    self.metrics.count("timed_out")
                    self.logger.log_info("orchestrator: a request reached its time limit; stopped after its round")
                if row.has_news:
                    sender.send(response(row.response(arrival_ns)), flags=0 if unfinished else FINAL)

            tasks = [asyncio.create_task(self._run_row(row, request, started, report)) for row in rows]
            try:
                await asyncio.gather(*tasks)
            finally:  # one failed or cancelled row ends the request: stop the others' work too
                for task in tasks:
                    task.cancel()
        except RequestCancelled:
            self.metrics.count("cancelled")
            self.logger.log_info("orchestrator: the client cancelled a request; its work stopped")
            send_cancelled(sender)
        except (RequestError, ValueError) as exc:
            self.metrics.count("errors")
            send_error(sender, f"orchestrator: {exc}")
        except Exception as exc:  # noqa: BLE001 - an engine failure must end this request, never the model
            self.metrics.count("errors")
            self.logger.log_error(f"orchestrator: request failed: {exc!r}")
            send_error(sender, f"orchestrator: {exc}")

    async def _run_row(self, row: RowProgress, request: Any, started: float,
                       report: Callable[[RowProgress], None]) -> None:
        """Run one row to its end, its time limit, or the client's cancellation (raised after the round that
        sees it: a client that went away stops costing engine time within one round)."""
        settings = self.settings
        generation, limit = row.row.generation, row.row.max_seconds
        row.scheduled_ns = time.time_ns()
        drafts = draft_sources(generation, self._draft, stats=row.stats, health=self.draft_health,
                               lookup_draft_fallback=settings.lookup_draft_fallback, on_failure=self._draft_failed)
        try:
            async for step in speculate(generation, self._target, drafts, max_draft_len=settings.max_draft_len,
                                        stats=row.stats,
                                        busy=lambda: settings.busy(self.metrics.requests_in_flight)):
                if request.is_cancelled():
                    raise RequestCancelled
                late = limit is not None and time.monotonic() - started >= limit
                row.add(step.tokens, time.time_ns(), step.finish_reason or (TIME_LIMIT if late else None))
                if row.finished:  # counted before its last response goes
                    self.metrics.record(row.stats, len(row.tokens))
                report(row)
                if row.finished:
                    return
        finally:
            if not row.finished:  # cancelled or failed: its work so far still counts
                self.metrics.record(row.stats, len(row.tokens))
