"""specbuild's OpenAI-compatible API: ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (FastAPI),
served next to Triton by ``specbuild serve``.

Each request goes to the release's ``orchestrator`` model over gRPC (:class:`~specbuild.serve.orchestrator_client.
OrchestratorClient`: the ensemble's own tokenizer, checks and detokenizer), so a client that goes away stops its
generation within one round. Semantics:

* sampling as OpenAI's: ``temperature`` (default 1) above 0 samples, ``top_p`` (default 1) limits it, 0 is
  greedy; ``seed`` makes sampling repeat; ``presence_penalty``/``frequency_penalty`` are TensorRT-LLM's (the
  prompt's tokens count too) and, like ``repetition_penalty``, make the request run without drafts;
* ``stop``: up to 4 strings, the text ends before the first (not included); ``max_tokens`` (chat also
  ``max_completion_tokens``) defaults to the rest of the context; ``usage`` counts prompt and generated tokens;
* ``stream: true``: server-sent events, ``data: [DONE]`` last; ``stream_options.include_usage`` adds the usage
  chunk;
* extra fields: ``top_k``, ``min_tokens``, ``repetition_penalty`` and the request settings, named as their
  ensemble inputs (:data:`specbuild.speculation.request_settings.REQUEST_SETTINGS`);
* chat's ``response_format``: ``json_object`` (any JSON object) and ``json_schema`` (its schema, strict or not)
  are guided decoding (the orchestrator's ``guided_decoding_guide_type`` json_schema and ``guided_decoding_guide``);
* chat's ``tools`` with ``tool_choice`` ``required`` or a named function: the answer is a call, held to its schema
  (:mod:`specbuild.serve.openai_tools`); ``auto`` is refused, ``none`` answers in text;
* refused (400, OpenAI's error shape, ``param`` naming the field): ``n`` or ``best_of`` above 1, ``logprobs``,
  ``echo``, ``suffix``, ``logit_bias``, the deprecated ``functions``/``function_call``, unknown fields;
  an unknown model is 404 (``model_not_found``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specbuild.errors import RequestError, ServerError
from specbuild.serve.openai_requests import APIError, ChatRequest, CompletionRequest
from specbuild.serve.openai_tools import ToolCallStream
from specbuild.serve.orchestrator_client import OrchestratorClient, Piece
from specbuild.triton_models.text import StopStrings


# --- generation -------------------------------------------------------------------------------------------------
class CompletionRun:
    """One request's run: its text pieces (stop strings applied) and, at the end, why it finished."""

    def __init__(self, client: OrchestratorClient, arrays: dict[str, Any], stops: list[str], max_tokens: int,
                 prompt_tokens: int) -> None:
        self.client, self.arrays, self.max_tokens = client, arrays, max_tokens
        self.stops = StopStrings(stops)
        self.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
        self.finish_reason: str | None = None

    async def pieces(self) -> AsyncIterator[str]:
        """The text as it comes; a stop string found in it ends the request (its generation is cancelled)."""
        async with contextlib.aclosing(self.client.generate(self.arrays)) as responses:
            piece: Piece | None = None
            async for piece in responses:
                text = self.stops.feed(piece.text) + (self.stops.flush() if piece.final else "")
                self._count(piece.output_tokens)
                if text:
                    yield text
                if self.stops.stopped:
                    break
        length = piece is not None and piece.output_tokens >= self.max_tokens and not self.stops.stopped
        self.finish_reason = "length" if length else "stop"

    def _count(self, tokens: int) -> None:
        self.usage["completion_tokens"] = tokens
        self.usage["total_tokens"] = self.usage["prompt_tokens"] + tokens


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result; cancelled (and so its request at the orchestrator) when the client goes away first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise APIError(499, "the client closed the request", type="client_closed_request")
    return task.result()


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data) if not isinstance(data, str) else data}\n\n"



# --- the app ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Served:
    """What an app serves: the release named ``model`` whose orchestrator ``client`` calls, and its model card."""

    client: OrchestratorClient
    model: str
    card: dict[str, Any]

    def known(self, name: str) -> None:
        """Refuse a request for another model than this one (404, ``model_not_found``)."""
        if name != self.model:
            raise APIError(404, f"The model `{name}` does not exist (this server serves `{self.model}`)",
                           param="model", code="model_not_found")


def _served(http: Request) -> Served:
    return http.app.state.served


ServedHere = Annotated[Served, Depends(_served)]
router = APIRouter()


@router.get("/v1/models")
async def models(served: ServedHere) -> dict[str, Any]:
    return {"object": "list", "data": [served.card]}


@router.get("/v1/models/{name:path}")
async def model_info(name: str, served: ServedHere) -> dict[str, Any]:
    served.known(name)
    return served.card


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get("/health/ready")
async def ready(served: ServedHere) -> Any:
    if await served.client.ready():
        return {"status": "ready"}
    return APIError(503, f"Triton's orchestrator model is not ready at {served.client.url}",
                    type="service_unavailable").response()


@router.post("/v1/completions")
async def completions(request: CompletionRequest, http: Request, served: ServedHere) -> Any:
    served.known(request.model)
    client = served.client
    prompt_ids = _prompt_ids(lambda: client.preprocessor.checked(request.text), "prompt")
    generation = _start(client, request, prompt_ids, request.max_tokens)

    def choice(text: str | None, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    return await _answer(http, served.model, generation, "text_completion", request, choice)


@router.post("/v1/chat/completions")
async def chat_completions(request: ChatRequest, http: Request, served: ServedHere) -> Any:
    served.known(request.model)
    preprocessor = served.client.preprocessor
    plan = request.tool_plan
    messages, tools = request.template_messages(preprocessor.template_takes_tools)
    prompt_ids = _prompt_ids(lambda: preprocessor.checked(preprocessor.chat_text(messages, tools),
                                                          add_special_tokens=False), "messages")
    generation = _start(served.client, request, prompt_ids, request.token_budget)
    calls = plan.stream() if plan is not None else None

    def choice(text: str | None, finish: str | None) -> dict[str, Any] | None:
        if calls is not None:
            return _tool_call_choice(calls, text, finish, request.stream)
        if request.stream:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}

    return await _answer(http, served.model, generation, "chat.completion", request, choice)


def _start(client: OrchestratorClient, request: CompletionRequest | ChatRequest, prompt_ids: list[int],
           budget: int | None) -> CompletionRun:
    request.check()
    room = client.settings.max_seq_len - len(prompt_ids)
    max_tokens = budget if budget is not None else max(1, room)
    try:
        arrays = client.arrays(prompt_ids, max_tokens, stream=request.stream, stop_words=request.stop_strings,
                               **request.settings())
    except RequestError as exc:
        raise APIError(400, exc.message) from None
    return CompletionRun(client, arrays, request.stop_strings, max_tokens, len(prompt_ids))


async def _answer(http: Request, model: str, generation: CompletionRun, kind: str,
                  request: CompletionRequest | ChatRequest,
                  shape: Callable[[str | None, str | None], dict[str, Any] | None]) -> Any:
    """A whole answer as JSON, or (``stream``) the pieces as server-sent events; ``shape(text, finish)`` gives
    one choice (None: nothing to send for that piece yet)."""
    ident = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}"
    base = {"id": ident, "created": int(time.time()), "model": model}
    if not request.stream:
        async def whole() -> str:
            return "".join([text async for text in generation.pieces()])

        try:
            text = await _unless_disconnected(http, whole())
        except ServerError as exc:
            raise APIError(500, exc.message, type="server_error") from None
        return {**base, "object": kind, "choices": [shape(text, generation.finish_reason)],
                "usage": generation.usage}

    usage = request.stream_options is not None and request.stream_options.include_usage
    chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else kind

    def chunk(choice: dict[str, Any] | None) -> str:
        return _sse({**base, "object": chunk_kind, "choices": [] if choice is None else [choice],
                     **({"usage": generation.usage if choice is None else None} if usage else {})})

    async def events() -> AsyncIterator[str]:
        if kind == "chat.completion":
            yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None})
        try:
            async for text in generation.pieces():
                if (choice := shape(text, None)) is not None:
                    yield chunk(choice)
            yield chunk(shape("" if kind != "chat.completion" else None, generation.finish_reason))
            if usage:
                yield chunk(None)
        except ServerError as exc:
            yield _sse(APIError(500, exc.message, type="server_error").body())
        yield _sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream")


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    message = (f"Unrecognized request argument supplied: {param}" if first.get("type") == "extra_forbidden"
               else f"{param or 'the request body'}: {first.get('msg')}")
    return APIError(400, message, param=param).response()


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return APIError(exc.status_code, str(exc.detail), type=kind).response()


async def _failure(_: Request, exc: Exception) -> JSONResponse:
    return APIError(500, f"internal error: {exc!r}", type="server_error").response()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    await app.state.served.client.close()


def create_app(client: OrchestratorClient, model: str) -> FastAPI:
    """The API for the release served as ``model`` whose orchestrator ``client`` calls."""
    app = FastAPI(title="specbuild OpenAI-compatible API", lifespan=_lifespan)
    card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "specbuild"}
    app.state.served = Served(client, model, card)
    for kind, handler in ((APIError, _api_error), (RequestValidationError, _invalid),
                          (StarletteHTTPException, _http_error), (Exception, _failure)):
        app.add_exception_handler(kind, handler)
    app.include_router(router)
    return app


def _tool_call_choice(calls: ToolCallStream, text: str | None, finish: str | None, stream: bool
                      ) -> dict[str, Any] | None:
    """A chat choice whose answer is a tool call: ``finish_reason`` ``tool_calls`` unless it was cut at ``length``."""
    reason = "tool_calls" if finish == "stop" else finish
    deltas = calls.feed(text) if text else []
    if finish is not None:
        deltas += calls.finish()
    if stream:
        if not deltas and finish is None:
            return None
        return {"index": 0, "delta": {"tool_calls": deltas} if deltas else {}, "logprobs": None,
                "finish_reason": reason}
    call = calls.call()  # None only when the answer was cut before the tool's name: then its text is the content
    message = {"role": "assistant", "content": None if call else calls.text, "tool_calls": [call] if call else []}
    return {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}


def _prompt_ids(encode: Callable[[], list[int]], param: str) -> list[int]:
    try:
        return encode()
    except RequestError as exc:
        raise APIError(400, exc.message.replace("text_input", param), param=param) from None
