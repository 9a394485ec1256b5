"""Triton model ``orchestrator``: the speculative loop as a decoupled, async BLS model.

Each request (each row of a batched request) runs :func:`specbuild.speculation.loop.speculate` with the ``draft``
and ``target`` engine models called through BLS, so many requests are in flight at once. Streaming sends
one response per round with the tokens accepted in it; otherwise one response at the end. Every response
carries the acceptance figures so far. Acceptance metrics are exported as Prometheus counters through the
python backend's metrics API. If the draft fails or is unloaded, requests fall back to the target alone
(exact) and ``specbuild_draft_fallbacks_total`` counts it. After a draft failure, new requests skip the
draft for ``DRAFT_RETRY_SECONDS`` (a dead draft stub makes every call wait for its failure), then try it again.
With prompt lookup on, each round first looks for its draft in the request's own tokens (no model call;
the same for both runtimes, since the target takes external draft tokens), and the ``specbuild_prompt_lookup_*``
counters count what it drafted and what of that was accepted.

Parameters: ``max_draft_len``, ``num_draft_tokens`` (default K), ``use_draft_logits``, ``adaptive_draft``,
``prompt_lookup`` (default for requests), ``lookup_max_ngram``, ``lookup_min_ngram``, ``lookup_draft_fallback``,
``max_input_len``, ``max_seq_len``, ``vocab_size`` (the target's), ``target_model``, ``draft_model``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from specbuild.package.contract import DRAFT_MODEL, TARGET_MODEL
from specbuild.speculation.loop import GenerationRequest, SpeculationStats, speculate
from specbuild.errors import RequestError, SpecError
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.rules import SamplingParams
from specbuild.serve.text import decode_word_list, pad_rows
from specbuild.speculation.torch_engine import EngineOutput, EngineRequest
from specbuild.serve.triton_models.common import model_parameters, optional_input, required_input, row_scalar, tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
DRAFT_RETRY_SECONDS = 5.0


class EngineCallError(RuntimeError):
    """An engine model returned an error (its message is kept)."""


@dataclass
class Settings:
    max_draft_len: int
    num_draft_tokens: int
    use_draft_logits: bool
    adaptive_draft: bool
    prompt_lookup: bool
    lookup: PromptLookup
    lookup_draft_fallback: bool  # with lookup on: call the draft model when lookup finds nothing
    vocab_size: int | None
    max_input_len: int
    max_seq_len: int
    target_model: str
    draft_model: str

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> Settings:
        return cls(
            max_draft_len=int(parameters["max_draft_len"]),
            num_draft_tokens=int(parameters["num_draft_tokens"]),
            use_draft_logits=parameters["use_draft_logits"] == "true",
            adaptive_draft=parameters.get("adaptive_draft", "false") == "true",
            prompt_lookup=parameters.get("prompt_lookup", "false") == "true",
            lookup=lookup_settings(parameters),
            lookup_draft_fallback=parameters.get("lookup_draft_fallback", "true") == "true",
            vocab_size=int(parameters["vocab_size"]) if "vocab_size" in parameters else None,
            max_input_len=int(parameters["max_input_len"]),
            max_seq_len=int(parameters["max_seq_len"]),
            target_model=parameters.get("target_model", TARGET_MODEL),
            draft_model=parameters.get("draft_model", DRAFT_MODEL),
        )


def lookup_settings(parameters: dict[str, str]) -> PromptLookup:
    """The n-gram sizes of prompt lookup from the model's parameters, checked (the model fails to load if bad)."""
    try:
        return PromptLookup(max_ngram=int(parameters.get("lookup_max_ngram", 4)),
                            min_ngram=int(parameters.get("lookup_min_ngram", 2)))
    except ValueError as exc:
        raise SpecError(f"orchestrator parameters lookup_max_ngram/lookup_min_ngram: {exc}",
                        "set speculation.prompt_lookup.max_ngram >= min_ngram >= 1 in the spec and "
                        "re-package (specbuild package)") from None


@dataclass
class RowRequest:
    generation: GenerationRequest
    prompt_ids: list[int]
    stream: bool
    exclude_input: bool


class Metrics:
    """Prometheus counters on Triton's metrics endpoint (names follow vLLM's ``spec_decode`` ones)."""

    def __init__(self, model_name: str) -> None:
        counter = pb_utils.MetricFamily.COUNTER

        def family(name: str, description: str) -> Any:
            return pb_utils.MetricFamily(name=name, description=description, kind=counter)

        self._families = {
            "requests": family("specbuild_requests_total", "Generation requests finished by the orchestrator"),
            "output_tokens": family("specbuild_output_tokens_total", "Tokens generated"),
            "rounds": family("specbuild_spec_decode_rounds_total", "Target calls (speculative rounds)"),
            "drafts": family("specbuild_spec_decode_num_drafts_total", "Rounds with at least one draft token"),
            "draft_tokens": family("specbuild_spec_decode_num_draft_tokens_total", "Draft tokens proposed"),
            "accepted": family("specbuild_spec_decode_num_accepted_tokens_total", "Draft tokens accepted"),
            "accepted_per_position": family("specbuild_spec_decode_num_accepted_tokens_per_pos_total",
                                            "Draft tokens accepted, by position in the draft"),
            "drafted_per_position": family("specbuild_spec_decode_num_draft_tokens_per_pos_total",
                                           "Draft tokens proposed, by position in the draft"),
            "draft_seconds": family("specbuild_draft_seconds_total", "Time spent in draft calls"),
            "target_seconds": family("specbuild_target_seconds_total", "Time spent in target calls"),
            "fallbacks": family("specbuild_draft_fallbacks_total",
                                "Requests that fell back to the target alone because the draft failed"),
            "lookup_drafts": family("specbuild_prompt_lookup_drafts_total", "Rounds drafted by prompt lookup"),
            "lookup_draft_tokens": family("specbuild_prompt_lookup_draft_tokens_total",
                                          "Draft tokens proposed by prompt lookup"),
            "lookup_accepted": family("specbuild_prompt_lookup_accepted_tokens_total",
                                      "Draft tokens proposed by prompt lookup and accepted"),
            "errors": family("specbuild_request_errors_total", "Requests rejected or failed"),
        }
        self._labels = {"model": model_name}
        self._metrics = {key: fam.Metric(labels=self._labels) for key, fam in self._families.items()
                         if not key.endswith("_per_position")}
        self._per_position: dict[tuple[str, int], Any] = {}

    def count(self, key: str, value: float = 1.0) -> None:
        if value:
            self._metrics[key].increment(value)

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        self.count("requests")
        self.count("output_tokens", output_tokens)
        self.count("rounds", stats.rounds)
        self.count("drafts", stats.drafts)
        self.count("draft_tokens", stats.drafted_tokens)
        self.count("accepted", stats.accepted_tokens)
        self.count("draft_seconds", stats.draft_seconds)
        self.count("target_seconds", stats.target_seconds)
        self.count("fallbacks", stats.fallbacks)
        self.count("lookup_drafts", stats.lookup_drafts)
        self.count("lookup_draft_tokens", stats.lookup_drafted_tokens)
        self.count("lookup_accepted", stats.lookup_accepted_tokens)
        for key, counts in (("accepted_per_position", stats.accepted_per_position),
                            ("drafted_per_position", stats.drafted_per_position)):
            for position, count in enumerate(counts):
                if (key, position) not in self._per_position:
                    labels = dict(self._labels, position=str(position))
                    self._per_position[key, position] = self._families[key].Metric(labels=labels)
                if count:
                    self._per_position[key, position].increment(count)


def _sampling_inputs(params: SamplingParams) -> list[Any]:
    if params.is_greedy:
        return [tensor("runtime_top_k", np.array([[1]], dtype=np.int32))]
    return [
        tensor("temperature", np.array([[params.temperature]], dtype=np.float32)),
        tensor("runtime_top_k", np.array([[params.top_k]], dtype=np.int32)),
        tensor("runtime_top_p", np.array([[params.top_p]], dtype=np.float32)),
    ]


def engine_inputs(request: EngineRequest) -> list[Any]:
    """An :class:`EngineRequest` as the ``tensorrtllm`` backend's input tensors (batch of one)."""
    from specbuild.serve.text import encode_word_list

    inputs = [
        tensor("input_ids", np.array([request.input_ids], dtype=np.int32)),
        tensor("input_lengths", np.array([[len(request.input_ids)]], dtype=np.int32)),
        tensor("request_output_len", np.array([[request.max_new_tokens]], dtype=np.int32)),
        tensor("exclude_input_in_output", np.array([[True]], dtype=bool)),
        tensor("streaming", np.array([[False]], dtype=bool)),
        *_sampling_inputs(request.sampling),
    ]
    if request.end_id is not None:
        inputs.append(tensor("end_id", np.array([[request.end_id]], dtype=np.int32)))
        inputs.append(tensor("pad_id", np.array([[request.end_id]], dtype=np.int32)))
    if request.seed is not None:
        inputs.append(tensor("random_seed", np.array([[request.seed]], dtype=np.uint64)))
    if request.bad_words:
        inputs.append(tensor("bad_words_list", encode_word_list(request.bad_words)[None]))
    if request.draft_tokens:
        inputs.append(tensor("draft_input_ids", np.array([request.draft_tokens], dtype=np.int32)))
    if request.draft_logits is not None:
        inputs.append(tensor("draft_logits", request.draft_logits.numpy().astype(np.float32)[None]))
    if request.return_logits:
        inputs.append(tensor("return_generation_logits", np.array([[True]], dtype=bool)))
    return inputs


def engine_output(response: Any, request: EngineRequest) -> EngineOutput:
    """Generated tokens (and logits) from an engine response, whether or not it echoed the input."""
    if response.has_error():
        raise EngineCallError(response.error().message())
    ids = pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy().reshape(-1)
    length = int(pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy().reshape(-1)[0])
    tokens = ids[:length].tolist()
    if length > request.max_new_tokens:  # the engine returned input + output
        tokens = tokens[len(request.input_ids):]
    logits = None
    if request.return_logits:
        raw = pb_utils.get_output_tensor_by_name(response, "generation_logits")
        if raw is not None:
            array = raw.as_numpy()
            logits = torch.from_numpy(array.reshape(-1, array.shape[-1]).astype(np.float32))[: len(tokens)]
    return EngineOutput(tokens, logits)


def _end_id(value: Any) -> int | None:
    """A negative end id means "never stop on a token", as in TensorRT-LLM."""
    return None if value is None or int(value) < 0 else int(value)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.settings = Settings.from_parameters(model_parameters(args))
        self.metrics = Metrics(args["model_name"])
        self.logger = pb_utils.Logger
        self._draft_down_until = 0.0  # time.monotonic() before which requests do not call the draft

    # -- engine calls through BLS -----------------------------------------------------------------
    async def _call(self, model: str, request: EngineRequest) -> EngineOutput:
        outputs = ["output_ids", "sequence_length"] + (["generation_logits"] if request.return_logits else [])
        bls = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs,
                                        inputs=engine_inputs(request))
        response = await bls.async_exec()
        return engine_output(response, request)

    async def _target(self, request: EngineRequest) -> EngineOutput:
        return await self._call(self.settings.target_model, request)

    async def _draft(self, request: EngineRequest) -> EngineOutput:
        return await self._call(self.settings.draft_model, request)

    def _draft_failed(self, exc: Exception) -> None:
        self._draft_down_until = time.monotonic() + DRAFT_RETRY_SECONDS
        self.logger.log_warn(f"orchestrator: draft model failed ({exc}); continuing with the target alone")

    # -- requests ---------------------------------------------------------------------------------
    async def execute(self, requests: list[Any]) -> None:
        await asyncio.gather(*(self._serve(request) for request in requests))
        return None

    async def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        try:
            rows = self._parse(request)
            if any(row.stream for row in rows):
                await self._stream(request, sender, rows)
            else:
                await self._complete(request, sender, rows)
        except (RequestError, ValueError) as exc:
            self.metrics.count("errors")
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"orchestrator: {exc}")), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - an engine failure must end this request, never the model
            self.metrics.count("errors")
            self.logger.log_error(f"orchestrator: request failed: {exc!r}")
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"orchestrator: {exc}")), flags=FINAL)

    def _parse(self, request: Any) -> list[RowRequest]:
        s = self.settings
        input_ids = required_input(request, "input_ids")
        lengths = required_input(request, "input_length")
        max_tokens = required_input(request, "max_tokens")
        stop_words = optional_input(request, "stop_words_ids")
        bad_words = optional_input(request, "bad_words_ids")
        fields = {name: optional_input(request, name) for name in (
            "end_id", "stream", "temperature", "top_k", "top_p", "random_seed", "exclude_input_in_output",
            "beam_width", "num_draft_tokens", "use_draft_logits", "adaptive_draft", "prompt_lookup")}
        rows = []
        for row in range(input_ids.shape[0]):
            get = lambda name, default=None: row_scalar(fields[name], row, default)  # noqa: E731
            prompt = input_ids[row].reshape(-1)[: int(row_scalar(lengths, row))].tolist()
            wanted = int(row_scalar(max_tokens, row))
            if wanted < 1:
                raise RequestError(f"max_tokens must be at least 1, got {wanted}")
            if len(prompt) + wanted > s.max_seq_len:
                raise RequestError(
                    f"prompt ({len(prompt)} tokens) + max_tokens ({wanted}) exceeds max_seq_len ({s.max_seq_len}); "
                    f"ask for at most {max(0, s.max_seq_len - len(prompt))} tokens")
            k = int(get("num_draft_tokens", s.num_draft_tokens))
            if not 0 <= k <= s.max_draft_len:
                raise RequestError(f"num_draft_tokens must be within 0..{s.max_draft_len} (the target engine's "
                                   f"max_draft_len), got {k}")
            if int(get("beam_width", 1)) != 1:
                raise RequestError("beam_width must be 1: beam search does not combine with draft-target decoding")
            try:
                sampling = SamplingParams.from_request(get("temperature"), get("top_k"), get("top_p"))
            except ValueError as exc:
                raise RequestError(str(exc)) from None
            seed = get("random_seed")
            stream = bool(get("stream", False))
            rows.append(RowRequest(
                generation=GenerationRequest(
                    prompt_ids=prompt, max_tokens=wanted, sampling=sampling,
                    seed=None if seed is None else int(seed), end_id=_end_id(get("end_id")),
                    stop_words=decode_word_list(None if stop_words is None else stop_words[row]),
                    bad_words=decode_word_list(None if bad_words is None else bad_words[row]),
                    num_draft_tokens=k,
                    use_draft_logits=bool(get("use_draft_logits", s.use_draft_logits)),
                    adaptive=bool(get("adaptive_draft", s.adaptive_draft)),
                    prompt_lookup=s.lookup if bool(get("prompt_lookup", s.prompt_lookup)) else None,
                    target_only_chunk=1 if stream else None,
                ),
                prompt_ids=prompt, stream=stream,
                exclude_input=bool(get("exclude_input_in_output", False)),
            ))
        return rows

    async def _run_row(self, row: RowRequest, stats: SpeculationStats, request: Any, collected: list[int],
                       on_round: Any = None) -> None:
        """Run one row to the end (or until the client cancels), appending its tokens to ``collected``."""
        draft = self._draft if row.generation.num_draft_tokens > 0 else None
        if row.generation.prompt_lookup is not None and not self.settings.lookup_draft_fallback:
            draft = None  # lookup only: this release's draft costs more than it brings
        if draft is not None and time.monotonic() < self._draft_down_until:
            draft = None
            stats.fallbacks += 1
        async for step in speculate(row.generation, self._target, draft, max_draft_len=self.settings.max_draft_len,
                                    stats=stats, on_draft_failure=self._draft_failed,
                                    vocab_size=self.settings.vocab_size):
            collected.extend(step.tokens)
            if on_round is not None:
                on_round()
            if request.is_cancelled():
                break
        self.metrics.record(stats, len(collected))

    def _response(self, rows: list[list[int]], skips: list[int], final: bool,
                  stats: list[SpeculationStats], counts: list[int]) -> Any:
        return pb_utils.InferenceResponse(output_tensors=[
            tensor("output_ids", pad_rows(rows, 0)),
            tensor("output_length", np.array([[len(r)] for r in rows], dtype=np.int32)),
            tensor("skip_tokens", np.array([[s] for s in skips], dtype=np.int32)),
            tensor("is_final", np.array([[final]] * len(rows), dtype=bool)),
            tensor("acceptance_rate", np.array([[s.acceptance_rate] for s in stats], dtype=np.float32)),
            tensor("total_accepted_draft_tokens", np.array([[s.accepted_tokens] for s in stats], dtype=np.int32)),
            tensor("total_draft_tokens", np.array([[s.drafted_tokens] for s in stats], dtype=np.int32)),
            tensor("output_token_count", np.array([[c] for c in counts], dtype=np.int32)),
        ])

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
        texts = [(row.prompt_ids if not row.exclude_input else []) + out for row, out in zip(rows, outputs)]
        sender.send(self._response(texts, [0] * len(rows), True, stats, [len(o) for o in outputs]), flags=FINAL)

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
                    cancelled = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                    sender.send(pb_utils.InferenceResponse(error=cancelled), flags=FINAL)
                    return
                done = len(finished) == len(rows)
                if done or any(len(g) > n for g, n in zip(generated, sent)):
                    snapshot = [list(g) for g in generated]
                    sender.send(self._response(snapshot, list(sent), done, stats, [len(g) for g in snapshot]),
                                flags=FINAL if done else 0)
                    sent = [len(g) for g in snapshot]
                if done:
                    return
        finally:
            for task in tasks:
                task.cancel()
