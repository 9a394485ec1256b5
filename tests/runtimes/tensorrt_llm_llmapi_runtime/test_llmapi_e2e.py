"""A tensorrt-llm-llmapi release end to end on a real Triton server, rehearsed on the CPU: the release's own
ensemble and adapter, a torch stand-in in TensorRT-LLM's place (``serve --rehearse``). Greedy answers are
compared with the torch release of the same pair (the session's ``tiny_server``): identical text, whatever
runtime sits behind the ensemble."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from specbuild.errors import RequestError
from specbuild.runtimes.tensorrt_llm_llmapi.contract import ADAPTER_MODEL
from specbuild.serve.client import GenerationRequest, SpecbuildClient
from specbuild.package.manifest import read_release
from specbuild.runtimes.tensorrt_llm_llmapi.rehearsal import rehearsal_repository
from specbuild.serve.server import TritonServer
from triton_requests import http_answer, infer_stream, metrics, raw_stream, scalars, text_array, texts_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = ("def main():\n    ", "import os\nimport sys\n\n", "class Config:\n    def __init__(self")
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def llmapi_server(tiny_llmapi_release, tmp_path_factory):
    repository = rehearsal_repository(read_release(tiny_llmapi_release.repository), tmp_path_factory.mktemp("rehearsal"))
    with TritonServer(repository, startup_timeout=300) as server:
        yield server


@pytest.fixture(scope="module")
def llmapi_client(llmapi_server) -> SpecbuildClient:
    return SpecbuildClient(llmapi_server.grpc_url, timeout=300)


def adapter_metrics(server: TritonServer) -> dict[str, float]:
    return metrics(server, ADAPTER_MODEL)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_the_torch_release(llmapi_client, tiny_client, prompt: str) -> None:
    request = GenerationRequest(prompt, MAX_TOKENS)
    # TensorRT-LLM drafts every round (no per-request break-even): the torch release's reference with it off
    served, reference = llmapi_client.run(request), tiny_client.run(replace(request, break_even=False))
    assert served.text == reference.text and served.text
    # the same drafts verified the same way (greedy, K=4): the same statistics, as TensorRT-LLM reports them
    assert (served.total_draft_tokens, served.total_accepted_draft_tokens) == (
        reference.total_draft_tokens, reference.total_accepted_draft_tokens)
    assert served.acceptance_rate == pytest.approx(reference.acceptance_rate)
    # text only from the LLM-API model: exact at max_tokens, else counted again from the text
    assert served.output_token_count > 0
    if reference.output_token_count == MAX_TOKENS:
        assert served.output_token_count == MAX_TOKENS


def test_a_streamed_request_on_the_1_2_line_gets_the_whole_text(llmapi_client, tiny_client) -> None:
    """TensorRT-LLM 1.2.1 cannot stream through its Triton model (``streaming`` lands in ``lora_request``): the
    adapter asks for the whole answer, and the stream carries it in one response."""
    served = llmapi_client.run(GenerationRequest(PROMPTS[0], MAX_TOKENS, stream=True))
    assert served.text == tiny_client.run(GenerationRequest(PROMPTS[0], MAX_TOKENS)).text
    assert [chunk.text for chunk in served.chunks if chunk.text] == [served.text]


@pytest.fixture(scope="module")
def main_line_server(tiny_llmapi_release, tmp_path_factory):
    """The same release packaged for TensorRT-LLM main (``triton.tensorrt_llm: main``), whose model streams."""
    from specbuild import compiler

    root = tmp_path_factory.mktemp("main-line")
    spec = tiny_llmapi_release.spec.model_copy(deep=True)
    spec.triton.tensorrt_llm = "main"
    spec.outputs.repository_dir, spec.outputs.build_dir = str(root / "triton_repo"), str(root / "build")
    repository = rehearsal_repository(read_release(compiler.run(spec, json_mode=True).repository), root / "rehearsal")
    with TritonServer(repository, startup_timeout=300) as server:
        yield server


def test_on_the_main_line_chunks_stream_as_deltas(main_line_server, tiny_client) -> None:
    client = SpecbuildClient(main_line_server.grpc_url, timeout=300)
    served = client.run(GenerationRequest(PROMPTS[2], MAX_TOKENS, stream=True))
    assert served.text == tiny_client.run(GenerationRequest(PROMPTS[2], MAX_TOKENS)).text
    texts = [chunk.text for chunk in served.chunks if chunk.text]
    assert len(texts) > 1 and "".join(texts) == served.text


def test_a_cancelled_stream_stops_the_adapter_and_the_server_keeps_serving(main_line_server) -> None:
    before = adapter_metrics(main_line_server)
    arrays = {"text_input": text_array(PROMPTS[0]), "max_tokens": scalars(400, np.int32),
              "stream": scalars(True, bool)}
    responses, error = raw_stream(main_line_server, ADAPTER_MODEL, arrays, chunks=2)
    assert len(responses) == 2 and error is None
    deadline = time.monotonic() + 60
    while adapter_metrics(main_line_server).get("specbuild_cancelled_requests_total", 0) == before.get(
            "specbuild_cancelled_requests_total", 0):
        assert time.monotonic() < deadline, "the adapter never saw the cancellation"
        time.sleep(0.2)
    assert adapter_metrics(main_line_server)["specbuild_requests_in_flight"] == 0
    client = SpecbuildClient(main_line_server.grpc_url, timeout=300)
    assert client.run(GenerationRequest(PROMPTS[1], 4)).output_token_count == 4


# Decoupled streams the stress test opens (loopback), at most STRESS_AT_ONCE at a time: every other one is cancelled
# after its first chunk (a long answer, still running), the rest run to their end.
STRESS_STREAMS, STRESS_AT_ONCE = 24, 8


def test_many_decoupled_streams_with_cancels_end_every_bls_stream(main_line_server) -> None:
    """The adapter's synchronous decoupled BLS calls (worker threads, no async_exec) under many concurrent streams,
    half of them cancelled mid-answer: every stream ends, every cancel reaches the adapter, nothing stays in flight,
    and the server answers after."""
    from concurrent.futures import ThreadPoolExecutor

    before = adapter_metrics(main_line_server).get("specbuild_cancelled_requests_total", 0)

    def stream(index: int) -> tuple[list, str | None]:
        cancelled = index % 2 == 1
        arrays = {"text_input": text_array(PROMPTS[index % len(PROMPTS)]), "stream": scalars(True, bool),
                  "max_tokens": scalars(400 if cancelled else 8, np.int32)}
        return raw_stream(main_line_server, ADAPTER_MODEL, arrays, chunks=1 if cancelled else None, timeout=300)

    with ThreadPoolExecutor(STRESS_AT_ONCE) as pool:
        results = list(pool.map(stream, range(STRESS_STREAMS)))
    assert [error for _, error in results] == [None] * STRESS_STREAMS
    for index, (responses, _) in enumerate(results):
        final = responses[-1].get_response().parameters.get("triton_final_response")
        assert (final is not None and final.bool_param) == (index % 2 == 0), index  # finished, or cut after one
    deadline = time.monotonic() + 120
    while (adapter_metrics(main_line_server).get("specbuild_cancelled_requests_total", 0) - before
           < STRESS_STREAMS // 2 or adapter_metrics(main_line_server)["specbuild_requests_in_flight"]):
        assert time.monotonic() < deadline, f"the adapter did not see every cancel: {adapter_metrics(main_line_server)}"
        time.sleep(0.2)
    client = SpecbuildClient(main_line_server.grpc_url, timeout=300)
    assert client.run(GenerationRequest(PROMPTS[1], 4)).output_token_count == 4


def test_stop_words_end_the_text_as_on_the_torch_release(llmapi_client, tiny_client, target_alone,
                                                         tokenizer) -> None:
    """A stop word that the greedy answer contains (two of its tokens, which the tokenizer encodes back the same):
    both runtimes end the text with it (TensorRT-LLM leaves it out; the adapter puts it back)."""
    tokens = list(target_alone(PROMPTS[2], MAX_TOKENS).tokens)
    at = next(i for i in range(2, len(tokens) - 2) if tokenizer.encode(tokenizer.decode(tokens[i:i + 2]),
                                                                        add_special_tokens=False) == tokens[i:i + 2]
              and tokens[i:i + 2] not in [tokens[j:j + 2] for j in range(i)])
    stop = tokenizer.decode(tokens[at:at + 2])
    request = GenerationRequest(PROMPTS[2], MAX_TOKENS, stop_words=[stop])
    stopped, reference = llmapi_client.run(request), tiny_client.run(request)
    assert reference.text == tokenizer.decode(tokens[:at + 2]) and reference.text.endswith(stop)
    assert stopped.text == reference.text


def test_the_prompt_is_kept_unless_excluded(llmapi_client) -> None:
    whole = llmapi_client.run(GenerationRequest(PROMPTS[0], 8, exclude_input_in_output=False))
    assert whole.text == PROMPTS[0] + llmapi_client.run(GenerationRequest(PROMPTS[0], 8)).text


def test_a_batch_of_rows_returns_what_each_row_returns_alone(llmapi_server, llmapi_client) -> None:
    inputs = {"text_input": text_array(PROMPTS[0], PROMPTS[1]), "max_tokens": scalars(12, np.int32, 2),
              "exclude_input_in_output": scalars(True, bool, 2)}
    assert texts_of(infer_stream(llmapi_server.grpc_url, inputs)) == [
        llmapi_client.run(GenerationRequest(prompt, 12)).text for prompt in PROMPTS[:2]]


def test_seeded_sampling_is_reproducible(llmapi_client) -> None:
    request = GenerationRequest(PROMPTS[2], 16, temperature=1.0, seed=1234)
    assert llmapi_client.run(request).text == llmapi_client.run(request).text


@pytest.mark.parametrize(("request_values", "named"), [
    ({"num_draft_tokens": 2}, "num_draft_tokens=2: this release drafts 4 tokens per round"),
    ({"use_draft_logits": True}, "use_draft_logits=True"),
    ({"prompt_lookup": True}, "prompt_lookup=True"),
    ({"bad_words": ["def"]}, "bad_words=['def']"),
])
def test_what_the_llm_api_cannot_honour_is_refused_and_the_server_keeps_serving(llmapi_server, llmapi_client,
                                                                                 request_values, named) -> None:
    before = adapter_metrics(llmapi_server)
    with pytest.raises(RequestError, match=named.replace("[", r"\[").replace("]", r"\]")):
        llmapi_client.run(GenerationRequest(PROMPTS[0], 8, **request_values))
    assert llmapi_client.run(GenerationRequest(PROMPTS[0], 8, num_draft_tokens=4)).text
    after = adapter_metrics(llmapi_server)
    assert after["specbuild_request_errors_total"] - before.get("specbuild_request_errors_total", 0) == 1


def test_http_generate_refuses_a_key_that_is_no_input_naming_it(llmapi_server) -> None:
    status, text = http_answer(llmapi_server, "/v2/models/ensemble/generate",
                               {"text_input": PROMPTS[0], "max_tokens": 4, "temprature": 0.9})
    assert status == 400 and "llmapi_adapter: unknown input 'temprature' (did you mean 'temperature'?)" in text


def test_the_adapter_counts_what_the_responses_report(llmapi_server, llmapi_client) -> None:
    before = adapter_metrics(llmapi_server)
    served = llmapi_client.run(GenerationRequest(PROMPTS[1], MAX_TOKENS))
    after = adapter_metrics(llmapi_server)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("specbuild_requests_total") == 1
    assert grew("specbuild_output_tokens_total") == served.output_token_count
    assert grew("specbuild_spec_decode_num_draft_tokens_total") == served.total_draft_tokens
    assert grew("specbuild_spec_decode_num_accepted_tokens_total") == served.total_accepted_draft_tokens
    assert after["specbuild_requests_in_flight"] == 0
    # the latency histograms, timed on the LLM-API model's text: once each (TPOT: the answer has several tokens)
    for name in ("time_to_first_token", "time_per_output_token", "e2e_request_latency", "request_queue_time"):
        assert grew(f"specbuild_{name}_seconds_count") == 1, name
    assert 0 < grew("specbuild_time_to_first_token_seconds_sum") <= grew("specbuild_e2e_request_latency_seconds_sum") \
        < served.total_time
