"""Clients for the served ensemble: gRPC streaming (tritonclient) and Triton's HTTP generate endpoints.

The ensemble is decoupled (it answers with any number of responses), so Triton refuses its unary gRPC
``ModelInfer``: every gRPC call here goes through the bidirectional stream, with an empty final response
marking the end of each request. Each call opens its own stream, so calls can run from many threads.
Tensor names, dtypes and shapes come from :mod:`specbuild.package.contract`.
"""

from __future__ import annotations

import codecs
import json
import queue
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, make_dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from specbuild.package.contract import ENSEMBLE_INPUTS, ENSEMBLE_MODEL, NUMPY_DTYPES, Tensor, by_name
from specbuild.errors import RequestError, ServerError
from specbuild.spec import LOCAL_GRPC_URL
from specbuild.speculation.request_settings import REQUEST_SETTINGS

_INPUTS = by_name(ENSEMBLE_INPUTS)
# GenerationRequest field -> ensemble input, where the names differ.
_INPUT_NAMES = {"prompt": "text_input", "chat": "apply_chat_template"}
_SERVE_FIX = "start the server with `specbuild serve REPO`, or point --url at a running one"


# The request settings (speculation.request_settings) as keywords of a request, None: the release's default.
_RequestSettings = make_dataclass(
    "_RequestSettings", [(setting.name, setting.kind | None, field(default=None, kw_only=True))
                         for setting in REQUEST_SETTINGS], frozen=True)


@dataclass(frozen=True)
class GenerationRequest(_RequestSettings):  # type: ignore[misc, valid-type]
    """One request to the ensemble; ``None`` leaves an optional input out (the server's default). The request
    settings (``num_draft_tokens``, ``prompt_lookup``, ...) are keywords named as their inputs.

    Sampling follows NVIDIA's backend: with ``top_k`` and ``top_p`` left out (or 0), decoding is greedy whatever
    the temperature; :func:`specbuild.speculation.rules.explicit_sampling` gives the inputs that sample.
    """

    prompt: str
    max_tokens: int
    stream: bool = False
    chat: bool | None = None  # the prompt is a user message for the model's chat template
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_time: float | None = None
    stop_words: Sequence[str] | None = None
    bad_words: Sequence[str] | None = None
    end_id: int | None = None
    exclude_input_in_output: bool | None = True
    guided_decoding_guide_type: str | None = None  # json, json_schema, regex or ebnf_grammar (NVIDIA's)
    guided_decoding_guide: str | None = None  # the schema, regular expression or grammar (none for json)

    def values(self) -> dict[str, Any]:
        """The ensemble inputs this request sets, by tensor name (unset and empty ones left out)."""
        values = {_INPUT_NAMES.get(key, key): value for key, value in asdict(self).items()}
        return {name: value for name, value in values.items()
                if value is not None and not (isinstance(value, (list, tuple)) and not value)}

    def arrays(self) -> dict[str, np.ndarray]:
        """The request as batch-of-one arrays: shape ``[1, 1]`` for scalars, ``[1, n]`` for lists."""
        if not isinstance(self.prompt, str):
            raise RequestError(f"the prompt must be text, not {type(self.prompt).__name__}")
        return batch_of_one(self.values(), _INPUTS)


def batch_of_one(values: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, np.ndarray]:
    """``{input: value}`` as arrays of a batch of one, in the dtypes of ``tensors`` (a model's contract): shape
    ``[1, 1]`` for scalars, ``[1, n]`` for lists; a value that does not fit its dtype is a :class:`RequestError`."""
    arrays = {}
    for name, value in values.items():
        dtype = NUMPY_DTYPES[tensors[name].dtype]
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if dtype == "object":
            if not all(isinstance(item, str) for item in items):
                raise RequestError(f"{name} must be text (a string or a list of strings), got {value!r}")
            items = [item.encode("utf-8") for item in items]
        elif np.issubdtype(dtype, np.integer):
            limits = np.iinfo(dtype)
            if not all(limits.min <= item <= limits.max for item in items):  # numpy 1 would wrap around
                raise RequestError(f"{name}={value!r} is out of range for {dtype} ({limits.min}..{limits.max})")
        try:
            arrays[name] = np.array([items], dtype=dtype)
        except (OverflowError, ValueError, TypeError) as exc:
            raise RequestError(f"{name}={value!r} is not a valid {dtype} value: {exc}") from exc
    return arrays


def grpc_inputs(arrays: Mapping[str, np.ndarray]) -> list[Any]:
    """``{name: array}`` as ``tritonclient.grpc`` inputs (the asyncio client takes the same)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


_COUNTERS = ("output_token_count", "acceptance_rate", "total_draft_tokens", "total_accepted_draft_tokens")


@dataclass(frozen=True)
class Chunk:
    """One response: the new text and the counters so far (``None`` where the model sent none)."""

    text: str
    elapsed: float  # seconds from sending the request
    output_token_count: int | None = None
    acceptance_rate: float | None = None
    total_draft_tokens: int | None = None
    total_accepted_draft_tokens: int | None = None

    @classmethod
    def from_outputs(cls, text: str, elapsed: float, output: Callable[[str], Any]) -> "Chunk":
        """Build from an accessor giving an output's first value, or ``None`` when it is absent."""
        counters = {name: output(name) for name in
                    ("output_token_count", "total_draft_tokens", "total_accepted_draft_tokens")}
        rate = output("acceptance_rate")
        return cls(text, elapsed, acceptance_rate=None if rate is None else float(rate),
                   **{k: None if v is None else int(v) for k, v in counters.items()})


@dataclass(frozen=True)
class Generation:
    """A finished request: its text, its chunks and its figures (each counter: its latest value)."""

    text: str
    chunks: tuple[Chunk, ...]
    total_time: float
    output_token_count: int | None = None
    acceptance_rate: float | None = None
    total_draft_tokens: int | None = None
    total_accepted_draft_tokens: int | None = None
    time_to_first_chunk: float | None = None

    @classmethod
    def from_chunks(cls, chunks: Iterable[Chunk], total_time: float) -> "Generation":
        chunks = tuple(chunks)

        def latest(name: str) -> Any:
            return next((getattr(c, name) for c in reversed(chunks) if getattr(c, name) is not None), None)

        return cls(
            text="".join(chunk.text for chunk in chunks), chunks=chunks, total_time=total_time,
            time_to_first_chunk=chunks[0].elapsed if chunks else None,
            **{name: latest(name) for name in _COUNTERS},
        )

    @property
    def tokens_per_second(self) -> float | None:
        if self.output_token_count is None or self.total_time <= 0:
            return None
        return self.output_token_count / self.total_time

    def summary(self) -> str:
        """One line: tokens, time, tokens/s, acceptance."""
        parts = [f"{self.output_token_count if self.output_token_count is not None else '?'} tokens",
                 f"{self.total_time:.2f} s"]
        if self.tokens_per_second is not None:
            parts.append(f"{self.tokens_per_second:.1f} tokens/s")
        if self.time_to_first_chunk is not None:
            parts.append(f"first chunk {self.time_to_first_chunk:.2f} s")
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.2f} "
                         f"({self.total_accepted_draft_tokens}/{self.total_draft_tokens} draft tokens)")
        return ", ".join(parts)


class _TextDecoder:
    """The ensemble's ``text_output`` of each response (None: the empty final one), UTF-8 across chunks: bytes of
    one character split between responses are joined, not mangled."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, result: Any, final: bool) -> str:
        text = None if result is None else result.as_numpy("text_output")
        data = b"".join(np.asarray(text).reshape(-1).tolist()) if text is not None else b""
        return self._decoder.decode(data, final)


class SpecbuildClient:
    """gRPC client of the ensemble (``tritonclient.grpc``, stream API)."""

    def __init__(self, url: str = LOCAL_GRPC_URL, model: str = ENSEMBLE_MODEL, *, timeout: float = 600.0) -> None:
        self.url = url.removeprefix("grpc://")
        self.model = model
        self.timeout = timeout

    def generate(self, prompt: str, max_tokens: int, **options: Any) -> Generation:
        """Generate and wait for the whole answer; ``options`` are :class:`GenerationRequest` fields
        (``stream=True``: the server answers in chunks)."""
        return self.run(GenerationRequest(prompt, max_tokens, **options))

    def stream(self, prompt: str, max_tokens: int, **options: Any) -> Iterator[Chunk]:
        """Yield chunks as the server sends them; ``options`` are :class:`GenerationRequest` fields."""
        request = GenerationRequest(prompt, max_tokens, **{**options, "stream": True})
        yield from self.chunks(request)

    def run(self, request: GenerationRequest, on_chunk: Callable[[Chunk], None] | None = None) -> Generation:
        """Send ``request`` and collect its answer; ``on_chunk`` sees each chunk as it arrives."""
        started = time.perf_counter()
        chunks = []
        for chunk in self.chunks(request):
            if on_chunk is not None:
                on_chunk(chunk)
            chunks.append(chunk)
        return Generation.from_chunks(chunks, time.perf_counter() - started)

    def chunks(self, request: GenerationRequest) -> Iterator[Chunk]:
        """The responses to ``request`` as they arrive; closing the iterator cancels the request."""
        yield from self.stream_arrays(request.arrays(), _TextDecoder())

    def stream_arrays(self, arrays: Mapping[str, np.ndarray],
                      text_of: Callable[[Any, bool], str]) -> Iterator[Chunk]:
        """The responses of this client's model to the request ``arrays`` as they arrive, each response's new text
        given by ``text_of(result, final)`` (result None: the empty final response); closing the iterator cancels
        the request."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        inputs = grpc_inputs(arrays)
        responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        finished = False
        try:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            started = time.perf_counter()
            try:
                client.async_stream_infer(self.model, inputs, request_id=uuid.uuid4().hex,
                                          enable_empty_final_response=True)
            except InferenceServerException as exc:  # the stream failed first; its callback has the reason
                finished = True
                try:
                    error = responses.get(timeout=5)[1] or exc
                except queue.Empty:
                    error = exc
                raise self._error(error) from None
            while not finished:
                try:
                    result, error = responses.get(timeout=self.timeout)
                except queue.Empty:
                    raise RequestError(f"no response from {self.model} at {self.url} within {self.timeout:g} s",
                                       "raise the client timeout, or check the server's log") from None
                if error is not None:
                    finished = True
                    raise self._error(error)
                response = result.get_response()
                final = response.parameters.get("triton_final_response")
                finished = final is None or final.bool_param
                if response.outputs:
                    yield Chunk.from_outputs(text_of(result, finished), time.perf_counter() - started,
                                             lambda name: first_value(result.as_numpy(name)))
                elif finished and (rest := text_of(None, True)):  # a character cut off at the very end
                    yield Chunk(rest, time.perf_counter() - started)
        finally:
            client.stop_stream(cancel_requests=not finished)
            client.close()

    def _error(self, error: Any) -> Exception:
        message = error.message() if hasattr(error, "message") else str(error)
        if str(getattr(error, "status", lambda: None)()) == "StatusCode.UNAVAILABLE":
            return ServerError(f"cannot reach Triton over gRPC at {self.url}: {message}", _SERVE_FIX)
        return RequestError(f"{self.model} rejected the request: {message}")

    def generate_many(self, requests: Sequence[GenerationRequest], concurrency: int = 8, *,
                      return_exceptions: bool = False) -> list[Any]:
        """Run ``requests`` with at most ``concurrency`` in flight; results in request order.

        A failed request raises its error (after all have finished), or with ``return_exceptions``
        takes its place in the list, as in :func:`asyncio.gather`.
        """
        def attempt(request: GenerationRequest) -> Generation | Exception:
            try:
                return self.run(request)
            except (RequestError, ServerError) as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            results = list(pool.map(attempt, requests))
        if not return_exceptions:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results


def first_value(array: np.ndarray | None) -> Any:
    """A response tensor's first element as a Python value (None: absent or empty)."""
    return None if array is None or array.size == 0 else array.reshape(-1)[0].item()


# --- Triton's HTTP generate extension ---------------------------------------------------------------------
def parse_sse(lines: Iterable[bytes]) -> Iterator[str]:
    """The ``data`` of each server-sent event (its ``data:`` lines joined by newlines)."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def _http_chunk(event: dict[str, Any], elapsed: float) -> Chunk:
    if "error" in event:
        raise RequestError(f"the server rejected the request: {event['error']}")
    text = event.get("text_output", "")
    text = "".join(text) if isinstance(text, list) else str(text)

    def output(name: str) -> Any:
        value = event.get(name)
        return value[0] if isinstance(value, list) else value

    return Chunk.from_outputs(text, elapsed, output)


def _http_post(url: str, path: str, request: GenerationRequest, timeout: float, accept: str) -> Any:
    base = url if "://" in url else f"http://{url}"
    body = json.dumps(request.values()).encode("utf-8")
    http_request = urllib.request.Request(f"{base.rstrip('/')}{path}", data=body, method="POST",
                                          headers={"Content-Type": "application/json", "Accept": accept})
    try:
        return urllib.request.urlopen(http_request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        body = exc.read()
        events = list(parse_sse(body.splitlines(keepends=True))) or [body.decode("utf-8", "replace")]
        try:  # generate answers {"error": ...}; generate_stream the same as a server-sent event
            detail = json.loads(events[0]).get("error", events[0])
        except (ValueError, AttributeError):
            detail = events[0]
        raise RequestError(f"the server rejected the request (HTTP {exc.code}): {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServerError(f"cannot reach Triton over HTTP at {base}: {exc}", _SERVE_FIX) from None


def http_generate(url: str, request: GenerationRequest, model: str = ENSEMBLE_MODEL,
                  timeout: float = 600.0) -> Generation:
    """``POST /v2/models/<model>/generate``: one response, so the request must not stream."""
    started = time.perf_counter()
    with _http_post(url, f"/v2/models/{model}/generate", replace(request, stream=False), timeout,
                    "application/json") as response:
        event = json.loads(response.read())
    elapsed = time.perf_counter() - started
    return Generation.from_chunks([_http_chunk(event, elapsed)], elapsed)


def http_generate_stream(url: str, request: GenerationRequest, model: str = ENSEMBLE_MODEL,
                         timeout: float = 600.0) -> Iterator[Chunk]:
    """``POST /v2/models/<model>/generate_stream``: chunks as the server-sent events arrive."""
    started = time.perf_counter()
    with _http_post(url, f"/v2/models/{model}/generate_stream", replace(request, stream=True), timeout,
                    "text/event-stream") as response:
        for data in parse_sse(response):
            yield _http_chunk(json.loads(data), time.perf_counter() - started)
