"""specbuild's OpenAI-compatible API, used with the official ``openai`` client against ``specbuild serve`` on the tiny
release with a chat template (``tiny_chat_release``): streamed chat completions with the ensemble's greedy answer,
completions with stop strings, seeds and usage, the speculation settings as extra fields, a client that goes away
(its generation stops, counted), errors in OpenAI's shape, and ``specbuild generate`` with the chat template."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from model_probes import CODE_PROMPTS, first
from readme_blocks import NEEDS_THE_SERVER, README, readme_commands
from triton_requests import metrics
from specbuild.cli import main
from specbuild.serve.client import SpecbuildClient
from specbuild.serve.frontend import OpenAIFrontend

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Write a loop over a list"
PROMPT = "def main():\n    "
MAX_TOKENS = 24


class Served:
    """``specbuild serve`` running in a subprocess, with the endpoints it announced."""

    def __init__(self, process: subprocess.Popen[str], endpoints: dict[str, str]) -> None:
        self.process, self.endpoints = process, endpoints
        self.grpc_url = endpoints["gRPC"]
        self.openai_url = endpoints["OpenAI"]
        self.metrics_url = endpoints["metrics"]


@pytest.fixture(scope="module")
def served(tiny_chat_release) -> Iterator[Served]:
    process = subprocess.Popen(
        [sys.executable, "-m", "specbuild.cli", "serve", str(tiny_chat_release.repository), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", "--openai-port", "0", "--timeout", "300"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    endpoints: dict[str, str] = {}
    lines: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = re.match(r"^\s+(gRPC|HTTP|metrics|OpenAI)\s+(\S+)", line)
            if match:
                endpoints[match[1]] = match[2]

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 400
    while not any("press Ctrl-C" in line for line in lines):
        assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
    try:
        yield Served(process, endpoints)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)


@pytest.fixture(scope="module")
def client(served: Served) -> Any:
    return openai.OpenAI(base_url=served.openai_url, api_key="unused", max_retries=0, timeout=300)


def ensemble(served: Served, prompt: str, **options: Any) -> str:
    return SpecbuildClient(served.grpc_url, timeout=300).generate(prompt, MAX_TOKENS, **options).text


# --- chat ---------------------------------------------------------------------------------------------------------
def test_models_lists_the_release(client, tiny_chat_release):
    assert [model.id for model in client.models.list()] == [tiny_chat_release.spec.name] == ["tiny-chat"]
    assert client.models.retrieve("tiny-chat").owned_by == "specbuild"


def test_a_streamed_chat_completion_is_the_ensemble_s_greedy_answer(served, client):
    stream = client.chat.completions.create(
        model="tiny-chat", messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == ensemble(served, QUESTION, chat=True)  # the ensemble applies the same template
    assert len({c.id for c in chunks}) == 1 and finals in (["length"], ["stop"])
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens <= MAX_TOKENS
    assert usage.prompt_tokens == len(prompt_ids(served, QUESTION)) and usage.total_tokens == \
        usage.prompt_tokens + usage.completion_tokens
    whole = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == finals[0]
    assert whole.usage == usage


def prompt_ids(served: Served, question: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder(served)))
    templated = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                              add_generation_prompt=True)
    return tokenizer.encode(templated, add_special_tokens=False)


def tokenizer_folder(served: Served) -> Path:
    command = served.process.args
    return Path(command[command.index("serve") + 1]) / "preprocessing" / "1" / "tokenizer"


def readme_curls() -> list[list[str]]:
    """The README's ``curl`` commands, as argv."""
    return [shlex.split(command) for kind, command in readme_commands(README.read_text(encoding="utf-8"))
            if command.startswith(NEEDS_THE_SERVER)]


def curl(served: Served, argv: list[str], body: dict[str, Any] | None = None) -> str:
    """Run a README curl command on ``served``: its address in place of the README's, ``body`` in place of its own."""
    argv = [served.endpoints["HTTP"] + arg.removeprefix("localhost:8000") if arg.startswith("localhost:8000/")
            else arg for arg in argv]
    if body is not None:
        argv[argv.index("-d") + 1] = json.dumps(body)
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_s_curl_examples_answer_the_user_s_message(served):
    """The first request a user sends: through the chat template, the answer alone (as the gRPC client gets it),
    streamed as deltas; left in, the repeated input is the user's text, not the template around it."""
    commands = {next(arg for arg in argv if "/v2/models/" in arg).rsplit("/", 1)[-1]: argv for argv in readme_curls()}
    assert set(commands) == {"generate", "generate_stream"}
    client = SpecbuildClient(served.grpc_url, timeout=300)
    for endpoint, argv in commands.items():
        body = json.loads(argv[argv.index("-d") + 1])
        assert body["apply_chat_template"] is True
        answer = client.generate(body["text_input"], body["max_tokens"], chat=True).text
        output = curl(served, argv)
        if endpoint == "generate":
            assert json.loads(output)["text_output"] == answer
            echoed = json.loads(curl(served, argv, {**body, "exclude_input_in_output": False}))["text_output"]
            assert echoed == body["text_input"] + answer and "### user" not in echoed
        else:
            events = [json.loads(line.removeprefix("data: ")) for line in output.splitlines() if line.strip()]
            assert len(events) > 1 and "".join(event["text_output"] for event in events) == answer


# --- completions ----------------------------------------------------------------------------------------------------
def test_completions_greedy_stop_and_usage(served, client):
    greedy = ensemble(served, PROMPT)
    answer = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert answer.choices[0].text == greedy and answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == MAX_TOKENS
    stop = greedy[len(greedy) // 2: len(greedy) // 2 + 2]  # a string from the middle of the answer
    for stream in (False, True):
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(
                model="tiny-chat", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stop=[stop], stream=True))
        else:
            text = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                             stop=stop).choices[0].text
        assert text == greedy[: greedy.index(stop)]  # the text ends before the stop string


def test_a_seed_repeats_a_sample_and_a_temperature_alone_samples(served, client):
    def sample(seed: int) -> str:
        return client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=MAX_TOKENS, seed=seed,
                                         temperature=1.0).choices[0].text

    first = [sample(seed) for seed in range(4)]
    assert first == [sample(seed) for seed in range(4)]
    assert len(set(first)) > 1  # temperature 1 (OpenAI's default too) samples: different seeds differ
    # what the API sends: top_p 1 made explicit, so the ensemble samples the same way with the same seed
    assert first[0] == ensemble(served, PROMPT, temperature=1.0, top_p=1.0, seed=0)


def test_speculation_settings_are_extra_fields(served, client):
    before = metrics(served)
    alone = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"num_draft_tokens": 0})
    middle = metrics(served)
    drafted = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body={"num_draft_tokens": 3, "prompt_lookup": True})
    after = metrics(served)
    name = "specbuild_spec_decode_num_draft_tokens_total"
    assert middle[name] == before.get(name, 0) < after[name]
    assert alone.choices[0].text == drafted.choices[0].text  # greedy: exact whatever K


# --- a client that goes away ----------------------------------------------------------------------------------------
LONG = 480  # max_seq_len 512 less the prompt and max_draft_len: thousands of rounds' work if nothing stops it


def wait_for(served: Served, name: str, value: float) -> dict[str, float]:
    deadline = time.monotonic() + 120
    while (now := metrics(served)).get(name, 0) < value:
        assert time.monotonic() < deadline, f"{name} stayed at {now.get(name, 0)}, expected {value}"
        time.sleep(0.2)
    return now


def test_a_streamed_request_whose_client_goes_away_stops_and_is_counted(served, client):
    before = metrics(served)
    stream = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=LONG, temperature=0,
                                       stream=True, extra_body={"num_draft_tokens": 2})
    next(iter(stream))
    stream.close()
    after = wait_for(served, "specbuild_cancelled_requests_total",
                     before.get("specbuild_cancelled_requests_total", 0) + 1)
    generated = after["specbuild_output_tokens_total"] - before.get("specbuild_output_tokens_total", 0)
    assert generated < LONG  # it stopped within a round of the cancellation, far from the end


def target_calls(served: Served) -> float:
    """Triton's count of the target model's executions (each engine call of the orchestrator)."""
    with urllib.request.urlopen(served.metrics_url, timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith('nv_inference_exec_count{model="target"'))


def test_a_whole_request_whose_client_goes_away_stops_and_is_counted(served):
    """Not streamed: the API sees the connection close while it waits for the answer, and cancels."""
    before, calls = metrics(served), target_calls(served)
    host, port = served.openai_url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    body = json.dumps({"model": "tiny-chat", "prompt": PROMPT, "max_tokens": LONG, "temperature": 0,
                       "num_draft_tokens": 2}).encode()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 120
        while target_calls(served) == calls:  # close once the generation is under way
            assert time.monotonic() < deadline, "the request never reached the target"
            time.sleep(0.05)
    after = wait_for(served, "specbuild_cancelled_requests_total",
                     before.get("specbuild_cancelled_requests_total", 0) + 1)
    assert after["specbuild_output_tokens_total"] - before.get("specbuild_output_tokens_total", 0) < LONG


# --- errors ---------------------------------------------------------------------------------------------------------
def assert_openai_error(error: Any, status: int, param: str | None, message: str) -> None:
    assert error.status_code == status
    assert set(error.body) == {"message", "type", "param", "code"}  # the client unwraps {"error": {...}}
    assert error.body["param"] == param and message in error.body["message"]


@pytest.mark.parametrize(("request_", "status", "param", "message"), [
    ({"model": "gpt-4"}, 404, "model", "The model `gpt-4` does not exist"),
    ({"n": 2}, 400, "n", "n is not supported"),
    ({"temperature": 3}, 400, "temperature", "temperature"),
    ({"temperature": "abc"}, 400, "temperature", "temperature"),  # Triton's HTTP generate answers this with a 500
    ({"extra_body": {"beam_width": 2}}, 400, "beam_width", "Unrecognized request argument supplied: beam_width"),
    ({"logprobs": True}, 400, "logprobs", "logprobs is not supported"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice",
     "tool_choice auto (the default with tools) is not supported"),
    ({"max_tokens": 100_000}, 400, None, "exceeds max_seq_len"),
    ({"extra_body": {"num_draft_tokens": 99}}, 400, None, "num_draft_tokens must be within 0..8"),
    ({"messages": [{"role": "user", "content": "x" * 5000}]}, 400, "messages", "more than max_input_len"),
], ids=["unknown-model", "n", "temperature", "wrong-type", "unknown-field", "logprobs", "tools", "too-long", "k",
        "prompt"])
def test_errors_carry_openai_s_shape(client, request_, status, param, message):
    arguments = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **request_}
    with pytest.raises(openai.APIStatusError) as error:
        client.chat.completions.create(**arguments)
    assert_openai_error(error.value, status, param, message)


def test_chat_without_a_chat_template_is_refused_clearly(tiny_server, tiny_release):
    """The tiny release's tokenizer has no template: chat is a 400 naming messages; completions work."""
    with OpenAIFrontend(tiny_release.repository, tiny_server.grpc_url, "tiny", port=0) as frontend:
        plain = openai.OpenAI(base_url=frontend.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as error:
            plain.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert_openai_error(error.value, 400, "messages", "no chat template")
        assert plain.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
        with urllib.request.urlopen(frontend.url.removesuffix("/v1") + "/health/ready", timeout=30) as ready:
            assert ready.status == 200


# --- specbuild generate ---------------------------------------------------------------------------------------------
def test_generate_applies_the_chat_template_unless_raw_and_keeps_stdin_as_read(served):
    def generate(*args: str, stdin: str | None = None) -> str:
        result = CliRunner().invoke(main, ["generate", *args, "--url", served.grpc_url, "--max-tokens",
                                           str(MAX_TOKENS), "--no-stream"], input=stdin)
        assert result.exit_code == 0, result.output
        return result.stdout.removesuffix("\n")

    assert generate(QUESTION) == ensemble(served, QUESTION, chat=True)
    assert generate(PROMPT, "--raw") == ensemble(served, PROMPT)
    # stdin whose last newline changes the model's answer, so an answer to the stripped text would show
    lines = first((prompt.rstrip("\n ") + "\n" for prompt in CODE_PROMPTS),
                  lambda text: ensemble(served, text) != ensemble(served, text.rstrip("\n")),
                  "a prompt whose answer changes with its last newline")
    assert generate("-", "--raw", stdin=lines) == ensemble(served, lines)  # the last newline was kept


def test_specbuild_openai_serves_the_api_for_a_triton_running_elsewhere(tiny_server, tiny_release):
    """What the compose file's and the Kubernetes pod's front end run: the API alone, beside a Triton server."""
    from specbuild.serve.processes import free_port

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "specbuild.cli", "openai", str(tiny_release.repository),
                                "--triton", tiny_server.grpc_url, "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        announced = ""
        while "Ctrl-C" not in announced:  # the announcement may wrap over lines
            line = process.stderr.readline()
            assert line, f"specbuild openai ended: {announced}"
            announced += line
        assert f"http://127.0.0.1:{port}/v1" in announced
        plain = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [model.id for model in plain.models.list()] == ["tiny"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()


GUIDED_SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                                  "count": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "required": ["answer", "count"], "additionalProperties": False}


def test_response_format_json_schema_holds_the_answer_to_it_streamed_and_not(client):
    import jsonschema

    format_ = {"type": "json_schema", "json_schema": {"name": "reply", "schema": GUIDED_SCHEMA, "strict": True}}
    messages = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=48, temperature=0,
                                           response_format=format_, extra_body={"num_draft_tokens": 4})
    text = whole.choices[0].message.content
    jsonschema.validate(json.loads(text), GUIDED_SCHEMA)
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=48, temperature=0,
                                                 response_format=format_, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    anything = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=48, temperature=0,
                                              response_format={"type": "json_object"})
    content = anything.choices[0].message.content
    assert content.startswith("{")  # an object, complete unless the tiny model's 48 tokens ran out first
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


# Short: the tiny release's tokenizer takes about a token per character, and its template gets the tools in its
# system message.
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time"}}]


def test_a_named_or_required_tool_call_comes_back_as_tool_calls_streamed_and_not(client):
    """A forced call's arguments match the tool's schema, the stream assembles to the same call, and the call is the
    same at K=0 and K=4 (greedy)."""
    import jsonschema

    messages = [{"role": "user", "content": "Oslo weather?"}]

    def call(stream: bool, tool_choice: Any, k: int) -> tuple[str, str, str]:
        # room for a whole call: the tiny pair's tokenizer is trained at set-up, and its token count per character
        # can move with the set-up (48 tokens cut the "required" call short on a fresh set-up of 2026-12-02)
        answer = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=160, temperature=0,
                                                tools=TOOLS, tool_choice=tool_choice, stream=stream,
                                                extra_body={"num_draft_tokens": k})
        if not stream:
            choice = answer.choices[0]
            assert choice.message.content is None and len(choice.message.tool_calls) == 1
            made = choice.message.tool_calls[0]
            assert made.id.startswith("call_") and made.type == "function"
            return made.function.name, made.function.arguments, choice.finish_reason
        chunks = [chunk.choices[0] for chunk in answer if chunk.choices]
        deltas = [d for c in chunks for d in (c.delta.tool_calls or [])]
        assert deltas[0].id and all(d.id is None for d in deltas[1:]) and {d.index for d in deltas} == {0}
        return deltas[0].function.name, "".join(d.function.arguments or "" for d in deltas), chunks[-1].finish_reason

    named = {"type": "function", "function": {"name": "weather"}}
    name, arguments, finish = call(False, named, 4)
    assert (name, finish) == ("weather", "tool_calls")
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert call(True, named, 4) == call(False, named, 0) == (name, arguments, finish)
    chosen = call(False, "required", 4)
    assert chosen[0] in {"weather", "time"} and chosen[2] == "tool_calls"
    assert isinstance(json.loads(chosen[1]), dict)
    assert call(True, "required", 4) == call(False, "required", 0) == chosen


def test_a_tool_call_with_a_response_format_or_an_unknown_tool_is_refused(client):
    arguments = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                 "tools": TOOLS}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**arguments, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert_openai_error(error.value, 400, "tool_choice", "'nope', which is not among the tools")
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**arguments, tool_choice="required", response_format={"type": "json_object"})
    assert_openai_error(error.value, 400, "response_format", "send one of them")
