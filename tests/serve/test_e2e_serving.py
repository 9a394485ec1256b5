"""The served product end to end: the tiny pair compiled with the torch runtime, on a real Triton server.

One server (the session's ``tiny_server``) answers every test but the draft-fallback one, which starts its
own with explicit model control so that it can unload the draft. References come from the same engine
weights run in process (:class:`~specbuild.runtimes.torch.inprocess.InProcessSpeculator`, target alone), so "exact" means
token-identical to the target alone, whatever K, streaming, batching or concurrency.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter

import numpy as np
import pytest
import torch

from model_probes import CODE_PROMPTS, first, one_token_word
from triton_requests import delta, http_answer, http_post, infer_stream, metrics, scalars, text_array, texts_of
from specbuild.serve.client import GenerationRequest, SpecbuildClient, parse_sse
from specbuild.package.contract import ENSEMBLE_MODEL
from specbuild.serve.server import TritonServer
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.rules import SamplingParams, probabilities

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = ("def main():\n    ", "import os\nimport sys\n\n", "class Config:\n    def __init__(self")
MAX_TOKENS = 24
ALPHA = 0.001  # significance level of the distribution test (its seeds are fixed, so its outcome is too)


# --- 1. greedy through the ensemble equals the target alone ------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_greedy_output_equals_the_target_alone(tiny_client, target_alone, k):
    accepted = 0
    for prompt in PROMPTS:
        expected = target_alone(prompt, MAX_TOKENS)
        got = tiny_client.generate(prompt, MAX_TOKENS, num_draft_tokens=k)
        assert got.text == expected.text, f"K={k}, prompt {prompt!r}"
        assert got.output_token_count == len(expected.tokens)
        assert (got.total_draft_tokens > 0) == (k > 0)
        accepted += got.total_accepted_draft_tokens
    if k:
        assert accepted > 0, "no draft token was ever accepted: the accepting path went untested"


def test_greedy_output_is_exact_with_adaptive_k_and_token_matching(tiny_client, target_alone):
    for prompt in PROMPTS:
        got = tiny_client.generate(prompt, MAX_TOKENS, num_draft_tokens=2, adaptive_draft=True,
                                   use_draft_logits=False)
        assert got.text == target_alone(prompt, MAX_TOKENS).text


# --- 2. streaming ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 3])
def test_streamed_chunks_arrive_before_the_end_and_join_to_the_whole_text(tiny_client, target_alone, k):
    prompt = PROMPTS[0]
    chunks = list(tiny_client.stream(prompt, 32, num_draft_tokens=k))
    whole = tiny_client.generate(prompt, 32, num_draft_tokens=k)
    assert "".join(chunk.text for chunk in chunks) == whole.text == target_alone(prompt, 32).text
    counts = [chunk.output_token_count for chunk in chunks]
    # Partial answers were sent while the request ran: the first response carried only the first round.
    assert len([c for c in chunks if c.text]) > 1
    assert counts == sorted(counts) and counts[0] < counts[-1] == whole.output_token_count


def partial_characters_only(tokenizer) -> tuple[str, ...]:
    """Bad words that leave the model only tokens holding part of a multi-byte character: every token whose
    text is complete (and encodes back to that token, so banning the text bans it), the end token included."""
    banned = []
    for token in range(len(tokenizer)):
        text = tokenizer.decode([token])
        if text and "\ufffd" not in text and tokenizer.encode(text, add_special_tokens=False) == [token]:
            banned.append(text)
    return tuple(banned)


def split_characters(tokenizer, tokens: tuple[int, ...]) -> int:
    """How many valid non-ASCII characters only complete with a token that cannot show them on its own."""
    def valid(text: str) -> int:
        return sum(1 for c in text if not c.isascii() and c != "\ufffd")

    return sum(1 for end in range(1, len(tokens))
               if tokenizer.decode(tokens[:end]).endswith("\ufffd") and valid(tokenizer.decode([tokens[end]])) == 0
               and valid(tokenizer.decode(tokens[:end + 1])) > valid(tokenizer.decode(tokens[:end])))


def test_streaming_never_splits_a_multibyte_character(tiny_client, tokenizer, target_alone):
    """Only tokens holding part of a character are allowed, and a seed is picked whose sample completes some
    characters across tokens; streamed one token per response, such a character is held back, never cut."""
    prompt = "naïve café → "
    bad_words = partial_characters_only(tokenizer)
    seed = next(seed for seed in range(50)
                if split_characters(tokenizer, target_alone(prompt, MAX_TOKENS, bad_words, seed).tokens))
    expected = target_alone(prompt, MAX_TOKENS, bad_words, seed)
    # break_even off: a stretch it pauses drafting for runs in one call unstreamed and token by token streamed, and
    # a seeded request's draws follow its calls
    sampled = {"temperature": 1.0, "top_p": 1.0, "seed": seed, "bad_words": bad_words, "break_even": False}
    chunks = [c.text for c in tiny_client.stream(prompt, MAX_TOKENS, num_draft_tokens=0, **sampled)]
    assert "".join(chunks) == expected.text and "" in chunks
    speculative = [c.text for c in tiny_client.stream(prompt, MAX_TOKENS, num_draft_tokens=3, **sampled)]
    whole = tiny_client.generate(prompt, MAX_TOKENS, num_draft_tokens=3, exclude_input_in_output=False, **sampled)
    assert whole.text == prompt + "".join(speculative)


# --- 3. concurrency and batches ----------------------------------------------------------------------------
def mixed_requests(count: int) -> list[GenerationRequest]:
    requests = []
    for i in range(count):
        sampling = {"temperature": 0.8, "top_k": 40, "seed": 1000 + i} if i % 3 == 0 else {}
        requests.append(GenerationRequest(PROMPTS[i % len(PROMPTS)], 12 + i % 5, stream=i % 2 == 0,
                                          num_draft_tokens=(0, 1, 3, 5)[i % 4], **sampling))
    return requests


def test_sixteen_requests_in_flight_return_what_they_return_alone(tiny_client):
    requests = mixed_requests(16)
    alone = [tiny_client.run(request) for request in requests]
    together = tiny_client.generate_many(requests, concurrency=len(requests))
    assert [g.text for g in together] == [g.text for g in alone]
    assert [g.output_token_count for g in together] == [g.output_token_count for g in alone]


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_of_rows_returns_what_each_row_returns_alone(tiny_server, tiny_client, stream):
    prompts, ks = PROMPTS[:2], (1, 4)
    responses = infer_stream(tiny_server.grpc_url, {
        "text_input": text_array(*prompts),
        "max_tokens": np.array([[10], [16]], dtype=np.int32),
        "num_draft_tokens": np.array([[k] for k in ks], dtype=np.int32),
        "stream": scalars(stream, bool, 2),
        "exclude_input_in_output": scalars(True, bool, 2),
    })
    alone = [tiny_client.generate(p, n, num_draft_tokens=k).text for p, n, k in zip(prompts, (10, 16), ks)]
    assert texts_of(responses) == alone
    assert sorted({int(r.as_numpy("batch_index")[0][0]) for r in responses}) == [0, 1]  # one row per response
    assert (len(responses) > 2) == stream


# --- 4. sampling --------------------------------------------------------------------------------------------
def test_seeded_sampling_is_reproducible(tiny_client):
    settings = {"temperature": 1.0, "top_p": 0.95, "num_draft_tokens": 3}
    first = [tiny_client.generate(PROMPTS[1], 16, seed=seed, **settings).text for seed in range(4)]
    again = [tiny_client.generate(PROMPTS[1], 16, seed=seed, **settings).text for seed in range(4)]
    assert first == again
    assert len(set(first)) > 1, "different seeds should give different samples"


def exact_text_distribution(model_dir, tokenizer, prompt: str, params: SamplingParams,
                            tokens: int) -> dict[str, float]:
    """P(text) of ``tokens`` sampled tokens (stopping at the end token), computed exactly from a model's logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompt_ids = tokenizer.encode(prompt)
    eos = tokenizer.eos_token_id
    distribution: Counter[str] = Counter()
    frontier: list[tuple[list[int], float]] = [([], 1.0)]  # unfinished texts of one length, with their P
    with torch.inference_mode():
        for step in range(tokens):
            rows = probabilities(model(torch.tensor([prompt_ids + ids for ids, _ in frontier])).logits[:, -1], params)
            grown = []
            for (ids, p), row in zip(frontier, rows):
                for token in (int(t) for t in torch.nonzero(row).flatten()):
                    if token == eos or step == tokens - 1:
                        text = ids if token == eos else ids + [token]
                        distribution[tokenizer.decode(text, skip_special_tokens=True)] += p * float(row[token])
                    else:
                        grown.append((ids + [token], p * float(row[token])))
            frontier = grown
    return dict(distribution)


def chi_square_p_value(observed: Counter[str], expected: dict[str, float]) -> float:
    """Pearson's test; outcomes expected fewer than 5 times are pooled into one bin."""
    from scipy.stats import chisquare

    total = sum(observed.values())
    big = [text for text, p in expected.items() if p * total >= 5]
    counts = [observed[text] for text in big]
    means = [expected[text] * total for text in big]
    rest_count, rest_mean = total - sum(counts), total - sum(means)
    if rest_mean >= 5 or rest_count:
        counts.append(rest_count)
        means.append(max(rest_mean, 1e-9))
    return float(chisquare(counts, np.array(means) * sum(counts) / sum(means)).pvalue)


@pytest.mark.parametrize("use_draft_logits", [True, False], ids=["rejection", "token-match"])
def test_sampled_outputs_follow_the_targets_distribution(tiny_client, tiny_release, tokenizer, use_draft_logits):
    """Three tokens per request with K=3 (the first the target's alone, then one drafted token, verified, and a
    bonus or a third round): the texts of N seeded requests against the target's exact distribution, by chi-square
    at ``ALPHA``. The same counts must reject the draft's distribution, so the test can tell them apart."""
    prompt, samples, tokens = PROMPTS[2], 320, 3
    params = SamplingParams(temperature=1.0, top_k=3)
    requests = [GenerationRequest(prompt, tokens, temperature=1.0, top_k=3, seed=seed, num_draft_tokens=3,
                                  use_draft_logits=use_draft_logits) for seed in range(samples)]
    results = tiny_client.generate_many(requests, concurrency=8)
    drafted = sum(g.total_draft_tokens for g in results)
    accepted = sum(g.total_accepted_draft_tokens for g in results)
    assert 0 < accepted < drafted, "both acceptance and rejection must occur for the test to mean anything"
    observed = Counter(g.text for g in results)
    target = exact_text_distribution(tiny_release.engines / "target", tokenizer, prompt, params, tokens)
    draft = exact_text_distribution(tiny_release.engines / "draft", tokenizer, prompt, params, tokens)
    assert chi_square_p_value(observed, target) > ALPHA
    assert chi_square_p_value(observed, draft) < ALPHA


# --- 5. clients written for NVIDIA's tensorrtllm_backend ensemble -------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_a_tensorrtllm_backend_client_request_works(tiny_server, target_alone, tokenizer, stream):
    """Only input names of NVIDIA's ensemble, shaped as its end_to_end_grpc_client sends them, with a stop
    word taken from the expected output: the answer ends right after it."""
    prompt = first((PROMPTS[0], *CODE_PROMPTS),
                   lambda p: one_token_word(target_alone(p, MAX_TOKENS).tokens, tokenizer) is not None,
                   "an answer with a one-token word after its first token (the stop word)")
    expected = target_alone(prompt, MAX_TOKENS)
    token = one_token_word(expected.tokens, tokenizer)
    stop = tokenizer.decode([token])
    cut = expected.tokens.index(token) + 1
    responses = infer_stream(tiny_server.grpc_url, {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones((1, 1), dtype=np.int32) * MAX_TOKENS,
        "stream": np.array([[stream]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "top_k": np.array([[1]], dtype=np.int32),
        "stop_words": np.array([[stop]], dtype=object),
        "bad_words": np.array([[""]], dtype=object),
        "end_id": np.array([[tokenizer.eos_token_id]], dtype=np.int32),
        "pad_id": np.array([[tokenizer.pad_token_id]], dtype=np.int32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
        "return_perf_metrics": np.array([[True]], dtype=bool),
    }, outputs=("text_output", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"))
    text = tokenizer.decode(list(expected.tokens[:cut]), skip_special_tokens=True)
    assert texts_of(responses) == [text if stream else prompt + text]  # streamed text leaves out the prompt
    assert responses[-1].as_numpy("total_draft_tokens")[0, 0] > 0


def test_triton_http_generate_endpoints(tiny_server, target_alone):
    prompt = PROMPTS[1]
    expected = target_alone(prompt, MAX_TOKENS)
    body = {"text_input": prompt, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""}
    answer = json.loads(http_post(tiny_server, f"/v2/models/{ENSEMBLE_MODEL}/generate", body))
    assert answer["text_output"] == prompt + expected.text
    assert answer["output_token_count"] == len(expected.tokens)
    events = [json.loads(data) for data in parse_sse(
        http_post(tiny_server, f"/v2/models/{ENSEMBLE_MODEL}/generate_stream", {**body, "stream": True})
        .splitlines(keepends=True))]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected.text


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_http_generate_refuses_a_key_that_is_no_input_naming_it(tiny_server, endpoint):
    """Triton passes a key that names no input (also inside a ``parameters`` object) to the ensemble as a request
    parameter; its first model refuses it, naming it, with the input it was probably meant to be."""
    path = f"/v2/models/{ENSEMBLE_MODEL}/{endpoint}"
    body = {"text_input": PROMPTS[0], "max_tokens": 4, "stream": endpoint == "generate_stream"}
    for extra, named in (({"temprature": 0.9}, "unknown input 'temprature' (did you mean 'temperature'?)"),
                         ({"no_such_input": 1}, "unknown input 'no_such_input':"),
                         ({"parameters": {"max_token": 3}}, "unknown input 'max_token' (did you mean 'max_tokens'?)")):
        status, text = http_answer(tiny_server, path, {**body, **extra})
        assert status == 400 and named in text, (extra, status, text)
    # The request's id is Triton's own key (it also arrives as a parameter), not a setting.
    status, text = http_answer(tiny_server, path, {**body, "id": "request-7"})
    assert status == 200 and '"id":"request-7"' in text
    # A value of the wrong JSON type is answered by Triton itself, before any model sees the request: an HTTP 500
    # that does not name the input (docs/reliability.md); the OpenAI-compatible API refuses it with a 400 naming it.
    status, text = http_answer(tiny_server, path, {**body, "temperature": "abc"})
    assert status == 500 and "attempt to access JSON non-number as double" in text
    assert tiny_server.model_ready(ENSEMBLE_MODEL)


# --- 6. metrics ---------------------------------------------------------------------------------------------
def test_metrics_endpoint_counts_what_the_responses_report(tiny_server, tiny_client):
    before = metrics(tiny_server)
    results = [tiny_client.generate(PROMPTS[0], 16, num_draft_tokens=3),
               tiny_client.generate(PROMPTS[1], 12, num_draft_tokens=5, stream=True),
               tiny_client.generate(PROMPTS[2], 8, num_draft_tokens=0),
               tiny_client.generate(PROMPTS[2], 10, num_draft_tokens=2, temperature=0.9, top_p=1.0, seed=7)]
    after = metrics(tiny_server)
    assert delta(before, after, "specbuild_requests_total") == len(results)
    assert delta(before, after, "specbuild_output_tokens_total") == sum(g.output_token_count for g in results)
    drafted = sum(g.total_draft_tokens for g in results)
    accepted = sum(g.total_accepted_draft_tokens for g in results)
    assert delta(before, after, "specbuild_spec_decode_num_draft_tokens_total") == drafted > 0
    assert delta(before, after, "specbuild_spec_decode_num_accepted_tokens_total") == accepted
    assert delta(before, after, "specbuild_spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert 0 < delta(before, after, "specbuild_spec_decode_num_drafts_total") \
        <= delta(before, after, "specbuild_spec_decode_rounds_total")
    assert delta(before, after, "specbuild_draft_fallbacks_total") == 0
    for g in results:
        assert g.acceptance_rate == pytest.approx(g.total_accepted_draft_tokens / g.total_draft_tokens
                                                  if g.total_draft_tokens else 0.0)


def test_latency_histograms_time_each_request_once_within_what_the_client_saw(tiny_server, tiny_client):
    """Each finished request is observed once by every histogram (TPOT from its second token on); the server's
    TTFT and end-to-end times lie within what the client measured around them (the server's clock starts after
    the client sent, its first token goes before the client receives it)."""
    before = metrics(tiny_server)
    results = [tiny_client.generate(PROMPTS[0], 16, num_draft_tokens=3, stream=True),
               tiny_client.generate(PROMPTS[1], 1, num_draft_tokens=2, stream=True),
               tiny_client.generate(PROMPTS[2], 12, num_draft_tokens=0, stream=True)]
    after = metrics(tiny_server)
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert delta(before, after, f"specbuild_{name}_seconds_count") == len(results), name
    assert delta(before, after, "specbuild_time_per_output_token_seconds_count") == \
        sum(g.output_token_count > 1 for g in results)
    ttft = delta(before, after, "specbuild_time_to_first_token_seconds_sum")
    e2e = delta(before, after, "specbuild_e2e_request_latency_seconds_sum")
    queue = delta(before, after, "specbuild_request_queue_time_seconds_sum")
    assert 0 < queue < ttft < sum(g.time_to_first_chunk for g in results)
    assert ttft < e2e < sum(g.total_time for g in results)


def test_in_flight_gauge_counts_the_requests_being_served(tiny_server, tiny_client):
    """``specbuild_requests_in_flight``, the autoscaling signal: 1 while a streamed request is served, 0 after."""
    chunks = tiny_client.chunks(GenerationRequest(PROMPTS[0], 400, stream=True, num_draft_tokens=2))
    next(chunks)  # the orchestrator has answered the first round: the request is being served
    during = metrics(tiny_server)["specbuild_requests_in_flight"]
    rest = list(chunks)
    assert during == 1.0, f"read after the first of {1 + len(rest)} responses"
    assert metrics(tiny_server)["specbuild_requests_in_flight"] == 0.0


# --- 6b. prompt lookup ---------------------------------------------------------------------------------------
# Ends inside a line the prompt already holds, so lookup proposes from the first round, whatever the model answers
# (a prompt ending in a newline that the prompt only ever merges with indentation has no earlier n-gram to match).
REPEATING = "total = 0\nfor i in range(10):\n    total += i\nfor i in range(10):\n    total +="
SOURCE_COUNTERS = ("specbuild_spec_decode_source_drafts_total", "specbuild_spec_decode_source_draft_tokens_total",
                   "specbuild_spec_decode_source_accepted_tokens_total")
LOOKUP_COUNTERS = tuple(f"{name}[lookup]" for name in SOURCE_COUNTERS)
MODEL_COUNTERS = tuple(f"{name}[model]" for name in SOURCE_COUNTERS)


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_output_with_prompt_lookup_equals_the_target_alone(tiny_client, target_alone, stream):
    for prompt in (REPEATING, *PROMPTS):
        for k in (1, 3):
            got = tiny_client.generate(prompt, MAX_TOKENS, num_draft_tokens=k, prompt_lookup=True, stream=stream)
            assert got.text == target_alone(prompt, MAX_TOKENS).text, f"K={k}, prompt {prompt!r}"


def test_prompt_lookup_counters_move_on_a_prompt_that_repeats_itself(tiny_release, tiny_server, tiny_client,
                                                                     target_alone, tokenizer):
    lookup = tiny_release.spec.speculation.prompt_lookup
    assert PromptLookup(lookup.max_ngram, lookup.min_ngram).propose(tokenizer.encode(REPEATING), 3), \
        "the prompt's own n-grams propose its first draft"
    before = metrics(tiny_server)
    off = tiny_client.generate(REPEATING, MAX_TOKENS, num_draft_tokens=3, prompt_lookup=False)
    middle = metrics(tiny_server)
    assert all(delta(before, middle, name) == 0 for name in LOOKUP_COUNTERS)
    on = [tiny_client.generate(REPEATING, MAX_TOKENS, num_draft_tokens=3, prompt_lookup=True),
          tiny_client.generate(REPEATING, MAX_TOKENS, num_draft_tokens=2, prompt_lookup=True, temperature=0.8,
                               top_p=1.0, seed=5)]  # sampled: lookup drafts carry point-mass logits to the target
    after = metrics(tiny_server)
    assert on[0].text == off.text == target_alone(REPEATING, MAX_TOKENS).text
    drafts, tokens, accepted = (delta(middle, after, name) for name in LOOKUP_COUNTERS)
    assert 0 < drafts <= tokens and 0 <= accepted <= tokens
    # the totals count both draft sources: each one's share, by its name
    model_drafts, model_tokens, model_accepted = (delta(middle, after, name) for name in MODEL_COUNTERS)
    assert delta(middle, after, "specbuild_spec_decode_num_draft_tokens_total") == \
        sum(g.total_draft_tokens for g in on) == tokens + model_tokens
    assert delta(middle, after, "specbuild_spec_decode_num_accepted_tokens_total") == accepted + model_accepted
    assert delta(middle, after, "specbuild_spec_decode_num_drafts_total") == drafts + model_drafts


# --- 7. bad requests ----------------------------------------------------------------------------------------
def good(**changes: np.ndarray) -> dict[str, np.ndarray]:
    inputs = {"text_input": text_array("def f():"), "max_tokens": scalars(4, np.int32)}
    return {name: value for name, value in {**inputs, **changes}.items() if value is not None}


BAD_REQUESTS = {
    "empty text": (good(text_input=text_array("")), "text_input is empty"),
    "blank text": (good(text_input=text_array("  \n")), "text_input is empty"),
    "zero max_tokens": (good(max_tokens=scalars(0, np.int32)), "max_tokens must be at least 1"),
    "negative max_tokens": (good(max_tokens=scalars(-5, np.int32)), "max_tokens must be at least 1"),
    "max_tokens beyond the engine": (good(max_tokens=scalars(10_000, np.int32)), "exceeds max_seq_len (512)"),
    "K above max_draft_len": (good(num_draft_tokens=scalars(9, np.int32)), "num_draft_tokens must be within 0..8"),
    "negative K": (good(num_draft_tokens=scalars(-1, np.int32)), "num_draft_tokens must be within 0..8"),
    "wrong dtype": (good(max_tokens=scalars(4.0, np.float32)), "data-type is 'FP32', but model 'ensemble' expects 'INT32'"),
    "wrong shape": (good(text_input=np.array([[b"a", b"b"]], dtype=object)), "unexpected shape for input 'text_input'"),
    "missing input": (good(max_tokens=None), "missing required input(s) ['max_tokens']"),
    "invalid UTF-8 prompt": (good(text_input=text_array(b"caf\xc3")), "text_input is not valid UTF-8"),
    "invalid UTF-8 stop word": (good(stop_words=text_array(b"\xff")), "stop_words is not valid UTF-8"),
    "prompt over max_input_len": (good(text_input=text_array("x = 1\n" * 200)), "more than max_input_len (256)"),
    "unknown input": (good(top_n=scalars(3, np.int32)), "unexpected inference input 'top_n'"),
    "negative temperature": (good(temperature=scalars(-1.0, np.float32)), "temperature must be a finite number >= 0"),
    "beam search": (good(beam_width=scalars(2, np.int32)), "beam_width must be 1"),
}


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(tiny_server, tiny_client, target_alone):
    from tritonclient.utils import InferenceServerException

    for case, (inputs, message) in BAD_REQUESTS.items():
        with pytest.raises(InferenceServerException) as error:
            infer_stream(tiny_server.grpc_url, inputs)
        assert message in error.value.message(), case
    with pytest.raises(urllib.error.HTTPError) as http_error:
        http_post(tiny_server, f"/v2/models/{ENSEMBLE_MODEL}/generate", {"text_input": "x", "max_tokens": 0})
    assert "max_tokens must be at least 1" in http_error.value.read().decode()
    assert tiny_server.is_running() and tiny_server.model_ready(ENSEMBLE_MODEL)
    assert tiny_client.generate(PROMPTS[0], MAX_TOKENS, num_draft_tokens=3).text == target_alone(PROMPTS[0], MAX_TOKENS).text


# --- 8. draft fallback --------------------------------------------------------------------------------------
def test_without_its_draft_the_orchestrator_falls_back_to_the_exact_target(tiny_release, target_alone):
    # The session's server runs on this release too, and its stubs' bytecode would fail the manifest check.
    with TritonServer(tiny_release.repository, model_control="explicit", verify=False) as server:
        for model in ("target", "draft", ENSEMBLE_MODEL):
            server.load_model(model)
        client = SpecbuildClient(server.grpc_url)
        expected = [target_alone(prompt, MAX_TOKENS) for prompt in PROMPTS[:2]]
        assert client.generate(PROMPTS[0], MAX_TOKENS, num_draft_tokens=3).total_draft_tokens > 0

        server.unload_model("draft")
        before = metrics(server)
        fallen = [client.generate(PROMPTS[0], MAX_TOKENS, num_draft_tokens=3),
                  client.generate(PROMPTS[1], MAX_TOKENS, num_draft_tokens=5, stream=True)]
        after = metrics(server)
        assert [g.text for g in fallen] == [e.text for e in expected]
        assert all(g.total_draft_tokens == 0 for g in fallen)
        assert delta(before, after, "specbuild_draft_fallbacks_total") == len(fallen)
        assert "draft model failed" in server.read_log() and "continuing with the target alone" in server.read_log()

        server.load_model("draft")  # used again once the orchestrator's retry pause after a failure is over
        deadline = time.monotonic() + 60
        while (back := client.generate(PROMPTS[1], MAX_TOKENS, num_draft_tokens=3)).total_draft_tokens == 0:
            assert back.text == expected[1].text
            assert time.monotonic() < deadline, "the reloaded draft was never used again"
            time.sleep(1)
        assert back.text == expected[1].text
