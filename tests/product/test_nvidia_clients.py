"""Clients written for NVIDIA's tensorrtllm_backend ensemble, unchanged, against the tiny release on a real Triton
server: the conformance client of ``nvidia_conformance.py`` (what ``end_to_end_grpc_client.py`` sends and reads,
its ``--check-outputs`` included), both spellings of the renamed inputs over gRPC and Triton's HTTP generate
endpoint, penalties, refusals, batched rows, a bad ``end_id`` and the per-request time limit.

References come from the release's target run alone in process (``target_alone``): "exact" means the text NVIDIA's
backend would give for the same inputs (greedy when top_k and top_p are 0 or absent, whatever the temperature).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

import nvidia_conformance as nvidia
from model_probes import CODE_PROMPTS, first, one_token_word
from triton_requests import metrics, raw_stream
from specbuild.package.contract import ENSEMBLE_INPUTS, ENSEMBLE_MODEL, NUMPY_DTYPES, by_name
from specbuild.speculation.rules import SamplingParams

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = ("def main():\n    ", "import os\nimport sys\n\n")
MAX_TOKENS = 24
INPUTS = by_name(ENSEMBLE_INPUTS)


def arrays(**values: Any) -> dict[str, np.ndarray]:
    """Ensemble inputs as ``[1, 1]`` arrays of their contract dtypes (numpy arrays pass as they are)."""
    return {name: value if isinstance(value, np.ndarray) else
            np.array([[value]], dtype=NUMPY_DTYPES[INPUTS[name].dtype]) for name, value in values.items()}


def grpc_text(server, **values: Any) -> tuple[str, dict[str, Any]]:
    """One request over the gRPC stream: its text (every response's text_output[0] joined) and the last
    response's figures; raises AssertionError with the server's error."""
    results, error = raw_stream(server, ENSEMBLE_MODEL, arrays(**values))
    assert error is None, error
    data = [r for r in results if r.as_numpy("text_output") is not None]
    figures = {name: data[-1].as_numpy(name)[0][0] for name in ("output_token_count", "total_draft_tokens")}
    return b"".join(r.as_numpy("text_output")[0] for r in data).decode("utf-8"), figures


def grpc_error(server, **values: Any) -> str:
    _, error = raw_stream(server, ENSEMBLE_MODEL, arrays(**values))
    assert error is not None
    return error


def http_generate(server, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Triton's ``POST /v2/models/ensemble/generate``: status and JSON answer."""
    request = urllib.request.Request(f"{server.http_url}/v2/models/{ENSEMBLE_MODEL}/generate",
                                     data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# --- end_to_end_grpc_client with its default flags ------------------------------------------------------------
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_the_conformance_client_with_default_flags_gets_the_greedy_answer(tiny_server, target_alone, streaming):
    """Temperature 1.0 and no top_k/top_p: NVIDIA's backend decodes greedily, so must the ensemble; the text comes
    1-D (``text_output[0]`` is bytes), with the prompt when not streaming, and ``--check-outputs`` passes."""
    answer = nvidia.run(tiny_server.grpc_url, PROMPTS[:1], streaming=streaming)
    expected = target_alone(PROMPTS[0], nvidia.DEFAULT_OUTPUT_LEN)
    assert answer.errors == []
    assert answer.texts == [expected.text if streaming else PROMPTS[0] + expected.text]
    nvidia.check_outputs(PROMPTS[:1], answer.texts, [expected.text], streaming=streaming)


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_batched_prompts_are_served_row_by_row(tiny_server, target_alone, streaming):
    """``--batch-inputs``: one request of two rows; each response is about one row (batch_index) and each row's
    text is what it gets alone."""
    answer = nvidia.run(tiny_server.grpc_url, PROMPTS, streaming=streaming, batch_inputs=True, output_len=MAX_TOKENS)
    expected = [target_alone(prompt, MAX_TOKENS).text for prompt in PROMPTS]
    assert answer.errors == []
    nvidia.check_outputs(PROMPTS, answer.texts, expected, streaming=streaming)


def test_excluding_the_input_and_the_client_s_other_flags(tiny_server, target_alone, tokenizer):
    """--exclude-input-in-output, --stop-words, --bad-words (empty), --end-id, --pad-id, -n 1."""
    prompt = first(CODE_PROMPTS, lambda p: one_token_word(target_alone(p, MAX_TOKENS).tokens, tokenizer) is not None,
                   "an answer with a one-token word after its first token (the stop word)")
    expected = target_alone(prompt, MAX_TOKENS)
    token = one_token_word(expected.tokens, tokenizer)
    stop = tokenizer.decode([token])  # a word of one token: the answer ends right after its first occurrence
    cut = tokenizer.decode(list(expected.tokens[: expected.tokens.index(token) + 1]))
    answer = nvidia.run(tiny_server.grpc_url, [prompt], output_len=MAX_TOKENS, exclude_input_in_output=True,
                        num_return_sequences=np.array([[1]], dtype=np.int32),
                        stop_words=np.array([[stop]], dtype=object), bad_words=np.array([[""]], dtype=object),
                        end_id=np.array([[tokenizer.eos_token_id]], dtype=np.int32),
                        pad_id=np.array([[tokenizer.pad_token_id]], dtype=np.int32))
    assert answer.errors == [] and answer.texts == [cut]
    nvidia.check_outputs([prompt], answer.texts, [cut], streaming=False, exclude_input_in_output=True)


def test_perf_metrics_and_token_counts_under_nvidia_s_names(tiny_server):
    outputs = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "arrival_time_ns",
               "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "num_input_tokens",
               "num_output_tokens", "batch_index")
    results, error = raw_stream(tiny_server, ENSEMBLE_MODEL, arrays(
        text_input=PROMPTS[0], max_tokens=MAX_TOKENS, stream=True, num_draft_tokens=3, return_perf_metrics=True,
        return_num_input_tokens=True, return_num_output_tokens=True))
    assert error is None
    figures = [{name: r.as_numpy(name)[0][0] for name in outputs} for r in results if r.as_numpy("text_output")
               is not None]
    last = figures[-1]
    assert last["arrival_time_ns"] <= last["first_scheduled_time_ns"] <= last["first_token_time_ns"] \
        <= last["last_token_time_ns"]
    assert sum(f["num_output_tokens"] for f in figures) == MAX_TOKENS  # per response: its own tokens (deltas)
    assert {f["num_input_tokens"] for f in figures} == {len(nvidia_prompt_ids(tiny_server, PROMPTS[0]))}
    assert 0 < last["total_draft_tokens"] and last["acceptance_rate"] == pytest.approx(
        last["total_accepted_draft_tokens"] / last["total_draft_tokens"])
    # the KV-cache block counts of TensorRT-LLM's executor have no meaning here: not declared, so asking fails
    _, refused = raw_stream(tiny_server, ENSEMBLE_MODEL, arrays(text_input=PROMPTS[0], max_tokens=2,
                                                                return_perf_metrics=True),
                            outputs=("text_output", "kv_cache_alloc_new_blocks"))
    assert refused is not None and "kv_cache_alloc_new_blocks" in refused


def nvidia_prompt_ids(server, prompt: str) -> list[int]:
    """The prompt's ids as the release's preprocessing makes them (its tokenizer, special tokens added)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(server.repository / "preprocessing" / "1" / "tokenizer")).encode(prompt)


# --- renamed inputs: seed / random_seed, min_tokens / min_length -------------------------------------------------
SAMPLED = {"temperature": 1.0, "top_p": 1.0, "exclude_input_in_output": True}


def test_seeded_sampling_repeats_under_either_name_over_grpc_and_http(tiny_server):
    texts = {}
    for name in ("seed", "random_seed"):
        for seed in (11, 12):
            grpc_first, _ = grpc_text(tiny_server, text_input=PROMPTS[1], max_tokens=MAX_TOKENS, **{name: seed},
                                      **SAMPLED)
            grpc_again, _ = grpc_text(tiny_server, text_input=PROMPTS[1], max_tokens=MAX_TOKENS, **{name: seed},
                                      **SAMPLED)
            status, answer = http_generate(tiny_server, {"text_input": PROMPTS[1], "max_tokens": MAX_TOKENS,
                                                         name: seed, **SAMPLED})
            assert status == 200, answer
            assert grpc_first == grpc_again == answer["text_output"]
            texts[name, seed] = grpc_first
    assert texts["seed", 11] == texts["random_seed", 11] != texts["seed", 12] == texts["random_seed", 12]


@pytest.mark.parametrize("name", ["min_tokens", "min_length"])
def test_min_tokens_under_either_name_over_grpc_and_http(tiny_server, target_alone, name):
    """The end token (set to the greedy answer's third token) stays out of the first 10 tokens; speculation
    resumes after them, and the answer is the target's alone with the same min_tokens."""
    end_id = target_alone(PROMPTS[0], MAX_TOKENS).tokens[2]
    expected = target_alone(PROMPTS[0], MAX_TOKENS, end_id=end_id, min_tokens=10)
    assert len(expected.tokens) >= 10
    unbounded, _ = grpc_text(tiny_server, text_input=PROMPTS[0], max_tokens=MAX_TOKENS, end_id=end_id,
                             exclude_input_in_output=True)
    assert len(unbounded) < len(expected.text)  # without it the answer ends at that token
    for stream in (False, True):
        text, figures = grpc_text(tiny_server, text_input=PROMPTS[0], max_tokens=MAX_TOKENS, end_id=end_id,
                                  num_draft_tokens=3, stream=stream, exclude_input_in_output=True, **{name: 10})
        assert text == expected.text and figures["output_token_count"] == len(expected.tokens)
    status, answer = http_generate(tiny_server, {"text_input": PROMPTS[0], "max_tokens": MAX_TOKENS, "end_id": end_id,
                                                 "exclude_input_in_output": True, name: 10})
    assert status == 200 and answer["text_output"] == expected.text


@pytest.mark.parametrize(("current", "older"), [("seed", "random_seed"), ("min_tokens", "min_length")])
def test_both_spellings_with_different_values_are_refused_naming_them(tiny_server, current, older):
    values = {"text_input": PROMPTS[0], "max_tokens": 4, current: 3, older: 5}
    message = f"{current}=3 and {older}=5 disagree"
    assert message in grpc_error(tiny_server, **values)
    status, answer = http_generate(tiny_server, values)
    assert status == 400 and message in answer["error"]
    assert grpc_text(tiny_server, **{**values, older: 3})[0]  # the same value twice is one value


# --- penalties ------------------------------------------------------------------------------------------------
def test_penalties_are_exact_and_run_without_drafts_counted(tiny_server, target_alone):
    penalties = {"repetition_penalty": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    sampling = SamplingParams(top_k=1, **penalties)
    prompt = first(CODE_PROMPTS, lambda p: target_alone(p, MAX_TOKENS, sampling=sampling).text
                   != target_alone(p, MAX_TOKENS).text, "an answer the penalties change")
    expected = target_alone(prompt, MAX_TOKENS, sampling=sampling)
    before = metrics(tiny_server)
    text, figures = grpc_text(tiny_server, text_input=prompt, max_tokens=MAX_TOKENS, num_draft_tokens=3,
                              exclude_input_in_output=True, **penalties)
    status, answer = http_generate(tiny_server, {"text_input": prompt, "max_tokens": MAX_TOKENS,
                                                 "exclude_input_in_output": True, "stream": False, **penalties})
    after = metrics(tiny_server)
    assert text == answer["text_output"] == expected.text and status == 200
    assert figures["total_draft_tokens"] == 0 and answer["total_draft_tokens"] == 0
    assert after["specbuild_unspeculated_requests_total"] - before.get("specbuild_unspeculated_requests_total", 0) == 2


def test_length_penalty_has_no_effect_at_beam_width_one(tiny_server, target_alone):
    text, figures = grpc_text(tiny_server, text_input=PROMPTS[0], max_tokens=MAX_TOKENS, length_penalty=2.5,
                              exclude_input_in_output=True)
    assert text == target_alone(PROMPTS[0], MAX_TOKENS).text and figures["total_draft_tokens"] > 0


# --- refusals -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("values", "message"), [
    ({"beam_width": 2}, "beam_width must be 1"),
    ({"num_return_sequences": 2}, "num_return_sequences must be 1"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"return_log_probs": np.array([[True]])}, "unexpected inference input 'return_log_probs'"),
], ids=["beam-search", "several-sequences", "temperature-inf", "temperature-nan", "log-probs"])
def test_what_is_not_supported_is_refused_naming_the_input(tiny_server, values, message):
    assert message in grpc_error(tiny_server, text_input=PROMPTS[0], max_tokens=4, **values)


def test_a_bad_end_id_is_that_client_s_error_and_others_keep_their_drafts(tiny_server, tokenizer):
    before = metrics(tiny_server)
    error = grpc_error(tiny_server, text_input=PROMPTS[0], max_tokens=8, num_draft_tokens=3, end_id=len(tokenizer))
    assert f"end_id {len(tokenizer)} is outside the vocabulary" in error
    _, figures = grpc_text(tiny_server, text_input=PROMPTS[1], max_tokens=8, num_draft_tokens=3)
    after = metrics(tiny_server)
    assert figures["total_draft_tokens"] > 0  # the next client still speculates: no draft down-time
    assert after["specbuild_draft_fallbacks_total"] == before.get("specbuild_draft_fallbacks_total", 0)


# --- time limit -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_max_time_stops_a_request_after_the_round_that_passes_it(tiny_server, target_alone, stream):
    before = metrics(tiny_server)
    text, figures = grpc_text(tiny_server, text_input=PROMPTS[0], max_tokens=MAX_TOKENS, num_draft_tokens=2,
                              max_time=1e-6, stream=stream, exclude_input_in_output=True)
    after = metrics(tiny_server)
    full = target_alone(PROMPTS[0], MAX_TOKENS)
    assert 0 < figures["output_token_count"] <= 3 and full.text.startswith(text)  # one round: up to K + 1 tokens
    assert after["specbuild_timed_out_requests_total"] - before.get("specbuild_timed_out_requests_total", 0) == 1
