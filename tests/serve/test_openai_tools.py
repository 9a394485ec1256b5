"""OpenAI tool calling as guided decoding (specbuild.serve.openai_tools): the plan a tool_choice makes, the guide it
sends, and the answer's text turned into tool_calls deltas and calls, streamed piece by piece or whole."""

from __future__ import annotations

import json

import pytest

from specbuild.serve.openai_tools import (NamedToolChoice, Tool, ToolCallStream, ToolChoiceError, plan_tool_call,
                                          with_tools_described)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [Tool.model_validate({"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}),
         Tool.model_validate({"type": "function", "function": {"name": "get_time", "description": "now"}})]


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


def test_a_named_function_holds_the_answer_to_its_parameters():
    plan = plan_tool_call(TOOLS, named("get_weather"))
    assert plan.name == "get_weather" and plan.schema == WEATHER
    assert plan.guide == {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(WEATHER)}


def test_a_function_without_parameters_takes_an_empty_object():
    assert plan_tool_call(TOOLS, named("get_time")).schema == {"type": "object", "properties": {}}


def test_required_with_one_tool_is_that_tool_and_with_several_the_model_names_one():
    assert plan_tool_call(TOOLS[:1], "required").name == "get_weather"
    plan = plan_tool_call(TOOLS, "required")
    assert plan.name is None
    assert [case["properties"]["name"] for case in plan.schema["anyOf"]] == [{"enum": ["get_weather"]},
                                                                             {"enum": ["get_time"]}]
    assert all(case["required"] == ["name", "arguments"] for case in plan.schema["anyOf"])


def test_required_among_several_tools_compiles_with_the_name_first():
    """The stream announces the call from the name, so the guide must write it before the arguments."""
    xgrammar = pytest.importorskip("xgrammar")
    grammar = str(xgrammar.Grammar.from_json_schema(json.dumps(plan_tool_call(TOOLS, "required").schema),
                                                    any_whitespace=False))
    assert '"{\\"name\\": "' in grammar and '", \\"arguments\\": "' in grammar


def test_none_and_no_tools_answer_in_text():
    assert plan_tool_call(TOOLS, "none") is None
    assert plan_tool_call(None, None) is None


@pytest.mark.parametrize(("tools", "choice", "param", "message"), [
    (TOOLS, None, "tool_choice", "tool_choice auto (the default with tools) is not supported"),
    (TOOLS, "auto", "tool_choice", "send tool_choice required"),
    (None, "required", "tool_choice", "needs the tools to choose from"),
    ([], named("get_weather"), "tool_choice", "needs the tools to choose from"),
    (TOOLS, named("book_flight"), "tool_choice", "'book_flight', which is not among the tools (get_weather, get_time)"),
    (TOOLS + TOOLS[:1], "required", "tools", "two tools share a name"),
], ids=["default-auto", "auto", "required-without-tools", "named-without-tools", "unknown-name", "duplicate"])
def test_what_cannot_be_answered_is_refused_naming_the_field(tools, choice, param, message):
    with pytest.raises(ToolChoiceError) as error:
        plan_tool_call(tools, choice)
    assert error.value.param == param and message in error.value.message


def replay(stream: ToolCallStream, text: str, size: int) -> list[dict]:
    deltas = []
    for start in range(0, len(text), size):
        deltas += stream.feed(text[start:start + size])
    return deltas + stream.finish()


def assembled(deltas: list[dict]) -> tuple[str, str]:
    """What a client makes of the deltas: the name from the first, the arguments joined."""
    assert "id" in deltas[0] and deltas[0]["function"]["arguments"] == ""
    assert all("id" not in delta for delta in deltas[1:])
    return deltas[0]["function"]["name"], "".join(delta["function"]["arguments"] for delta in deltas)


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_call_among_several_tools_streams_its_name_then_exactly_its_arguments(size):
    arguments = {"city": "Oslo {north}", "days": 3, "nested": {"a": [1, {"b": "}"}]}}
    text = json.dumps({"name": "get_weather", "arguments": arguments})
    stream = ToolCallStream(None)
    name, joined = assembled(replay(stream, text, size))
    assert name == "get_weather" and json.loads(joined) == arguments
    assert stream.call()["function"] == {"name": "get_weather", "arguments": joined}


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_a_named_call_streams_the_whole_text_as_its_arguments(size):
    text = json.dumps({"city": "Oslo", "days": 3})
    stream = ToolCallStream("get_weather")
    first = stream.feed("")
    assert first[0]["function"]["name"] == "get_weather"  # announced before any text
    name, joined = assembled(first + replay(stream, text, size))
    assert (name, joined) == ("get_weather", text)


def test_an_answer_cut_off_keeps_what_came_as_arguments_and_one_cut_before_the_name_has_no_call():
    cut = ToolCallStream(None)
    replay(cut, '{"name": "get_weather", "arguments": {"city": "Os', 4)
    assert cut.call()["function"]["arguments"] == '{"city": "Os'
    early = ToolCallStream(None)
    assert replay(early, '{"name": "get_wea', 4) == [] and early.call() is None


def test_a_template_without_tools_gets_them_in_the_system_message_and_earlier_calls_as_json():
    calls = [{"type": "function", "function": {"name": "get_time", "arguments": {}}}]
    messages = [{"role": "user", "content": "time?"}, {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": "12:00"}]
    described = with_tools_described(messages, TOOLS)
    assert described[0]["role"] == "system" and '"name":"get_weather"' in described[0]["content"]
    assert described[2] == {"role": "assistant", "content": json.dumps(calls)} and described[3] == messages[2]
    with_system = with_tools_described([{"role": "system", "content": "Be brief."}, *messages], TOOLS)
    assert with_system[0]["content"].startswith("Be brief.\n\nYou can call these functions")
    assert len(with_system) == 4
