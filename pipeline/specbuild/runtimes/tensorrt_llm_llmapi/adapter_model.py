"""Triton model ``llmapi_adapter``: specbuild's public interface in front of TensorRT-LLM's LLM-API model.

The ensemble of a ``tensorrt-llm-llmapi`` release routes the public inputs here unchanged; this decoupled model
turns each row into a request to the ``tensorrt_llm`` model (BLS, decoupled), whose draft-target speculation runs
inside TensorRT-LLM, and answers each row with the public outputs (one response per row and round, ``batch_index``
naming it, as the orchestrator answers): the text (as deltas when streamed, the LLM API sending the whole text each
time), the acceptance figures TensorRT-LLM reports, timings, and the generated token count (the LLM-API model
returns text only: ``max_tokens`` when the answer ran to it, else the text re-tokenized with the target's tokenizer,
shipped under ``tokenizer/``). Its metrics (``specbuild_*``, under ``model="llmapi_adapter"``) are the request
counters, the in-flight gauge, the drafted and accepted totals TensorRT-LLM reports, the requests that outgrew
the draft's window (TensorRT-LLM stops drafting there), and the latency histograms
timed on the text the LLM-API model returns; rounds, positions, engine seconds, fallbacks and prompt lookup happen
inside TensorRT-LLM, which exports none of them. The request handling is in
:mod:`specbuild.runtimes.tensorrt_llm_llmapi.requests` and :mod:`specbuild.runtimes.tensorrt_llm_llmapi.tensors`
(pure, unit-tested); this file only moves tensors. Parameters:
:class:`specbuild.runtimes.tensorrt_llm_llmapi.contract.LLMAPIAdapterParameters`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncio  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.contract import ENSEMBLE_INPUTS  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.contract import ADAPTER_WANTS, LLMAPIAdapterParameters  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.tensors import decode_answer, encode_request  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.requests import (  # noqa: E402
    AdapterRowProgress,
    parse_adapter_rows,
    past_draft_window,
    templated,
)
from specbuild.triton_models.model_io import (  # noqa: E402
    FINAL,
    model_dir,
    model_parameters,
    request_arrays,
    response,
    send_cancelled,
    send_error,
)
from specbuild.triton_models.metrics import Metrics  # noqa: E402
from specbuild.triton_models.request_parameters import refuse_parameters  # noqa: E402
from specbuild.speculation.stats import SpeculationStats  # noqa: E402



# The rows one adapter instance streams from the LLM-API model at once: each holds a worker thread from its BLS call
# to its last answer (the synchronous iterator blocks between answers); a row beyond them waits for a free worker,
# queued, never refused. 64 is eight times limits.max_batch_size's default (8): rows beyond the LLM-API model's own
# batch wait inside TensorRT-LLM anyway, so only a release built for batches above 64 queues rows here first.
BLS_WORKERS = 64


class LLMAPIError(RuntimeError):
    """The LLM-API model answered with an error (its message is kept)."""


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        self.settings = LLMAPIAdapterParameters.from_parameters(model_parameters(args))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args) / "tokenizer"), trust_remote_code=False)
        self.metrics = Metrics(args["model_name"])
        self.logger = pb_utils.Logger
        # The synchronous BLS call, never async_exec(decoupled=True): python_backend's async_exec callback captures
        # the stub by reference and dereferences it on the executor thread for decoupled calls (src/pb_stub.cc), a
        # use-after-free fixed only in r26.07 (python_backend PR #439), after the 26.04-26.06 images.
        self.bls = ThreadPoolExecutor(max_workers=BLS_WORKERS, thread_name_prefix="llmapi-bls")

    def finalize(self) -> None:
        self.bls.shutdown(wait=False, cancel_futures=True)

    async def execute(self, requests: list[Any]) -> None:
        await asyncio.gather(*(self._serve(request) for request in requests))
        return None

    async def _serve(self, request: Any) -> None:
        """Answer one request, one response per row and round (``batch_index``); its last responses go out after
        the counters and the gauge are updated, so a client that reads the metrics next finds its request there."""
        sender = request.get_response_sender()
        arrival_ns = time.time_ns()
        self.metrics.in_flight(+1)
        last: Any = None  # the final responses, or an error message
        try:
            refuse_parameters(request.parameters(), (tensor.name for tensor in ENSEMBLE_INPUTS))  # its ensemble's first
            rows = [templated(row, self.tokenizer)
                    for row in parse_adapter_rows(request_arrays(request, ENSEMBLE_INPUTS), self.settings)]
            progress = [AdapterRowProgress(index, row=row, prompt_tokens=len(self.tokenizer.encode(row.llm.prompt)))
                        for index, row in enumerate(rows)]
            texts = await self._answer(request, sender, progress, arrival_ns)
            if texts is None:
                self.metrics.count("cancelled")
            else:
                self._record(progress, arrival_ns)
                last = [response(item.response(text, arrival_ns)) for item, text in zip(progress, texts)]
        except Exception as exc:  # noqa: BLE001 - a bad or failed request must end, never the model
            self.metrics.count("errors")
            if not isinstance(exc, RequestError):
                self.logger.log_error(f"llmapi_adapter: request failed: {exc!r}")
            last = f"llmapi_adapter: {exc}"
        finally:
            self.metrics.in_flight(-1)
        if last is None:
            send_cancelled(sender)
        elif isinstance(last, str):
            send_error(sender, last)
        else:
            for index, answer in enumerate(last):
                sender.send(answer, flags=FINAL if index == len(last) - 1 else 0)

    def _record(self, progress: list[AdapterRowProgress], arrival_ns: int) -> None:
        """The counters, and each row's latencies (its first and last text from the LLM-API model)."""
        stats = SpeculationStats()
        for item in progress:
            self.metrics.observe_latencies(arrival_ns=arrival_ns, scheduled_ns=item.scheduled_ns,
                                           first_token_ns=item.first_token_ns, last_token_ns=item.last_token_ns,
                                           output_tokens=item.tokens)
            answer = item.answer
            stats.drafted_tokens += (answer and answer.total_draft_tokens) or 0
            stats.accepted_tokens += (answer and answer.total_accepted_draft_tokens) or 0
            stats.draft_window += past_draft_window(item, self.settings)
        self.metrics.record(stats, sum(item.tokens for item in progress))

    async def _answer(self, request: Any, sender: Any, progress: list[AdapterRowProgress],
                      arrival_ns: int) -> list[str] | None:
        """Run every row; streamed, a response whenever a row has new text. Returns each row's last text (the rest
        of a stream, else the whole answer), or None when the client cancelled. A row past its time limit ends
        with the text so far (its generation cancelled), as the orchestrator ends it."""
        stream = any(item.row.stream for item in progress)
        events: asyncio.Queue[BaseException | None] = asyncio.Queue()
        tasks = [asyncio.create_task(self._run_row(item, events)) for item in progress]
        limits = [item.row.max_seconds for item in progress if item.row.max_seconds is not None]
        deadline = time.monotonic() + min(limits) if limits else None
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), None if deadline is None
                                                   else max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    self.metrics.count("timed_out")
                    for item in progress:
                        item.finished = True
                    event = None
                if event is not None:
                    raise event
                if request.is_cancelled():
                    return None
                if all(item.finished for item in progress):
                    return [(item.row.echo if item.row.include_prompt and not stream else "")
                            + item.take_new_text() for item in progress]
                if stream:
                    for item in progress:
                        if text := item.take_new_text():
                            sender.send(response(item.response(text, arrival_ns)))
        finally:
            for task in tasks:
                task.cancel()

    async def _run_row(self, item: AdapterRowProgress, events: asyncio.Queue[BaseException | None]) -> None:
        """Ask the LLM-API model for one row, recording each of its answers in ``item``; an event per answer."""
        answers = None
        item.scheduled_ns = time.time_ns()
        loop = asyncio.get_running_loop()
        call = None
        try:
            inputs = [pb_utils.Tensor(name, value) for name, value in encode_request(item.row.llm).items()]
            bls = pb_utils.InferenceRequest(model_name=self.settings.llmapi_model,
                                            requested_output_names=list(ADAPTER_WANTS), inputs=inputs)
            call = loop.run_in_executor(self.bls, functools.partial(bls.exec, decoupled=True))
            answers = await asyncio.shield(call)  # a cancel here leaves the call to finish: its answers get cancelled
            while True:  # the iterator blocks until the next answer: wait for it on a worker, off the event loop
                answer = await loop.run_in_executor(self.bls, next, answers, None)
                if answer is None:
                    break
                if answer.has_error():
                    raise LLMAPIError(answer.error().message())
                arrays = {name: tensor.as_numpy() for name in ADAPTER_WANTS
                          if (tensor := pb_utils.get_output_tensor_by_name(answer, name)) is not None}
                if arrays:  # the final answer may come empty
                    item.update(decode_answer(arrays), time.time_ns())
                    self._count(item)
                    events.put_nowait(None)
                if item.finished:  # a stop word ended it: stop the generation
                    answers.cancel()
                    break
            item.finished = True
            self._count(item)
            events.put_nowait(None)
        except asyncio.CancelledError:  # the client went away, or another row failed: stop the generation too
            if answers is not None:
                answers.cancel()
            elif call is not None:  # cancelled while the call was being sent: cancel what it returns
                call.add_done_callback(_cancel_answers)
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the sending loop
            events.put_nowait(exc)

    def _count(self, item: AdapterRowProgress) -> None:
        """output_token_count: ``max_tokens`` for an answer that ran to it, else the text re-tokenized (the
        LLM-API model returns no token ids; re-tokenizing may merge what was generated as several tokens)."""
        answer = item.answer
        if item.finished and answer is not None and answer.finish_reason == "length":
            item.tokens = item.row.llm.max_tokens
        else:
            item.tokens = len(self.tokenizer.encode(item.generated(), add_special_tokens=False))


def _cancel_answers(call: asyncio.Future) -> None:
    """Cancel the generation a BLS call started, once it returns (a call that failed started none)."""
    if not call.cancelled() and call.exception() is None:
        call.result().cancel()
