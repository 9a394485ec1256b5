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
draft model leaves requests to the target alone (exact) for a while. How a request is served is
:class:`specbuild.triton_models.request_runner.RequestRunner`'s (its rows, deadlines, cancellation and responses),
its rows parsed by :mod:`specbuild.triton_models.orchestrator_requests` and its engine calls encoded by
:mod:`specbuild.triton_models.engine_io` (pure, unit-tested); this file joins them to Triton: requests, responses
and BLS calls; finished rows are captured where the release captures (:mod:`.request_capture`). Parameters:
:class:`specbuild.package.contract.OrchestratorParameters`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncio  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.package.contract import ORCHESTRATOR_INPUTS, OrchestratorParameters  # noqa: E402
from specbuild.speculation.engine_call import EngineOutput, EngineRequest  # noqa: E402
from specbuild.speculation.guide import ReleaseGuides  # noqa: E402
from specbuild.triton_models.model_io import (  # noqa: E402
    FINAL,
    model_dir,
    model_parameters,
    request_arrays,
    response,
    send_cancelled,
    send_error,
)
from specbuild.triton_models.engine_io import decode_output, encode_request  # noqa: E402
from specbuild.triton_models.metrics import Metrics  # noqa: E402
from specbuild.triton_models.request_capture import capture_for  # noqa: E402
from specbuild.triton_models.request_runner import RequestRunner  # noqa: E402


class EngineCallError(RuntimeError):
    """An engine model returned an error (its message is kept)."""


class TritonExchange:
    """A Triton request as the request runner's :class:`~specbuild.triton_models.request_runner.Exchange`."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.sender = request.get_response_sender()

    def arrays(self) -> dict[str, np.ndarray | None]:
        return request_arrays(self.request, ORCHESTRATOR_INPUTS)

    def cancelled(self) -> bool:
        return self.request.is_cancelled()

    def send(self, arrays: Mapping[str, np.ndarray], *, final: bool) -> None:
        self.sender.send(response(dict(arrays)), flags=FINAL if final else 0)

    def send_error(self, message: str) -> None:
        send_error(self.sender, message)

    def send_cancelled(self) -> None:
        send_cancelled(self.sender)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.settings = OrchestratorParameters.from_parameters(model_parameters(args))
        guided = self.settings.guided_decoding or self.settings.engine_guides
        guides = ReleaseGuides(model_dir(args) / "tokenizer", self.settings.vocab_size)  # the release's tokenizer
        metrics = Metrics(args["model_name"])
        capture = capture_for(self.settings, Path(args["model_repository"]).resolve().parent,
                              args["model_instance_name"], metrics, pb_utils.Logger.log_warn)
        if capture is not None:  # where, never what: captured data stays out of the log
            pb_utils.Logger.log_info(f"orchestrator: capturing finished requests (token ids) to "
                                     f"{capture.writer.store}, except those sent with store=false")
        self.runner = RequestRunner(self.settings, self._target, self._draft, metrics, pb_utils.Logger,
                                    guides=guides if guided else None, capture=capture)

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

    # -- requests ---------------------------------------------------------------------------------
    async def execute(self, requests: list[Any]) -> None:
        await asyncio.gather(*(self.runner.serve(TritonExchange(request)) for request in requests))
        return None
