"""The ensemble clients: request encoding, SSE parsing, figures (fast), and against a real tritonserver (e2e).

The server serves tests/data/toy_triton: an ensemble with the public inputs and outputs over a decoupled
python model that echoes the prompt word by word ("tokens") and fills the acceptance outputs as
draft K * tokens / accepted half of them. It is a fixture for the client layer, not the product.
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.serve.client import (
    Chunk,
    Generation,
    GenerationRequest,
    SpecbuildClient,
    http_generate,
    http_generate_stream,
    parse_sse,
)
from specbuild.errors import RequestError, ServerError
from specbuild.serve.processes import free_port
from specbuild.serve.server import TritonServer
from locations import DATA

TOY = DATA / "toy_triton"


# --- fast -------------------------------------------------------------------------------------------------
def test_request_arrays_follow_the_contract_with_a_batch_of_one():
    arrays = GenerationRequest("héllo", 8, stream=True, temperature=0.5, seed=2**63, num_draft_tokens=3,
                               stop_words=["a", "bc"], use_draft_logits=False, prompt_lookup=True).arrays()
    assert arrays["text_input"].shape == (1, 1) and arrays["text_input"][0, 0] == "héllo".encode()
    assert arrays["max_tokens"].dtype == np.int32 and arrays["max_tokens"].shape == (1, 1)
    assert arrays["seed"].dtype == np.uint64 and arrays["seed"][0, 0] == 2**63
    assert arrays["temperature"].dtype == np.float32
    assert arrays["stream"].dtype == np.bool_ and arrays["use_draft_logits"][0, 0] == np.False_
    assert arrays["prompt_lookup"].dtype == np.bool_ and arrays["prompt_lookup"].shape == (1, 1)
    assert arrays["stop_words"].shape == (1, 2)
    assert arrays["exclude_input_in_output"][0, 0]
    assert "top_k" not in arrays and "bad_words" not in arrays  # unset: the server's default


def test_request_values_drop_unset_and_empty_inputs():
    assert GenerationRequest("x", 1, stop_words=[], exclude_input_in_output=None).values() == {
        "text_input": "x", "max_tokens": 1, "stream": False}


@pytest.mark.parametrize("request_, message", [
    (GenerationRequest("x", 1, seed=-1), "seed=-1 is out of range"),
    (GenerationRequest("x", 2**31), "max_tokens=2147483648 is out of range"),
    (GenerationRequest(b"x", 1), "prompt must be text"),  # type: ignore[arg-type]
    (GenerationRequest("x", 1, stop_words=[1]), "stop_words must be text"),  # type: ignore[list-item]
    (GenerationRequest("x", 1, temperature="hot"), "temperature='hot' is not a valid float32"),  # type: ignore[arg-type]
])
def test_bad_request_values_are_request_errors(request_, message):
    with pytest.raises(RequestError, match=message):
        request_.arrays()


def test_parse_sse_joins_data_lines_and_ignores_other_fields():
    stream = [b"data: {\"a\": 1}\n", b"\n", b": comment\n", b"event: x\n", b"data: one\n", b"data:two\n", b"\n",
              b"data: last"]
    assert list(parse_sse(stream)) == ['{"a": 1}', "one\ntwo", "last"]


def test_generation_takes_each_counters_latest_value_and_computes_rates():
    chunks = [Chunk("a", 0.5, 1, 0.5, 2, 1), Chunk(" b", 1.0, 2, 0.75, 4, 3), Chunk("\ufffd", 1.5)]
    generation = Generation.from_chunks(chunks, total_time=2.0)
    assert generation.text == "a b\ufffd"
    assert (generation.output_token_count, generation.acceptance_rate) == (2, 0.75)
    assert (generation.total_draft_tokens, generation.total_accepted_draft_tokens) == (4, 3)
    assert generation.time_to_first_chunk == 0.5 and generation.tokens_per_second == 1.0
    assert generation.summary() == ("2 tokens, 2.00 s, 1.0 tokens/s, first chunk 0.50 s, "
                                    "acceptance 0.75 (3/4 draft tokens)")
    empty = Generation.from_chunks([], total_time=1.0)
    assert empty.text == "" and empty.tokens_per_second is None and empty.time_to_first_chunk is None


def test_no_server_is_a_server_error_naming_the_address():
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerError, match=f"cannot reach Triton over gRPC at {url}"):
        SpecbuildClient(url, timeout=20).generate("x", 1)
    with pytest.raises(ServerError, match="cannot reach Triton over HTTP"):
        http_generate(url, GenerationRequest("x", 1), timeout=20)


def test_cli_generate_rejects_an_empty_prompt():
    result = CliRunner().invoke(main, ["generate", "-"], input="\n")
    assert result.exit_code == 2 and "the prompt is empty" in result.output


@pytest.mark.parametrize(("flags", "expected"), [([], None), (["--prompt-lookup"], True),
                                                 (["--no-prompt-lookup"], False)])
def test_cli_generate_sends_prompt_lookup_only_when_asked(monkeypatch, flags, expected):
    sent: list[GenerationRequest] = []

    def run(self, request, on_chunk=None):
        sent.append(request)
        return Generation.from_chunks([], 0.1)

    monkeypatch.setattr(SpecbuildClient, "run", run)  # the command's parsing is under test, not the server
    result = CliRunner().invoke(main, ["generate", "hello", *flags])
    assert result.exit_code == 0, result.output
    assert sent[0].prompt_lookup is expected
    assert ("prompt_lookup" in sent[0].arrays()) == (expected is not None)


# --- a real server ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("toy") / "repo"
    shutil.copytree(TOY, repository)
    with TritonServer(repository, startup_timeout=60) as running:
        yield running


@pytest.fixture
def client(server) -> SpecbuildClient:
    return SpecbuildClient(server.grpc_url, timeout=60)


@pytest.mark.e2e
@pytest.mark.slow
def test_generate_returns_text_and_figures(client):
    generation = client.generate("héllo wörld 世界 again", 3, num_draft_tokens=4)
    assert generation.text == "héllo wörld 世界"
    assert len(generation.chunks) == 1
    assert (generation.output_token_count, generation.total_draft_tokens, generation.total_accepted_draft_tokens) \
        == (3, 12, 6)
    assert generation.acceptance_rate == pytest.approx(0.5)
    assert generation.tokens_per_second and generation.tokens_per_second > 0


@pytest.mark.e2e
@pytest.mark.slow
def test_streamed_chunks_concatenate_to_the_whole_text(client):
    prompt = "one two → three 四 five"
    whole = client.generate(prompt, 10)
    streamed = client.generate(prompt, 10, stream=True)
    assert [chunk.text for chunk in streamed.chunks] == ["one", " two", " →", " three", " 四", " five"]
    assert streamed.text == whole.text == prompt
    assert [chunk.output_token_count for chunk in streamed.chunks] == [1, 2, 3, 4, 5, 6]
    assert streamed.output_token_count == whole.output_token_count == 6


@pytest.mark.e2e
@pytest.mark.slow
def test_chunks_arrive_before_the_request_ends(client, tmp_path):
    """The model holds the rest of its answer until the test has seen the first chunk (no timing)."""
    gate = tmp_path / "open"
    chunks = client.stream(f"gate:{gate} first second third", 10)
    first = next(chunks)
    assert first.text == "first" and not gate.exists()
    gate.touch()
    assert [chunk.text for chunk in chunks] == [" second", " third"]


@pytest.mark.e2e
@pytest.mark.slow
def test_closing_a_stream_early_leaves_the_server_serving(client, tmp_path):
    gate = tmp_path / "open"
    chunks = client.stream(f"gate:{gate} a b c", 10)
    assert next(chunks).text == "a"
    chunks.close()  # cancels the request
    gate.touch()
    assert client.generate("still here", 5).text == "still here"


@pytest.mark.e2e
@pytest.mark.slow
def test_server_errors_come_back_as_request_errors(client, server):
    with pytest.raises(RequestError, match="max_tokens must be at least 1, got 0"):
        client.generate("x", 0)
    with pytest.raises(RequestError, match="max_tokens must be at least 1, got -3"):
        list(client.stream("x", -3))
    with pytest.raises(RequestError, match="unknown"):
        SpecbuildClient(server.grpc_url, model="unknown").generate("x", 1)
    assert client.generate("ok then", 5).text == "ok then"


@pytest.mark.e2e
@pytest.mark.slow
def test_generate_many_keeps_order_and_matches_single_requests(client):
    requests = [GenerationRequest(f"p{i} " + "w " * (i % 4) + "end", 8, stream=i % 2 == 0, num_draft_tokens=i % 3)
                for i in range(16)]
    alone = [client.run(request) for request in requests]
    together = client.generate_many(requests, concurrency=16)
    assert [g.text for g in together] == [g.text for g in alone]
    assert [g.total_draft_tokens for g in together] == [g.total_draft_tokens for g in alone]


@pytest.mark.e2e
@pytest.mark.slow
def test_generate_many_raises_or_returns_errors(client):
    requests = [GenerationRequest("a", 1), GenerationRequest("b", 0), GenerationRequest("c", 1)]
    with pytest.raises(RequestError, match="got 0"):
        client.generate_many(requests, concurrency=2)
    results = client.generate_many(requests, concurrency=2, return_exceptions=True)
    assert results[0].text == "a" and isinstance(results[1], RequestError) and results[2].text == "c"


@pytest.mark.e2e
@pytest.mark.slow
def test_http_generate_and_generate_stream(server):
    request = GenerationRequest("x ÿ z", 5, stop_words=["q"], num_draft_tokens=2)
    whole = http_generate(server.http_url, request)
    assert whole.text == "x ÿ z" and whole.output_token_count == 3 and whole.total_draft_tokens == 6
    chunks = list(http_generate_stream(server.http_url, request))
    assert [chunk.text for chunk in chunks] == ["x", " ÿ", " z"]
    assert chunks[-1].acceptance_rate == pytest.approx(0.5)
    with pytest.raises(RequestError, match=r"HTTP 400\): in ensemble 'ensemble', max_tokens must be at least 1"):
        http_generate(server.http_url, GenerationRequest("x", 0))
    with pytest.raises(RequestError, match=r"HTTP 400\): in ensemble 'ensemble', max_tokens must be at least 1"):
        list(http_generate_stream(server.http_url, GenerationRequest("x", 0)))


@pytest.mark.e2e
@pytest.mark.slow
def test_cli_generate_streams_text_and_reports_figures(server):
    runner = CliRunner()
    result = runner.invoke(main, ["generate", "-", "--url", server.grpc_url, "--max-tokens", "2",
                                  "--num-draft-tokens", "2", "--stop", "zz"], input="hello there world\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello there\n"
    assert "2 tokens" in result.stderr and "acceptance 0.50 (2/4 draft tokens)" in result.stderr
    failed = runner.invoke(main, ["generate", "x", "--url", server.grpc_url, "--model", "unknown"])
    assert failed.exit_code == 1 and "error:" in failed.stderr and "Traceback" not in failed.output


@pytest.mark.e2e
@pytest.mark.slow
def test_concurrent_streams_from_threads(client):
    results: dict[int, str] = {}

    def worker(index: int) -> None:
        results[index] = "".join(chunk.text for chunk in client.stream(f"t{index} a b", 5))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {i: f"t{i} a b" for i in range(8)}


def test_cli_generate_sends_one_guide_from_its_file_or_flag(monkeypatch, tmp_path):
    sent: list[GenerationRequest] = []

    def run(self, request, on_chunk=None):
        sent.append(request)
        return Generation.from_chunks([], 0.1)

    monkeypatch.setattr(SpecbuildClient, "run", run)  # the command's parsing is under test, not the server
    schema, grammar = tmp_path / "schema.json", tmp_path / "grammar.ebnf"
    schema.write_text('{"type": "object"}')
    grammar.write_text('root ::= "yes" | "no"')
    for flags in (["--json-schema", str(schema)], ["--regex", "[ab]+"], ["--grammar", str(grammar)], []):
        assert CliRunner().invoke(main, ["generate", "hello", *flags]).exit_code == 0
    assert [(r.guided_decoding_guide_type, r.guided_decoding_guide) for r in sent] == [
        ("json_schema", '{"type": "object"}'), ("regex", "[ab]+"), ("ebnf_grammar", 'root ::= "yes" | "no"'),
        (None, None)]
    both = CliRunner().invoke(main, ["generate", "hello", "--regex", "a", "--grammar", str(grammar)])
    assert both.exit_code == 2 and "pass one of them" in both.output
