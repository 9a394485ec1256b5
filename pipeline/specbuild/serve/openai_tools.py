"""OpenAI tool calling as guided decoding: with ``tool_choice`` ``required`` or a named function the answer is held to
a call's JSON and returned as ``tool_calls`` with ``finish_reason: tool_calls``.

* a named function (or ``required`` with one tool): the answer is that function's arguments, held to its
  ``parameters`` schema, as Triton's OpenAI front end does for a named function
  (``python/openai/openai_frontend/engine/utils/triton.py``, ``_get_guided_json_from_tool``);
* ``required`` with several tools: the answer is ``{"name": ..., "arguments": ...}`` held to one schema per tool
  (``anyOf``), so the model picks the tool (Triton's front end forces the first tool instead); the name comes
  first, so a stream announces the call before its arguments;
* ``auto`` (the default with tools) needs a parser for the model's own tool-call format and is refused, naming it;
  ``none`` answers in text. One call per answer (which ``parallel_tool_calls`` allows either way).

The tools reach the model through its chat template's ``tools`` variable; a template without one gets them in the
system message (:func:`template_messages`), so the model knows what it is calling.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

ToolChoiceMode = Literal["none", "auto", "required"]
# OpenAI's rule for a function's name (the schema's enum holds it as written, so it needs no escaping).
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
# The start of a ``required`` answer among several tools, up to its arguments' first character (whitespace allowed,
# though the guide writes none).
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([a-zA-Z0-9_-]*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    # OpenAI: leaving the parameters out defines a function without any.
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class ToolChoiceError(ValueError):
    """A tool request this server cannot answer: ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


@dataclass(frozen=True)
class ToolCallPlan:
    """How the answer's text becomes a call: it is ``name``'s arguments, or (``name`` None) the object naming one of
    the tools with its arguments; ``schema`` is the guide that holds it there."""

    schema: dict[str, Any]
    name: str | None

    @property
    def guide(self) -> dict[str, str]:
        """The orchestrator's guided decoding inputs."""
        return {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(self.schema)}

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.name)


def plan_tool_call(tools: Sequence[Tool] | None, choice: ToolChoiceMode | NamedToolChoice | None
                   ) -> ToolCallPlan | None:
    """The plan for ``tool_choice`` over ``tools``; None when the answer is text (no tools, or ``none``)."""
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    if not tools:
        raise ToolChoiceError("tool_choice", f"tool_choice {_shown(choice)} needs the tools to choose from: send tools")
    if choice == "auto":
        raise ToolChoiceError("tool_choice", "tool_choice auto (the default with tools) is not supported: it needs a "
                              "parser for this model's own tool-call format; send tool_choice required (the model "
                              "picks one of the tools) or a named function")
    functions = {tool.function.name: tool.function for tool in tools}
    if len(functions) != len(tools):
        raise ToolChoiceError("tools", "two tools share a name: give each function its own name")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in functions:
            raise ToolChoiceError("tool_choice", f"tool_choice names {choice.function.name!r}, which is not among the "
                                  f"tools ({', '.join(functions)}): name one of them")
        return ToolCallPlan(functions[choice.function.name].parameters, choice.function.name)
    if len(functions) == 1:
        (only,) = functions.values()
        return ToolCallPlan(only.parameters, only.name)
    cases = [{"type": "object", "properties": {"name": {"enum": [f.name]}, "arguments": f.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for f in functions.values()]
    return ToolCallPlan({"anyOf": cases}, None)


def _shown(choice: ToolChoiceMode | NamedToolChoice) -> str:
    return f"naming {choice.function.name!r}" if isinstance(choice, NamedToolChoice) else choice


class ToolCallStream:
    """The answer's text, piece by piece, as OpenAI's ``tool_calls`` deltas: the call's head (id, name) once the name
    is known, then its arguments as they come. Under several tools the object's closing brace is not part of the
    arguments, so the text from the last ``}`` seen is held back until the answer ends."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.wrapped = name is None  # the text is {"name": ..., "arguments": ...}, not the arguments alone
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"
        self.text = ""
        self.arguments = ""
        self._head: int | None = None if self.wrapped else 0  # where the arguments start in the text, once known
        self._announced = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The deltas ``piece`` completes."""
        self.text += piece
        return self._deltas(final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas left when the answer ends."""
        return self._deltas(final=True)

    def call(self) -> dict[str, Any] | None:
        """The whole call so far; None when the answer ended before the tool's name."""
        if self._head is None:
            return None
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        if self._head is None:
            head = _CALL_HEAD.match(self.text)
            if head is None:
                return deltas
            self.name, self._head = head[1], head.end()
        if not self._announced:
            self._announced = True
            deltas.append({"index": 0, "id": self.call_id, "type": "function",
                           "function": {"name": self.name, "arguments": ""}})
        body = self.text[self._head:]
        end = self._arguments_end(body, final)
        new = body[len(self.arguments):end]
        if new:
            self.arguments += new
            deltas.append({"index": 0, "function": {"arguments": new}})
        return deltas

    def _arguments_end(self, body: str, final: bool) -> int:
        """How much of the text after the head is arguments: all of it for a named function; under several tools
        all but the object's closing brace (held back from the last ``}`` until the end, then dropped from a complete
        object; a cut-off answer's text is all arguments)."""
        if not self.wrapped:
            return len(body)
        if final:
            stripped = body.rstrip()
            return len(stripped) - 1 if stripped.endswith("}") and _is_json(self.text) else len(body)
        last = body.rfind("}")
        return len(body) if last < 0 else max(last, len(self.arguments))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class CalledFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    """A call in an assistant message of the conversation so far."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


def tool_calls_for_template(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """An assistant message's calls as chat templates take them (Hugging Face's convention: the arguments as a
    mapping where they are JSON)."""
    def arguments(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            return text

    return [{"type": "function", "id": call.id,
             "function": {"name": call.function.name, "arguments": arguments(call.function.arguments)}}
            for call in calls]


def tools_for_template(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [tool.model_dump(exclude_none=True) for tool in tools]


def with_tools_described(messages: list[dict[str, Any]], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """``messages`` for a chat template without a ``tools`` variable: the tools described in the system message (a
    new one first when there is none), and earlier calls written out as their JSON."""
    listing = "\n".join(json.dumps(tool.function.model_dump(exclude_none=True), separators=(",", ":")) for tool in tools)
    described = f"You can call these functions (each with its JSON schema of arguments):\n{listing}"
    rewritten = [{"role": m["role"], "content": m.get("content") or json.dumps(m["tool_calls"])}
                 if m.get("tool_calls") else m for m in messages]
    if rewritten and rewritten[0]["role"] == "system":
        first = rewritten[0]
        return [{**first, "content": f"{first['content']}\n\n{described}"}, *rewritten[1:]]
    return [{"role": "system", "content": described}, *rewritten]
