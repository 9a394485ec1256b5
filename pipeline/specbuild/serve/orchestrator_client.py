"""The ``orchestrator`` model called directly over Triton's gRPC stream (asyncio), with the ensemble's own
pre- and postprocessing: the release's tokenizer through :class:`~specbuild.triton_models.preprocessor.Preprocessor`,
requests checked by :func:`~specbuild.triton_models.orchestrator_requests.parse_orchestrator_rows` with the orchestrator's own parameters
before they are sent, and text by :func:`~specbuild.triton_models.text.incremental_text`.

Calling the orchestrator rather than the ensemble is what makes cancellation work: closing the stream cancels the
request, and a model called directly sees that (``request.is_cancelled()``) after its current round, while an
ensemble only checks between its steps (see ``docs/architecture.md``).

:class:`IdsClient` calls it from threads (as :class:`~specbuild.serve.client.SpecbuildClient` calls the ensemble)
with a prompt's token ids as they are: ``bench --captured`` replays captured prompts exactly as they were served,
with no decode and re-encode in between that could change them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.errors import RequestError, ServerError, UsageError
from specbuild.package.contract import (
    ORCHESTRATOR_INPUTS,
    ORCHESTRATOR_MODEL,
    PREPROCESSING_MODEL,
    OrchestratorParameters,
    PreprocessingParameters,
    by_name,
)
from specbuild.serve.client import Chunk, SpecbuildClient, batch_of_one, grpc_inputs
from specbuild.triton_models.orchestrator_requests import parse_orchestrator_rows
from specbuild.triton_models.preprocessor import Preprocessor
from specbuild.triton_models.text import encode_word_list, incremental_text

_INPUTS = by_name(ORCHESTRATOR_INPUTS)


@dataclass(frozen=True)
class Piece:
    """One response: its new text, the tokens generated so far, and whether it is the last."""

    text: str
    output_tokens: int
    final: bool


def release_requests(repository: str | Path) -> tuple[Preprocessor, OrchestratorParameters]:
    """What turns a request into the orchestrator's inputs for the release in ``repository``: its preprocessing
    (tokenizer and parameters) and its orchestrator's parameters, as Triton serves them."""
    from transformers import AutoTokenizer

    from specbuild.package.repository import orchestrator_settings, read_config

    repository = Path(repository)
    preprocessing = {key: value.string_value
                     for key, value in read_config(repository / PREPROCESSING_MODEL).parameters.items()}
    settings = orchestrator_settings(repository)
    if settings is None:
        raise UsageError(f"{repository} has no {ORCHESTRATOR_MODEL} model", "use a release with specbuild's "
                         "orchestrator (the torch or tensorrt-llm runtime)")
    tokenizer = AutoTokenizer.from_pretrained(str(repository / PREPROCESSING_MODEL / "1" / "tokenizer"),
                                              trust_remote_code=False)
    return Preprocessor(tokenizer, PreprocessingParameters.from_parameters(preprocessing)), settings


def orchestrator_arrays(preprocessor: Preprocessor, settings: OrchestratorParameters, prompt_ids: Sequence[int],
                        max_tokens: int, *, stream: bool, stop_words: Sequence[str] = (),
                        **request_settings: Any) -> dict[str, Any]:
    """The orchestrator's inputs for one prompt, checked as the orchestrator checks them (a :class:`RequestError`
    naming the input at fault); ``request_settings`` are request settings by input name, None left out."""
    values = {"input_ids": list(prompt_ids), "input_length": len(prompt_ids), "max_tokens": max_tokens,
              "end_id": preprocessor.parameters.end_id, "stream": stream, "exclude_input_in_output": True,
              **{name: value for name, value in request_settings.items() if value is not None}}
    unknown = sorted(set(values) - set(_INPUTS))
    if unknown:
        raise RequestError(f"unknown request settings: {', '.join(unknown)}")
    arrays = batch_of_one(values, _INPUTS)
    arrays["stop_words_ids"] = encode_word_list(preprocessor.word_ids(stop_words))[None]
    parse_orchestrator_rows(arrays, settings)
    return arrays


def response_text(tokenizer: Any, result: Any) -> tuple[str, bool]:
    """An orchestrator response's new text, decoded as the release's postprocessing decodes it, and whether it is
    the request's last."""
    ids, length, skip, final = (result.as_numpy(name) for name in ("output_ids", "output_length", "skip_tokens",
                                                                   "is_final"))
    last = bool(final.reshape(-1)[0])
    tokens = ids.reshape(-1)[: int(length.reshape(-1)[0])].tolist()
    return incremental_text(tokenizer, tokens, int(skip.reshape(-1)[0]), last), last


class OrchestratorClient:
    """Generation by a release's orchestrator model on a Triton server (gRPC ``url``, ``host:port``)."""

    def __init__(self, url: str, preprocessor: Preprocessor, settings: OrchestratorParameters) -> None:
        self.url = url.removeprefix("grpc://")
        self.preprocessor = preprocessor
        self.settings = settings
        self._client: Any = None

    @classmethod
    def for_release(cls, url: str, repository: str | Path) -> OrchestratorClient:
        """For the release in ``repository`` (its tokenizer and its models' parameters, as Triton serves them)."""
        return cls(url, *release_requests(repository))

    @property
    def client(self) -> Any:
        """The asyncio gRPC client, made in the event loop that uses it."""
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient

            self._client = grpcclient.InferenceServerClient(self.url)
        return self._client

    async def ready(self) -> bool:
        """Whether Triton serves the orchestrator now."""
        try:
            return bool(await self.client.is_model_ready(ORCHESTRATOR_MODEL))
        except Exception:  # noqa: BLE001 - unreachable or any transport failure: not ready
            return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def arrays(self, prompt_ids: Sequence[int], max_tokens: int, *, stream: bool, stop_words: Sequence[str] = (),
               **settings: Any) -> dict[str, Any]:
        """:func:`orchestrator_arrays` for this client's release."""
        return orchestrator_arrays(self.preprocessor, self.settings, prompt_ids, max_tokens, stream=stream,
                                   stop_words=stop_words, **settings)

    async def generate(self, arrays: dict[str, Any]) -> AsyncIterator[Piece]:
        """Send a request (:meth:`arrays`) and yield its text as responses arrive. Closing the iterator early
        cancels the request, which stops its generation after the current round."""
        import grpc
        from tritonclient.utils import InferenceServerException

        request = {"model_name": ORCHESTRATOR_MODEL, "inputs": grpc_inputs(arrays), "request_id": uuid.uuid4().hex,
                   "outputs": None}

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        tokenizer = self.preprocessor.tokenizer
        responses = self.client.stream_infer(one_request())
        final = False
        try:
            async for result, error in responses:
                if error is not None:
                    raise ServerError(f"the orchestrator failed: {error.message()}",
                                      "read the Triton server's log; the request may be retried")
                text, final = response_text(tokenizer, result)
                yield Piece(text, int(result.as_numpy("output_token_count").reshape(-1)[0]), final)
        except (InferenceServerException, grpc.RpcError) as exc:
            detail = exc.message() if isinstance(exc, InferenceServerException) else exc.details()
            raise ServerError(f"cannot reach Triton over gRPC at {self.url}: {detail}",
                              "check that `specbuild serve` (or the release's Triton) is running") from None
        finally:
            if not final:
                responses.cancel()


@dataclass(frozen=True)
class IdsRequest:
    """One request by its prompt's token ids; ``settings``: the orchestrator's request inputs by name (sampling,
    ``num_draft_tokens``, ...; None leaves one out)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stream: bool = True
    settings: Mapping[str, Any] = field(default_factory=dict)


class IdsClient(SpecbuildClient):
    """A release's orchestrator model sent prompt token ids, over Triton's gRPC stream from any thread; answers
    are :class:`~specbuild.serve.client.Generation` as the ensemble's, their text decoded as its postprocessing
    decodes it."""

    def __init__(self, url: str, preprocessor: Preprocessor, settings: OrchestratorParameters, *,
                 timeout: float = 600.0) -> None:
        super().__init__(url, ORCHESTRATOR_MODEL, timeout=timeout)
        self.preprocessor = preprocessor
        self.settings = settings

    @classmethod
    def for_release(cls, url: str, repository: str | Path, *, timeout: float = 600.0) -> IdsClient:
        """For the release in ``repository`` (its tokenizer and its models' parameters, as Triton serves them)."""
        return cls(url, *release_requests(repository), timeout=timeout)

    def chunks(self, request: IdsRequest) -> Iterator[Chunk]:  # type: ignore[override]
        """The responses to ``request`` as they arrive (checked as the orchestrator checks it before it is sent)."""
        arrays = orchestrator_arrays(self.preprocessor, self.settings, request.prompt_ids, request.max_tokens,
                                     stream=request.stream, **request.settings)
        tokenizer = self.preprocessor.tokenizer
        yield from self.stream_arrays(arrays, lambda result, final: "" if result is None
                                      else response_text(tokenizer, result)[0])
