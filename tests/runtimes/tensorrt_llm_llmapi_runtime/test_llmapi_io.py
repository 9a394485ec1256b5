"""The adapter's mapping and the LLM-API model's tensors, without Triton: names, dtypes and shapes from the contract
table, the refusals that name the input, stop words ended in the text (never sent to upstream), penalties on a K=0
release, the chat template and time limit, statistics carried over, deltas of a stream."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.errors import RequestError
from specbuild.package.contract import NUMPY_DTYPES, by_name
from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_INPUTS, LLMAPI_OUTPUTS, LLMAPIAdapterParameters
from specbuild.runtimes.tensorrt_llm_llmapi.tensors import LLMAPIAnswer, LLMAPIRequest, decode_answer, decode_request, encode_answer, \
    encode_request
from specbuild.runtimes.tensorrt_llm_llmapi.requests import AdapterRowProgress, parse_adapter_rows, past_draft_window, templated

SETTINGS = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=True, max_request_seconds=600.0,
                                   tensorrt_llm="main", draft_max_seq_len=2048)
TARGET_ALONE = LLMAPIAdapterParameters(num_draft_tokens=0, end_id=2, streams=True, max_request_seconds=0.0,
                                       tensorrt_llm="main", draft_max_seq_len=2048)


def ensemble_request(rows: int = 1, **values: object) -> dict[str, np.ndarray]:
    """An ensemble request as Triton hands it to the adapter: ``[rows, 1]`` per input, strings as bytes."""
    arrays = {"text_input": np.array([[b"def main("]] * rows, dtype=object),
              "max_tokens": np.array([[8]] * rows, dtype=np.int32)}
    dtypes = {"stream": bool, "temperature": np.float32, "top_k": np.int32, "top_p": np.float32,
              "random_seed": np.uint64, "seed": np.uint64, "min_tokens": np.int32, "min_length": np.int32,
              "repetition_penalty": np.float32, "presence_penalty": np.float32, "frequency_penalty": np.float32,
              "num_return_sequences": np.int32,
              "apply_chat_template": bool, "max_time": np.float32, "end_id": np.int32, "num_draft_tokens": np.int32, "beam_width": np.int32,
              "use_draft_logits": bool, "adaptive_draft": bool, "prompt_lookup": bool,
              "break_even": bool, "exclude_input_in_output": bool}
    for name, value in values.items():
        if name in ("stop_words", "bad_words"):
            arrays[name] = np.array([[word.encode() for word in value]] * rows, dtype=object)
        elif isinstance(value, str):
            arrays[name] = np.array([[value.encode()]] * rows, dtype=object)
        else:
            arrays[name] = np.array([[value]] * rows, dtype=dtypes[name])
    return arrays


def test_requests_are_encoded_by_the_contract_table_and_read_back() -> None:
    request = LLMAPIRequest(prompt="héllo", max_tokens=9, temperature=0.75, top_k=0, top_p=0.5, seed=2**40,
                            presence_penalty=0.5, frequency_penalty=0.25, streaming=True)
    arrays = encode_request(request)
    table = by_name(LLMAPI_INPUTS)
    for name, array in arrays.items():
        assert array.dtype == np.dtype(NUMPY_DTYPES[table[name].dtype]), name
        assert array.ndim == 1 and (array.shape == (1,) or -1 in table[name].dims), name
    assert arrays["sampling_param_presence_penalty"].tolist() == [0.5]
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
    # upstream helpers.py hands these bytes to SamplingParams.stop, which tokenizes str only: the request fails
    ({"sampling_param_stop": np.array([b"END"], dtype=object)}, "sampling_param_stop: upstream helpers.py"),
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
    [row] = parse_adapter_rows(ensemble_request(stream=True, random_seed=7, stop_words=["\n\n"], num_draft_tokens=4,
                                        use_draft_logits=False, end_id=2, exclude_input_in_output=False), SETTINGS)
    assert row.llm == LLMAPIRequest(prompt="def main(", max_tokens=8, top_k=1, seed=7, streaming=True)
    assert row.stop == ("\n\n",) and "sampling_param_stop" not in encode_request(row.llm)  # ended here, not sent
    assert row.stream and not row.include_prompt  # a stream never carries the prompt
    [sampled] = parse_adapter_rows(ensemble_request(temperature=0.8, top_p=1.0), SETTINGS)
    assert (sampled.llm.temperature, sampled.llm.top_k, sampled.llm.top_p) == (pytest.approx(0.8), 0, 1.0)
    # NVIDIA's rule, as for every runtime: top_k and top_p 0 are greedy whatever the temperature
    [greedy] = parse_adapter_rows(ensemble_request(temperature=0.8, top_p=0.0), SETTINGS)
    assert (greedy.llm.top_k, greedy.llm.top_p) == (1, None)
    [seeded] = parse_adapter_rows(ensemble_request(seed=9, random_seed=9), SETTINGS)  # either name, the same value
    assert seeded.llm.seed == 9
    [whole] = parse_adapter_rows(ensemble_request(exclude_input_in_output=False), SETTINGS)
    assert whole.include_prompt and whole.llm.exclude_input_from_output


def test_on_a_line_that_does_not_stream_a_stream_asks_for_the_whole_answer() -> None:
    settings = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=False, max_request_seconds=0.0,
                                       tensorrt_llm="1.2", draft_max_seq_len=2048)
    [row] = parse_adapter_rows(ensemble_request(stream=True), settings)
    assert row.stream and not row.llm.streaming


@pytest.mark.parametrize(("values", "named", "fix"), [
    ({"num_draft_tokens": 2}, "num_draft_tokens=2", "send num_draft_tokens=4 or leave it out"),
    ({"num_draft_tokens": 0}, "num_draft_tokens=0", "send num_draft_tokens=4"),
    ({"use_draft_logits": True}, "use_draft_logits=True", "send use_draft_logits=false"),
    ({"adaptive_draft": True}, "adaptive_draft=True", "send adaptive_draft=false"),
    ({"prompt_lookup": True}, "prompt_lookup=True", "send prompt_lookup=false"),
    ({"break_even": True}, "break_even=True", "send break_even=false"),  # TensorRT-LLM decides for its batch
    ({"beam_width": 2}, "beam_width must be 1, got 2", "send beam_width=1"),  # the public rule, as the orchestrator
    ({"end_id": 5}, "end_id=5", "send end_id=2"),
    ({"bad_words": ["foo"]}, "bad_words=['foo']", "leave bad_words out"),
    ({"min_length": 3}, "min_tokens=3", "leave min_tokens out"),
    ({"repetition_penalty": 1.5}, "repetition_penalty=1.5", "leave repetition_penalty out"),
    ({"presence_penalty": 0.5}, "presence_penalty=0.5", "speculation.num_draft_tokens=0"),
    ({"frequency_penalty": 0.5}, "frequency_penalty=0.5", "speculation.num_draft_tokens=0"),
    ({"num_return_sequences": 2}, "num_return_sequences must be 1, got 2", "send the request again"),
    ({"guided_decoding_guide_type": "json"}, "guided_decoding_guide_type='json': this release serves TensorRT-LLM "
     "main (1.4.0rc)'s LLM-API Triton model (line main), whose config.pbtxt has no guided decoding input",
     "leave guided_decoding_guide_type out, or serve a torch or tensorrt-llm release"),
])
def test_what_the_llm_api_cannot_honour_is_refused_naming_the_input(values: dict, named: str, fix: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_adapter_rows(ensemble_request(rows=2, **values), SETTINGS)
    assert refused.value.message.startswith(named) and fix in refused.value.fix


@pytest.mark.parametrize(("values", "expected"), [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    ({"max_time": -1.0}, "max_time must be a finite number above 0"),
])
def test_bad_values_are_refused(values: dict, expected: str) -> None:
    arrays = ensemble_request(**{k: v for k, v in values.items() if k != "max_tokens"})
    if "max_tokens" in values:
        arrays["max_tokens"] = np.array([[values["max_tokens"]]], dtype=np.int32)
    with pytest.raises(RequestError, match=expected):
        parse_adapter_rows(arrays, SETTINGS)
    with pytest.raises(RequestError, match="text_input is empty"):
        parse_adapter_rows({**ensemble_request(), "text_input": np.array([[b" "]], dtype=object)}, SETTINGS)


def test_a_streamed_row_sends_deltas_and_ends_at_the_stop_word_kept() -> None:
    [row] = parse_adapter_rows(ensemble_request(stream=True, stop_words=["END", "wö"]), SETTINGS)
    progress = AdapterRowProgress(0, row=row)
    progress.update(LLMAPIAnswer("Hello"))
    assert progress.take_new_text() == "Hello" and not progress.finished
    progress.update(LLMAPIAnswer("Hello, w\ufffd"))  # an incomplete character is held back
    assert progress.take_new_text() == ", w"
    # the first stop word found ends the text (kept, as the other runtimes keep it) and the row
    progress.update(LLMAPIAnswer("Hello, wörld END and more", acceptance_rate=0.5))
    assert progress.finished and progress.answer.finish_reason == "stop"
    assert progress.take_new_text() == "ö" and progress.sent == "Hello, wö"


def test_on_a_line_that_does_not_stream_the_stop_word_cuts_the_whole_answer() -> None:
    [row] = parse_adapter_rows(ensemble_request(stop_words=["\n\n"]), SETTINGS)
    progress = AdapterRowProgress(0, row=row)
    progress.update(LLMAPIAnswer("first\n\nsecond\n\nthird", "length"))
    assert progress.finished and progress.generated() == "first\n\n" and progress.answer.finish_reason == "stop"


def test_statistics_carry_over_answers_that_lack_them_and_each_response_is_about_one_row() -> None:
    [row] = parse_adapter_rows(ensemble_request(), SETTINGS)
    progress = AdapterRowProgress(1, row=row, prompt_tokens=5, scheduled_ns=10)
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


@pytest.mark.parametrize(("prompt_tokens", "tokens", "settings", "past"), [
    (2000, 48, SETTINGS, False),  # prompt + answer within the draft's 2048 positions
    (2000, 49, SETTINGS, True),  # beyond them: TensorRT-LLM stopped drafting for it (model_drafter.py)
    (2000, 49, TARGET_ALONE, False),  # nothing drafts: nothing to stop
])
def test_a_row_past_the_draft_window_is_counted(prompt_tokens: int, tokens: int,
                                                settings: LLMAPIAdapterParameters, past: bool) -> None:
    [row] = parse_adapter_rows(ensemble_request(), settings)
    progress = AdapterRowProgress(0, row=row, prompt_tokens=prompt_tokens)
    progress.tokens = tokens
    assert past_draft_window(progress, settings) is past


def test_a_stop_reason_of_the_model_adds_nothing() -> None:
    [row] = parse_adapter_rows(ensemble_request(stop_words=["END"]), SETTINGS)
    progress = AdapterRowProgress(0, row=row)
    progress.update(LLMAPIAnswer("text", "stop", "2"))  # the end token's id
    progress.finished = True
    assert progress.generated() == "text"


def test_a_release_without_speculation_passes_penalties_on() -> None:
    [row] = parse_adapter_rows(ensemble_request(presence_penalty=0.5, frequency_penalty=0.25), TARGET_ALONE)
    assert (row.llm.presence_penalty, row.llm.frequency_penalty) == (0.5, 0.25)
    arrays = encode_request(row.llm)
    assert arrays["sampling_param_frequency_penalty"].tolist() == [0.25]
    [plain] = parse_adapter_rows(ensemble_request(presence_penalty=0.0), SETTINGS)  # the neutral value is no penalty
    assert plain.llm.presence_penalty is None


def test_the_time_limit_is_max_time_within_the_release_s() -> None:
    [row] = parse_adapter_rows(ensemble_request(max_time=2.0), SETTINGS)
    assert row.max_seconds == 2.0
    [capped] = parse_adapter_rows(ensemble_request(max_time=2000.0), SETTINGS)
    assert capped.max_seconds == 600.0
    [unlimited] = parse_adapter_rows(ensemble_request(), TARGET_ALONE)
    assert unlimited.max_seconds is None


def test_on_a_line_that_does_not_stream_max_time_is_refused_naming_why() -> None:
    """1.2's model sends the whole answer at its end: a time limit could only end the request with no text."""
    settings = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=False, max_request_seconds=600.0,
                                       tensorrt_llm="1.2", draft_max_seq_len=2048)
    with pytest.raises(RequestError) as refused:
        parse_adapter_rows(ensemble_request(max_time=2.0), settings)
    assert "max_time=2.0" in refused.value.message and "does not stream" in refused.value.message
    assert "triton.tensorrt_llm: main" in refused.value.fix
    [bounded] = parse_adapter_rows(ensemble_request(), settings)
    assert bounded.max_seconds == 600.0  # the release's own limit still holds


class ChatTokenizer:
    """A tokenizer whose template starts with its BOS token, which it also adds to every text."""

    chat_template = "{{ bos_token }}<user>{{ messages[0]['content'] }}<assistant>"
    bos_token, bos_token_id = "<s>", 1

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):  # noqa: ANN001, ANN201
        assert not tokenize and add_generation_prompt
        return f"<s><user>{messages[0]['content']}<assistant>"

    def encode(self, text: str) -> list[int]:
        return [1, *range(2, 2 + len(text))]


def test_the_chat_template_is_applied_without_a_second_bos() -> None:
    [row] = parse_adapter_rows(ensemble_request(apply_chat_template=True), SETTINGS)
    assert templated(row, ChatTokenizer()).llm.prompt == "<user>def main(<assistant>"
    assert templated(row, ChatTokenizer()).echo == "def main("  # an answer repeats the client's text, as preprocessing
    [plain] = parse_adapter_rows(ensemble_request(), SETTINGS)
    assert templated(plain, ChatTokenizer()) == plain

    class NoTemplate(ChatTokenizer):
        chat_template = None

    assert templated(row, NoTemplate()) == row  # as preprocessing: no template, the text as it is
