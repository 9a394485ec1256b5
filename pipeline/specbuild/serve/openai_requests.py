"""The requests of specbuild's OpenAI-compatible API (:mod:`specbuild.serve.openai_api`) and its errors: each
body's fields as OpenAI names them, their checks (what is refused, in OpenAI's error shape) and what they ask the
orchestrator for (its request settings, the chat template's messages, a guide)."""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

from specbuild.serve.openai_tools import (NamedToolChoice, Tool, ToolCall, ToolCallPlan, ToolChoiceError,
                                          ToolChoiceMode, plan_tool_call, tool_calls_for_template, tools_for_template,
                                          with_tools_described)
from specbuild.speculation.request_settings import REQUEST_SETTINGS
from specbuild.speculation.rules import explicit_sampling

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

class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _OpenAIFields(BaseModel):
    """Fields both endpoints take (OpenAI's, then specbuild's extras; the request settings are added from their
    table: :data:`_CompletionFields`)."""

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
_CompletionFields = create_model("_CompletionFields", __base__=_OpenAIFields, **{
    setting.name: (setting.kind | None, Field(None, ge=setting.minimum)) for setting in REQUEST_SETTINGS})


class CompletionRequest(_CompletionFields):  # type: ignore[misc, valid-type]
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


class ChatRequest(_CompletionFields):  # type: ignore[misc, valid-type]
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
