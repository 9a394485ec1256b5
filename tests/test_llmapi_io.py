"""The adapter's mapping and the LLM-API model's tensors, without Triton: names, dtypes and shapes from the contract
table, the refusals that name the input, the stop string kept, statistics carried over, deltas of a stream."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.errors import RequestError
from specbuild.package.contract import NUMPY_DTYPES, by_name
from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_INPUTS, LLMAPI_OUTPUTS, LLMAPIAdapterParameters
from specbuild.runtimes.tensorrt_llm_llmapi.tensors import LLMAPIAnswer, LLMAPIRequest, decode_answer, decode_request, encode_answer, \
    encode_request
from specbuild.runtimes.tensorrt_llm_llmapi.requests import RowProgress, parse_rows

SETTINGS = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=True)


def ensemble_request(rows: int = 1, **values: object) -> dict[str, np.ndarray]:
    """An ensemble request as Triton hands it to the adapter: ``[rows, 1]`` per input, strings as bytes."""
    arrays = {"text_input": np.array([[b"def main("]] * rows, dtype=object),
              "max_tokens": np.array([[8]] * rows, dtype=np.int32)}
    dtypes = {"stream": bool, "temperature": np.float32, "top_k": np.int32, "top_p": np.float32,
              "random_seed": np.uint64, "seed": np.uint64, "min_tokens": np.int32, "min_length": np.int32,
              "repetition_penalty": np.float32, "presence_penalty": np.float32, "num_return_sequences": np.int32,
              "apply_chat_template": bool, "max_time": np.float32, "end_id": np.int32, "num_draft_tokens": np.int32, "beam_width": np.int32,
              "use_draft_logits": bool, "adaptive_draft": bool, "prompt_lookup": bool,
              "exclude_input_in_output": bool}
    for name, value in values.items():
        if name in ("stop_words", "bad_words"):
            arrays[name] = np.array([[word.encode() for word in value]] * rows, dtype=object)
        else:
            arrays[name] = np.array([[value]] * rows, dtype=dtypes[name])
    return arrays


def test_requests_are_encoded_by_the_contract_table_and_read_back() -> None:
    request = LLMAPIRequest(prompt="héllo", max_tokens=9, temperature=0.75, top_k=0, top_p=0.5, seed=2**40,
                            stop=("\n\n", "END"), streaming=True)
    arrays = encode_request(request)
    table = by_name(LLMAPI_INPUTS)
    for name, array in arrays.items():
        assert array.dtype == np.dtype(NUMPY_DTYPES[table[name].dtype]), name
        assert array.ndim == 1 and (array.shape == (1,) or -1 in table[name].dims), name
    assert arrays["sampling_param_stop"].shape == (2,)
    assert decode_request(arrays) == request


def test_defaults_left_out_are_the_upstream_ones() -> None:
    arrays = encode_request(LLMAPIRequest(prompt="x", max_tokens=3))
    assert {"sampling_param_temperature", "sampling_param_seed", "sampling_param_stop"}.isdisjoint(arrays)
    minimal = {"text_input": arrays["text_input"], "sampling_param_max_tokens": arrays["sampling_param_max_tokens"]}
    decoded = decode_request(minimal)
    # as upstream helpers.py: the prompt echoed, no statistics, no reasons, not streamed
    assert (decoded.exclude_input_from_output, decoded.return_perf_metrics, decoded.streaming) == (False, False, False)


@pytest.mark.parametrize(("change", "expected"), [
    ({"sampling_param_best_of": np.array([2], dtype=np.int32)}, "sampling_param_best_of=2"),
    ({"sampling_param_presence_penalty": np.array([0.5], dtype=np.float32)}, "sampling_param_presence_penalty"),
    ({"lora_name": np.array([b"x"], dtype=object)}, "unexpected input(s) lora_name"),
    ({"sampling_param_top_k": np.array([1], dtype=np.int64)}, "sampling_param_top_k must be TYPE_INT32"),
    ({"sampling_param_top_k": np.array([1, 2], dtype=np.int32)}, "must hold one value"),
    ({"text_input": np.array([[b"a"]], dtype=object)}, "text_input must be one string"),
])
def test_the_stand_in_refuses_what_the_contract_does_not_declare(change: dict, expected: str) -> None:
    arrays = {**encode_request(LLMAPIRequest(prompt="x", max_tokens=3)), **change}
    with pytest.raises(RequestError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        decode_request(arrays)


def test_answers_are_strings_sent_only_when_asked_and_read_back() -> None:
    answer = LLMAPIAnswer("text", "stop", "END", 0.5, 3, 6)
    full = encode_answer(answer, LLMAPIRequest(prompt="p", max_tokens=1))
    table = by_name(LLMAPI_OUTPUTS)
    assert all(array.dtype == object and table[name].dtype == "TYPE_STRING" for name, array in full.items())
    assert full["acceptance_rate"].tolist() == [b"0.5"]
    assert decode_answer(full) == answer
    bare = encode_answer(answer, LLMAPIRequest(prompt="p", max_tokens=1, return_perf_metrics=False,
                                                return_finish_reason=False, return_stop_reason=False))
    assert set(bare) == {"text_output"} and decode_answer(bare) == LLMAPIAnswer("text")
    # were upstream to send its declared numeric types, they would be read too
    assert decode_answer({**bare, "total_draft_tokens": np.array([7], dtype=np.int32)}).total_draft_tokens == 7
    with pytest.raises(RequestError, match="not a number"):
        decode_answer({**bare, "acceptance_rate": np.array([b"high"], dtype=object)})


def test_a_public_request_maps_onto_sampling_params() -> None:
    [row] = parse_rows(ensemble_request(stream=True, random_seed=7, stop_words=["\n\n"], num_draft_tokens=4,
                                        use_draft_logits=False, end_id=2, exclude_input_in_output=False), SETTINGS)
    assert row.llm == LLMAPIRequest(prompt="def main(", max_tokens=8, top_k=1, seed=7, stop=("\n\n",), streaming=True)
    assert row.stream and not row.include_prompt  # a stream never carries the prompt
    [sampled] = parse_rows(ensemble_request(temperature=0.8, top_p=1.0), SETTINGS)
    assert (sampled.llm.temperature, sampled.llm.top_k, sampled.llm.top_p) == (pytest.approx(0.8), 0, 1.0)
    # NVIDIA's rule, as for every runtime: top_k and top_p 0 are greedy whatever the temperature
    [greedy] = parse_rows(ensemble_request(temperature=0.8, top_p=0.0), SETTINGS)
    assert (greedy.llm.top_k, greedy.llm.top_p) == (1, None)
    [seeded] = parse_rows(ensemble_request(seed=9, random_seed=9), SETTINGS)  # either name, the same value
    assert seeded.llm.seed == 9
    [whole] = parse_rows(ensemble_request(exclude_input_in_output=False), SETTINGS)
    assert whole.include_prompt and whole.llm.exclude_input_from_output


def test_on_a_line_that_does_not_stream_a_stream_asks_for_the_whole_answer() -> None:
    settings = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=False)
    [row] = parse_rows(ensemble_request(stream=True), settings)
    assert row.stream and not row.llm.streaming


@pytest.mark.parametrize(("values", "named", "fix"), [
    ({"num_draft_tokens": 2}, "num_draft_tokens=2", "send num_draft_tokens=4 or leave it out"),
    ({"num_draft_tokens": 0}, "num_draft_tokens=0", "send num_draft_tokens=4"),
    ({"use_draft_logits": True}, "use_draft_logits=True", "send use_draft_logits=false"),
    ({"adaptive_draft": True}, "adaptive_draft=True", "send adaptive_draft=false"),
    ({"prompt_lookup": True}, "prompt_lookup=True", "send prompt_lookup=false"),
    ({"beam_width": 2}, "beam_width=2", "send beam_width=1"),
    ({"end_id": 5}, "end_id=5", "send end_id=2"),
    ({"bad_words": ["foo"]}, "bad_words=['foo']", "leave bad_words out"),
    ({"min_length": 3}, "min_tokens=3", "leave min_tokens out"),
    ({"repetition_penalty": 1.5}, "repetition_penalty=1.5", "leave repetition_penalty out"),
    ({"presence_penalty": 0.5}, "presence_penalty=0.5", "leave presence_penalty out"),
    ({"num_return_sequences": 2}, "num_return_sequences=2", "leave num_return_sequences out"),
    ({"apply_chat_template": True}, "apply_chat_template=True", "leave apply_chat_template out"),
    ({"max_time": 2.0}, "max_time=2.0", "leave max_time out"),
])
def test_what_the_llm_api_cannot_honour_is_refused_naming_the_input(values: dict, named: str, fix: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_rows(ensemble_request(rows=2, **values), SETTINGS)
    assert refused.value.message.startswith(named) and fix in refused.value.fix


@pytest.mark.parametrize(("values", "expected"), [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
])
def test_bad_values_are_refused(values: dict, expected: str) -> None:
    arrays = ensemble_request(**{k: v for k, v in values.items() if k != "max_tokens"})
    if "max_tokens" in values:
        arrays["max_tokens"] = np.array([[values["max_tokens"]]], dtype=np.int32)
    with pytest.raises(RequestError, match=expected):
        parse_rows(arrays, SETTINGS)
    with pytest.raises(RequestError, match="text_input is empty"):
        parse_rows({**ensemble_request(), "text_input": np.array([[b" "]], dtype=object)}, SETTINGS)


def test_a_streamed_row_sends_deltas_and_keeps_the_stop_string() -> None:
    [row] = parse_rows(ensemble_request(stream=True, stop_words=["END"]), SETTINGS)
    progress = RowProgress(row)
    progress.update(LLMAPIAnswer("Hello"))
    assert progress.take_new_text() == "Hello"
    progress.update(LLMAPIAnswer("Hello, w\ufffd"))  # an incomplete character is held back
    assert progress.take_new_text() == ", w"
    progress.update(LLMAPIAnswer("Hello, wörld", "stop", "END", 0.5, 2, 4))
    progress.finished = True
    assert progress.take_new_text() == "örldEND" and progress.sent == "Hello, wörldEND"


def test_statistics_carry_over_answers_that_lack_them_and_each_response_is_about_one_row() -> None:
    [row] = parse_rows(ensemble_request(), SETTINGS)
    progress = RowProgress(row, index=1, prompt_tokens=5, scheduled_ns=10)
    progress.update(LLMAPIAnswer("a", acceptance_rate=0.25, total_accepted_draft_tokens=1, total_draft_tokens=4), 20)
    progress.update(LLMAPIAnswer("ab"), 30)
    assert (progress.answer.text, progress.answer.total_draft_tokens) == ("ab", 4)
    progress.tokens = 2
    arrays = progress.response("ab", arrival_ns=5)
    assert arrays["text_output"].tolist() == [b"ab"]  # 1-D, as NVIDIA's postprocessing: clients read [0]
    assert arrays["acceptance_rate"].dtype == np.float32 and arrays["acceptance_rate"].tolist() == [[0.25]]
    assert (arrays["batch_index"].item(), arrays["total_draft_tokens"].item(), arrays["output_token_count"].item(),
            arrays["num_input_tokens"].item()) == (1, 4, 2, 5)
    assert [arrays[name].item() for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                             "last_token_time_ns")] == [5, 10, 20, 30]
    progress.tokens = 3
    assert progress.response("c", arrival_ns=5)["num_output_tokens"].item() == 1  # the tokens since the last one


def test_a_stop_reason_that_is_not_a_requested_string_adds_nothing() -> None:
    [row] = parse_rows(ensemble_request(stop_words=["END"]), SETTINGS)
    progress = RowProgress(row)
    progress.update(LLMAPIAnswer("text", "stop", "2"))  # the end token's id
    progress.finished = True
    assert progress.generated() == "text"
