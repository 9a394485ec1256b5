"""Triton model ``orchestrator``: the speculative loop as a decoupled, async BLS model.

Each request (each row of a batched request) runs :func:`specbuild.speculation.loop.speculate` with the
``draft`` and ``target`` engine models called through BLS, so many requests are in flight at once. Streaming
sends one response per round with the tokens accepted in it; otherwise one response at the end. Every
response carries the acceptance figures so far, and the Prometheus counters of
:mod:`specbuild.speculation.stats` are exported through the python backend's metrics API. Drafts come from
:func:`specbuild.speculation.drafting.draft_sources` (prompt lookup, the draft model, or both); a failing
draft model leaves requests to the target alone (exact) for a while. The request handling itself is in
:mod:`specbuild.serve.orchestration` and :mod:`specbuild.serve.engine_io` (pure, unit-tested); this file
only moves tensors. Parameters: :class:`specbuild.package.contract.OrchestratorParameters`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncio  # noqa: E402
from typing import Any  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.contract import ORCHESTRATOR_INPUTS, OrchestratorParameters  # noqa: E402
from specbuild.serve.engine_io import decode_output, encode_request  # noqa: E402
from specbuild.serve.orchestration import RowRequest, parse_rows, response_arrays  # noqa: E402
from specbuild.serve.triton_models.common import (  # noqa: E402
    FINAL,
    model_parameters,
    request_arrays,
    response,
    send_cancelled,
    send_error,
)
from specbuild.serve.triton_models.metrics import Metrics  # noqa: E402
from specbuild.speculation.drafting import DraftHealth, draft_sources  # noqa: E402
from specbuild.speculation.engine import EngineOutput, EngineRequest  # noqa: E402
from specbuild.speculation.loop import speculate  # noqa: E402
from specbuild.speculation.stats import SpeculationStats  # noqa: E402



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
        try:
            rows = parse_rows(request_arrays(request, ORCHESTRATOR_INPUTS), self.settings)
            if any(row.stream for row in rows):
                await self._stream(request, sender, rows)
            else:
                await self._complete(request, sender, rows)
        except (RequestError, ValueError) as exc:
            self.metrics.count("errors")
            send_error(sender, f"orchestrator: {exc}")
        except Exception as exc:  # noqa: BLE001 - an engine failure must end this request, never the model
            self.metrics.count("errors")
            self.logger.log_error(f"orchestrator: request failed: {exc!r}")
            send_error(sender, f"orchestrator: {exc}")

    async def _run_row(self, row: RowRequest, stats: SpeculationStats, request: Any, collected: list[int],
                       on_round: Any = None) -> None:
        """Run one row to the end (or until the client cancels), appending its tokens to ``collected``."""
        settings = self.settings
        drafts = draft_sources(row.generation, self._draft, stats=stats, health=self.draft_health,
                               lookup_draft_fallback=settings.lookup_draft_fallback, on_failure=self._draft_failed)
        async for step in speculate(row.generation, self._target, drafts, max_draft_len=settings.max_draft_len,
                                    stats=stats):
            collected.extend(step.tokens)
            if on_round is not None:
                on_round()
            if request.is_cancelled():
                break
        self.metrics.record(stats, len(collected))

    async def _complete(self, request: Any, sender: Any, rows: list[RowRequest]) -> None:
        stats = [SpeculationStats() for _ in rows]
        outputs: list[list[int]] = [[] for _ in rows]
        tasks = [asyncio.create_task(self._run_row(row, st, request, out))
                 for row, st, out in zip(rows, stats, outputs)]
        try:
            await asyncio.gather(*tasks)
        finally:  # one failed row fails the request: stop the others' work too
            for task in tasks:
                task.cancel()
        texts = [(row.generation.prompt_ids if not row.exclude_input else []) + out for row, out in zip(rows, outputs)]
        sender.send(response(response_arrays(texts, [0] * len(rows), True, stats, [len(o) for o in outputs])),
                    flags=FINAL)

    async def _stream(self, request: Any, sender: Any, rows: list[RowRequest]) -> None:
        """One response per round (of any row) carrying every row's tokens so far and how many were sent."""
        stats = [SpeculationStats() for _ in rows]
        generated: list[list[int]] = [[] for _ in rows]
        sent = [0] * len(rows)
        events: asyncio.Queue[BaseException | None] = asyncio.Queue()

        async def run(index: int) -> None:
            try:
                await self._run_row(rows[index], stats[index], request, generated[index],
                                    on_round=lambda: events.put_nowait(None))
            except BaseException as exc:  # noqa: BLE001 - handed to the sending loop below
                events.put_nowait(exc)
                return
            finished.add(index)
            events.put_nowait(None)

        finished: set[int] = set()
        tasks = [asyncio.create_task(run(index)) for index in range(len(rows))]
        try:
            while True:
                pending = [await events.get()]
                while not events.empty():
                    pending.append(events.get_nowait())
                for event in pending:
                    if event is not None:
                        raise event
                if request.is_cancelled():
                    self.logger.log_info("orchestrator: client cancelled a streamed request; stopping its work")
                    self.metrics.count("cancelled")
                    send_cancelled(sender)
                    return
                done = len(finished) == len(rows)
                if done or any(len(g) > n for g, n in zip(generated, sent)):
                    snapshot = [list(g) for g in generated]
                    sender.send(response(response_arrays(snapshot, list(sent), done, stats,
                                                         [len(g) for g in snapshot])),
                                flags=FINAL if done else 0)
                    sent = [len(g) for g in snapshot]
                if done:
                    return
        finally:
            for task in tasks:
                task.cancel()
