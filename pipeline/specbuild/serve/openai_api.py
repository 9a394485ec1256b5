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
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException

from specbuild.errors import RequestError, ServerError
from specbuild.serve.openai_tools import (NamedToolChoice, Tool, ToolCall, ToolCallPlan, ToolCallStream, ToolChoiceError,
                                          ToolChoiceMode, plan_tool_call, tool_calls_for_template, tools_for_template,
                                          with_tools_described)
from specbuild.serve.orchestrator_client import OrchestratorClient, Piece
from specbuild.speculation.request_settings import REQUEST_SETTINGS
from specbuild.speculation.rules import explicit_sampling
from specbuild.triton_models.text import StopStrings

MAX_STOP_STRINGS = 4  # as OpenAI's API


class APIError(Exception):
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _refused(param: str, why: str) -> APIError:
    return APIError(400, f"{param} is not supported: {why}", param=param, code="unsupported_parameter")


# --- requests ---------------------------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _OpenAIFields(BaseModel):
    """Fields both endpoints take (OpenAI's, then specbuild's extras; the request settings are added from their
    table: :data:`_GenerationRequest`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    top_k: int | None = Field(None, ge=0)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)

    def check(self) -> None:
        if (self.n or 1) > 1:
            raise _refused("n", "one choice per request (send the request again for more)")
        if self.logit_bias:
            raise _refused("logit_bias", "use bad_words through Triton's generate endpoint instead")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        if len(self.stop_strings) > MAX_STOP_STRINGS:
            raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} strings", param="stop")

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def settings(self) -> dict[str, Any]:
        """The orchestrator's request settings (None: its default)."""
        temperature = 1.0 if self.temperature is None else self.temperature
        return {**explicit_sampling(temperature, self.top_k, self.top_p), "seed": self.seed,
                "min_tokens": self.min_tokens, "repetition_penalty": self.repetition_penalty,
                "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                **{setting.name: getattr(self, setting.name) for setting in REQUEST_SETTINGS}}


# Both endpoints' fields: OpenAI's, then specbuild's request settings (extra fields named as their inputs).
_GenerationRequest = create_model("_GenerationRequest", __base__=_OpenAIFields, **{
    setting.name: (setting.kind | None, Field(None, ge=setting.minimum)) for setting in REQUEST_SETTINGS})


class CompletionRequest(_GenerationRequest):  # type: ignore[misc, valid-type]
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = Field(None, ge=1)

    def check(self) -> None:
        super().check()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise _refused("prompt", "one prompt per request (a list must hold exactly one string)")
        for name, default in (("echo", False), ("suffix", None), ("logprobs", None)):
            if getattr(self, name) != default:
                raise _refused(name, "specbuild returns the generated text only")
        if (self.best_of or 1) > 1:
            raise _refused("best_of", "one candidate per request")

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, tool_calls: None, ... as clients send them

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: the call it answers

    def as_template_message(self) -> dict[str, Any]:
        content = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(part.text for part in self.content)
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.tool_calls:
            message["tool_calls"] = tool_calls_for_template(self.tool_calls)
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class JSONSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``: strict or not, the schema is enforced (guided decoding)."""

    model_config = ConfigDict(populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    def guide(self) -> dict[str, str | None]:
        """The orchestrator's guided decoding inputs for this format (none for text)."""
        if self.type == "json_object":  # any JSON object: the schema of one, as OpenAI's JSON mode promises
            return {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": "object"}'}
        if self.type == "json_schema":
            if self.json_schema is None:
                raise APIError(400, "response_format json_schema needs its json_schema (name and schema)",
                               param="response_format")
            return {"guided_decoding_guide_type": "json_schema",
                    "guided_decoding_guide": json.dumps(self.json_schema.schema_)}
        return {}


class ChatRequest(_GenerationRequest):  # type: ignore[misc, valid-type]
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceMode | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # one call per answer, which either value allows
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    def check(self) -> None:
        super().check()
        if self.logprobs or self.top_logprobs:
            raise _refused("logprobs", "specbuild returns the generated text only")
        for name in ("functions", "function_call"):
            if getattr(self, name) not in (None, [], "none"):
                raise _refused(name, "it is deprecated: send tools and tool_choice instead")
        if self.tool_plan is not None and self.response_format is not None and self.response_format.type != "text":
            raise APIError(400, "response_format and a tool call both hold the answer to a schema: send one of them",
                           param="response_format")

    @functools.cached_property
    def tool_plan(self) -> ToolCallPlan | None:
        """How the answer becomes a tool call (None: it is text)."""
        try:
            return plan_tool_call(self.tools, self.tool_choice)
        except ToolChoiceError as exc:
            raise APIError(400, exc.message, param=exc.param) from None

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def settings(self) -> dict[str, Any]:
        """The common settings, and the guide of the tool call or the response format."""
        if self.tool_plan is not None:
            guide = self.tool_plan.guide
        else:
            guide = self.response_format.guide() if self.response_format is not None else {}
        return {**super().settings(), **guide}

    def template_messages(self, takes_tools: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and tools for the chat template: the tools as its ``tools`` where it ``takes_tools``, else
        described in the system message."""
        messages = [message.as_template_message() for message in self.messages]
        if not self.tools:
            return messages, None
        if takes_tools:
            return messages, tools_for_template(self.tools)
        return with_tools_described(messages, self.tools), None


# --- generation -------------------------------------------------------------------------------------------------
class Generation:
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
def create_app(client: OrchestratorClient, model: str) -> FastAPI:
    """The API for the release served as ``model`` whose orchestrator ``client`` calls."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.close()

    app = FastAPI(title="specbuild OpenAI-compatible API", lifespan=lifespan)
    created = int(time.time())
    model_card = {"id": model, "object": "model", "created": created, "owned_by": "specbuild"}

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(location) or None
        message = (f"Unrecognized request argument supplied: {param}" if first.get("type") == "extra_forbidden"
                   else f"{param or 'the request body'}: {first.get('msg')}")
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type=kind).response()

    @app.exception_handler(Exception)
    async def failure(_: Request, exc: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {exc!r}", type="server_error").response()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{name:path}")
    async def model_info(name: str) -> dict[str, Any]:
        _known(name)
        return model_card

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> Any:
        if await client.ready():
            return {"status": "ready"}
        return APIError(503, f"Triton's orchestrator model is not ready at {client.url}",
                        type="service_unavailable").response()

    def _known(name: str) -> None:
        if name != model:
            raise APIError(404, f"The model `{name}` does not exist (this server serves `{model}`)", param="model",
                           code="model_not_found")

    def _start(request: _OpenAIFields, prompt_ids: list[int], budget: int | None) -> Generation:
        request.check()
        room = client.settings.max_seq_len - len(prompt_ids)
        max_tokens = budget if budget is not None else max(1, room)
        try:
            arrays = client.arrays(prompt_ids, max_tokens, stream=request.stream, stop_words=request.stop_strings,
                                   **request.settings())
        except RequestError as exc:
            raise APIError(400, exc.message) from None
        return Generation(client, arrays, request.stop_strings, max_tokens, len(prompt_ids))

    async def _answer(http: Request, generation: Generation, kind: str, request: _OpenAIFields,
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

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, http: Request) -> Any:
        _known(request.model)
        prompt_ids = _prompt_ids(lambda: client.preprocessor.checked(request.text), "prompt")
        generation = _start(request, prompt_ids, request.max_tokens)

        def choice(text: str | None, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        return await _answer(http, generation, "text_completion", request, choice)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest, http: Request) -> Any:
        _known(request.model)
        preprocessor = client.preprocessor
        plan = request.tool_plan
        messages, tools = request.template_messages(preprocessor.template_takes_tools)
        prompt_ids = _prompt_ids(lambda: preprocessor.checked(preprocessor.chat_text(messages, tools),
                                                              add_special_tokens=False), "messages")
        generation = _start(request, prompt_ids, request.token_budget)
        calls = plan.stream() if plan is not None else None

        def choice(text: str | None, finish: str | None) -> dict[str, Any] | None:
            if calls is not None:
                return _tool_call_choice(calls, text, finish, request.stream)
            if request.stream:
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish}

        return await _answer(http, generation, "chat.completion", request, choice)

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
