"""The orchestrator's logic without a server: its parameters as the repository renders them, request parsing,
response tensors, and engine requests through the backend's tensors and back (the engine model's decoder).
Serving is covered end to end in test_e2e_serving.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from specbuild.errors import RequestError, SpecError
from specbuild.package.contract import NUMPY_DTYPES, ORCHESTRATOR_OUTPUTS, OrchestratorParameters
from specbuild.package.build_record import BuildLimits, BuildRecord, Engine
from specbuild.package.repository import orchestrator_config
from specbuild.runtimes.registry import runtime_for
from specbuild.triton_models.engine_io import decode_output, decode_requests, encode_outputs, encode_request
from specbuild.triton_models.orchestrator_requests import OrchestratorRowProgress, parse_orchestrator_rows
from specbuild.spec import load_spec
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.guide_spec import GuideSpec
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.rules import GREEDY, SamplingParams
from specbuild.speculation.stats import SpeculationStats

TARGET_LIMITS = BuildLimits(max_batch_size=8, max_draft_len=8, max_seq_len=128, max_input_len=64)
DRAFT_LIMITS = BuildLimits(max_batch_size=8, max_seq_len=96, max_input_len=64)  # a draft with a smaller window


def rendered_parameters(tmp_path: Path, runtime: str = "torch", overrides: dict[str, object] | None = None,
                        **speculation: object) -> dict[str, str]:
    spec = load_spec(None, {"runtime": runtime, "target.checkpoint": "t", "draft.checkpoint": "d",
                            "limits.max_input_len": 64, "limits.max_seq_len": 128, **(overrides or {}),
                            **{f"speculation.{key}": value for key, value in speculation.items()}}, base_dir=tmp_path)
    target, draft = (Engine(tmp_path, BuildRecord(runtime=runtime, role=role, dtype="float16", vocab_size=320,
                                                  architecture="LlamaForCausalLM", limits=limits))
                     for role, limits in (("target", TARGET_LIMITS), ("draft", DRAFT_LIMITS)))
    config = orchestrator_config(spec, target, draft, runtime_for(runtime).load_policy(spec),
                                 spec.speculation.cost_model(0.1), tokenizer_hash="ab" * 32)
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("runtime", ["torch", "tensorrt-llm"])
def test_parameters_read_back_what_the_repository_renders(tmp_path, runtime):
    settings = OrchestratorParameters.from_parameters(rendered_parameters(
        tmp_path, runtime, **{"prompt_lookup.enabled": True, "prompt_lookup.max_ngram": 3,
                              "prompt_lookup.min_ngram": 1, "prompt_lookup.draft_fallback": False}))
    assert settings.prompt_lookup is True and settings.lookup == PromptLookup(max_ngram=3, min_ngram=1)
    assert settings.lookup_draft_fallback is False and settings.fast_logits is False
    # limits come from the engines' build records: the target's, less the draft tokens; the draft's own window
    assert (settings.max_draft_len, settings.max_seq_len, settings.max_input_len) == (8, 128, 64)
    assert settings.draft_max_seq_len == 96
    default = OrchestratorParameters.from_parameters(rendered_parameters(tmp_path, runtime))
    assert default.prompt_lookup is False and default.lookup == PromptLookup()


def test_the_capture_section_reaches_the_orchestrator(tmp_path):
    default = OrchestratorParameters.from_parameters(rendered_parameters(tmp_path))
    assert default.capture is False and default.tokenizer_hash == "ab" * 32
    settings = OrchestratorParameters.from_parameters(rendered_parameters(tmp_path, overrides={
        "capture.enabled": True, "capture.max_file_mib": 2, "capture.max_file_hours": 0.5,
        "capture.retention_days": 3}))
    assert (settings.capture, settings.capture_max_file_mib, settings.capture_max_file_hours,
            settings.capture_retention_days) == (True, 2.0, 0.5, 3.0)
    with pytest.raises(SpecError, match="tokenizer_hash is empty"):
        OrchestratorParameters.from_parameters({**rendered_parameters(tmp_path, overrides={"capture.enabled": True}),
                                                "tokenizer_hash": ""})


@pytest.mark.parametrize("key", ["max_draft_len", "num_draft_tokens", "lookup_draft_fallback", "max_seq_len"])
def test_a_missing_parameter_fails_the_load_naming_it(tmp_path, key):
    parameters = rendered_parameters(tmp_path)
    del parameters[key]
    with pytest.raises(SpecError, match=f"orchestrator: Cannot find parameter with name: {key}") as error:
        OrchestratorParameters.from_parameters(parameters)
    assert "specbuild package" in error.value.fix


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [("2", "3"), ("4", "0")])
def test_bad_lookup_parameters_fail_the_load_with_a_clear_error(tmp_path, max_ngram, min_ngram):
    parameters = {**rendered_parameters(tmp_path), "lookup_max_ngram": max_ngram, "lookup_min_ngram": min_ngram}
    with pytest.raises(SpecError, match="max_ngram >= min_ngram >= 1"):
        OrchestratorParameters.from_parameters(parameters)


# --- client requests ------------------------------------------------------------------------------------------
SETTINGS = OrchestratorParameters(max_draft_len=8, num_draft_tokens=4, use_draft_logits=True, adaptive_draft=False,
                                  draft_len_schedule="2:0", prompt_lookup=False, lookup_max_ngram=4, lookup_min_ngram=2,
                                  lookup_draft_fallback=True, fast_logits=False, max_input_len=64, max_seq_len=128,
                                  draft_max_seq_len=128,
                                  vocab_size=320, max_request_seconds=600.0, break_even=True, draft_cost=0.18,
                                  verify_costs=(1.15,) * 8, cost_measured=True, measured_acceptance=0.49)


@pytest.mark.parametrize(("schedule", "in_flight", "cap"), [
    ("2:0", 1, None), ("2:0", 2, 0), ("2:0", 9, 0), ("1:0", 1, 0), ("", 64, None), ("1:4,3:2,8:0", 4, 2),
])
def test_the_load_schedule_caps_k_from_its_in_flight_counts(schedule, in_flight, cap):
    assert replace(SETTINGS, draft_len_schedule=schedule).load_schedule.cap(in_flight) == cap


def test_a_malformed_schedule_fails_the_load(tmp_path):
    parameters = {**rendered_parameters(tmp_path), "draft_len_schedule": "2:0,4:1"}
    with pytest.raises(SpecError, match="must not rise"):
        OrchestratorParameters.from_parameters(parameters)


@pytest.mark.parametrize("runtime, default", [("torch", 2), ("tensorrt-llm", 16)])
def test_the_load_policy_is_compiled_from_the_spec_or_the_runtime(tmp_path, runtime, default):
    def compiled(**speculation: object) -> str:
        return OrchestratorParameters.from_parameters(
            rendered_parameters(tmp_path, runtime, **speculation)).draft_len_schedule

    assert compiled() == f"{default}:0"  # unset: the runtime's threshold (CPU cores saturate long before a GPU)
    assert compiled(busy_in_flight=0) == "" and compiled(busy_in_flight=5) == "5:0"
    assert compiled(draft_len_schedule={4: 2, 1: 4, 8: 0}) == "1:4,4:2,8:0"


def request(**arrays: object) -> dict[str, np.ndarray]:
    base = {"input_ids": np.array([[5, 6, 7, 0], [8, 9, 0, 0]], dtype=np.int32),
            "input_length": np.array([[3], [2]], dtype=np.int32), "max_tokens": np.array([[10]], dtype=np.int32)}
    return {**base, **{name: np.asarray(value) for name, value in arrays.items()}}


def test_rows_take_their_own_prompt_and_a_broadcast_setting():
    rows = parse_orchestrator_rows(request(temperature=np.array([[0.5]], dtype=np.float32), top_p=np.array([[0.875]], np.float32),
                              stream=np.array([[True]])), SETTINGS)
    assert [row.generation.prompt_ids for row in rows] == [[5, 6, 7], [8, 9]]
    assert all(row.generation.max_tokens == 10 and row.stream for row in rows)
    assert all(row.generation.sampling == SamplingParams(temperature=0.5, top_p=0.875) for row in rows)
    assert all(row.generation.num_draft_tokens == 4 and row.generation.target_only_chunk == 1 for row in rows)
    assert all(row.max_seconds == 600.0 for row in rows)  # the server's limit


def test_the_release_s_verification_reaches_every_row():
    assert all(row.generation.verification == "token" for row in parse_orchestrator_rows(request(), SETTINGS))
    rows = parse_orchestrator_rows(request(), replace(SETTINGS, verification="block"))
    assert all(row.generation.verification == "block" for row in rows)


def test_a_temperature_alone_is_greedy_as_in_nvidia_s_backend():
    """What NVIDIA's end_to_end_grpc_client sends by default: temperature 1.0, no top_k/top_p."""
    [row, _] = parse_orchestrator_rows(request(temperature=np.array([[1.0]], dtype=np.float32)), SETTINGS)
    assert row.generation.sampling.is_greedy


@pytest.mark.parametrize(("current", "older", "field", "value"), [
    ("seed", "random_seed", "seed", 2**64 - 1), ("min_tokens", "min_length", "min_tokens", 7)])
def test_renamed_inputs_are_read_under_either_name(current, older, field, value):
    dtype = np.uint64 if current == "seed" else np.int32
    for name in (current, older):
        rows = parse_orchestrator_rows(request(**{name: np.array([[value]], dtype=dtype)}), SETTINGS)
        assert all(getattr(row.generation, field) == value for row in rows)
    both = parse_orchestrator_rows(request(**{current: np.array([[value]], dtype=dtype), older: np.array([[value]], dtype=dtype)}),
                      SETTINGS)
    assert all(getattr(row.generation, field) == value for row in both)
    with pytest.raises(RequestError, match=f"{current}={value} and {older}=3 disagree") as error:
        parse_orchestrator_rows(request(**{current: np.array([[value]], dtype=dtype), older: np.array([[3]], dtype=dtype)}),
                   SETTINGS)
    assert error.value.fix == f"send only {current}"


def test_penalties_reach_the_sampling_settings_and_a_time_limit_stays_within_the_server_s():
    rows = parse_orchestrator_rows(request(repetition_penalty=np.array([[1.3]], dtype=np.float32),
                              frequency_penalty=np.array([[0.5]], dtype=np.float32),
                              length_penalty=np.array([[2.0]], dtype=np.float32),
                              max_time=np.array([[5.0], [900.0]], dtype=np.float32)), SETTINGS)
    assert all(row.generation.sampling.penalized for row in rows)
    assert rows[0].generation.sampling.repetition_penalty == pytest.approx(1.3)
    assert [row.max_seconds for row in rows] == [5.0, 600.0]
    unlimited = replace(SETTINGS, max_request_seconds=0.0)
    assert [row.max_seconds for row in parse_orchestrator_rows(request(), unlimited)] == [None, None]


@pytest.mark.parametrize(("arrays", "message"), [
    ({"num_draft_tokens": np.array([[9]], dtype=np.int32)}, r"num_draft_tokens must be within 0\.\.8"),
    ({"beam_width": np.array([[2]], dtype=np.int32)}, "beam_width must be 1"),
    ({"num_return_sequences": np.array([[2]], dtype=np.int32)}, "num_return_sequences must be 1"),
    ({"max_tokens": np.array([[126]], dtype=np.int32)}, r"exceeds max_seq_len \(128\)"),
    ({"max_tokens": np.array([[0]], dtype=np.int32)}, "at least 1"),
    ({"temperature": np.array([[-1.0]], dtype=np.float32)}, "temperature must be a finite number >= 0"),
    ({"temperature": np.array([[np.inf]], dtype=np.float32)}, "temperature must be a finite number >= 0"),
    ({"temperature": np.array([[np.nan]], dtype=np.float32)}, "temperature must be a finite number >= 0"),
    ({"repetition_penalty": np.array([[0.0]], dtype=np.float32)}, "repetition_penalty must be a finite number > 0"),
    ({"presence_penalty": np.array([[np.inf]], dtype=np.float32)}, "presence_penalty must be a finite number"),
    ({"length_penalty": np.array([[np.nan]], dtype=np.float32)}, "length_penalty must be a finite number"),
    ({"min_length": np.array([[-2]], dtype=np.int32)}, "min_tokens must be 0 or more"),
    ({"max_time": np.array([[0.0]], dtype=np.float32)}, "max_time must be a finite number above 0"),
    ({"end_id": np.array([[320]], dtype=np.int32)}, r"end_id 320 is outside the vocabulary \[0, 320\)"),
    ({"guided_decoding_guide": np.array([[b"[ab]+"]], dtype=object)},
     "guided_decoding_guide was sent without guided_decoding_guide_type"),
    ({"guided_decoding_guide_type": np.array([[b"yaml"]], dtype=object)}, "guided_decoding_guide_type 'yaml' is not"),
    ({"guided_decoding_guide_type": np.array([[b"json_schema"]], dtype=object),
      "guided_decoding_guide": np.array([[b"{oops"]], dtype=object)}, "guided_decoding_guide is not a JSON schema"),
])
def test_bad_requests_name_the_input(arrays, message):
    with pytest.raises(RequestError, match=message):
        parse_orchestrator_rows(request(**arrays), replace(SETTINGS, guided_decoding=True))


def test_a_guide_is_read_per_row_and_refused_where_the_engines_take_no_masks():
    guided = request(guided_decoding_guide_type=np.array([[b"regex"], [b""]], dtype=object),
                     guided_decoding_guide=np.array([[b"[ab]+"], [b""]], dtype=object))
    rows = parse_orchestrator_rows(guided, replace(SETTINGS, guided_decoding=True))
    assert [row.guide for row in rows] == [GuideSpec("regex", "[ab]+"), None]
    with pytest.raises(RequestError) as refused:  # a TensorRT-LLM release: its engines take no guide masks
        parse_orchestrator_rows(guided, SETTINGS)
    assert refused.value.message.startswith("guided_decoding_guide_type='regex': this release's engine models")


def test_a_negative_end_id_never_stops():
    rows = parse_orchestrator_rows(request(end_id=np.array([[-1]], dtype=np.int32)), SETTINGS)
    assert [row.generation.end_id for row in rows] == [None, None]


def test_each_response_is_about_one_row():
    streamed, whole = parse_orchestrator_rows(request(stream=np.array([[True], [False]]),
                                         exclude_input_in_output=np.array([[False]])), SETTINGS)
    row = OrchestratorRowProgress(0, row=streamed, stats=SpeculationStats(drafted_tokens=4, accepted_tokens=3), scheduled_ns=10)
    row.add([1, 2], 20, None)
    first = row.response(5)
    row.add([3], 30, "length")
    second = row.response(5)
    assert first["output_ids"].tolist() == [[1, 2]] and second["output_ids"].tolist() == [[1, 2, 3]]
    assert [a["skip_tokens"].item() for a in (first, second)] == [0, 2]  # the text of those was sent
    assert [a["num_output_tokens"].item() for a in (first, second)] == [2, 1]  # each response's own tokens
    assert [a["is_final"].item() for a in (first, second)] == [False, True]
    assert (second["first_token_time_ns"].item(), second["last_token_time_ns"].item()) == (20, 30)
    assert second["acceptance_rate"].item() == 0.75 and second["arrival_time_ns"].item() == 5
    assert all(array.shape[0] == 1 for array in second.values())
    assert {name: array.dtype.name for name, array in second.items()} == {
        t.name: NUMPY_DTYPES[t.dtype] for t in ORCHESTRATOR_OUTPUTS}

    other = OrchestratorRowProgress(1, row=whole)
    other.add([4], 40, "end_id")
    answer = other.response(5)
    assert answer["output_ids"].tolist() == [[8, 9, 4]]  # the whole answer, with its prompt (not excluded)
    assert (answer["batch_index"].item(), answer["num_input_tokens"].item(), answer["output_token_count"].item()) \
        == (1, 2, 1)


# --- engine requests through the tensorrtllm backend's tensors -----------------------------------------------
ROUND_TRIPS = [
    EngineRequest([1, 2, 3], 4),
    EngineRequest([1, 2, 3], 3, sampling=SamplingParams(temperature=0.75, top_k=5, top_p=0.875), seed=2**63 + 5,
                  end_id=2, min_new_tokens=3, return_logits=True, bad_words=[[4], [5, 6]]),
    EngineRequest([9], 3, sampling=SamplingParams(), seed=7, end_id=0, draft_tokens=[4, 5],
                  draft_logits=torch.randn(2, 11)),
    EngineRequest([1, 2], 5, sampling=SamplingParams(temperature=0.5, top_k=1, repetition_penalty=1.25,
                                                     presence_penalty=0.375, frequency_penalty=-0.5)),
    EngineRequest([9], 1, draft_tokens=[4, 5], token_masks=torch.tensor([[5, -1], [7, 0], [-1, 3]], dtype=torch.int32)),
    EngineRequest([9], 3, sampling=SamplingParams(), seed=7, draft_tokens=[4, 5], draft_logits=torch.randn(2, 11),
                  verification="block"),
]


@pytest.mark.parametrize("engine_request", ROUND_TRIPS, ids=["greedy", "sampled-draft-call", "verification",
                                                                   "penalised-greedy", "guided-verification",
                                                                   "block-verification"])
def test_an_engine_request_survives_the_backend_tensors(engine_request):
    arrays = encode_request(engine_request)
    assert {"random_seed", "min_length"}.isdisjoint(arrays)  # the backend's current names only
    [decoded] = decode_requests(arrays, exclude_input_default=False)
    assert decoded.exclude_input is True  # the orchestrator always asks for new tokens only
    got, expected = decoded.request, engine_request
    assert (got.input_ids, got.max_new_tokens, got.sampling, got.seed, got.end_id, got.min_new_tokens,
            got.draft_tokens, got.return_logits, got.bad_words, got.verification) == (
        expected.input_ids, expected.max_new_tokens, expected.sampling, expected.seed, expected.end_id,
        expected.min_new_tokens, expected.draft_tokens, expected.return_logits, expected.bad_words,
        expected.verification)
    # block verification is specbuild's own input: a token-level request sends what a tensorrtllm engine takes
    assert ("block_verification" in arrays) == (expected.verification == "block")
    if expected.token_masks is None:
        assert got.token_masks is None and "guide_token_masks" not in arrays  # never sent to a tensorrtllm engine
    else:
        assert torch.equal(got.token_masks, expected.token_masks)
    if expected.draft_logits is None:
        assert got.draft_logits is None
    else:
        torch.testing.assert_close(got.draft_logits, expected.draft_logits)


def test_engine_inputs_follow_the_backend_s_sampling_rule():
    """What the torch engine model does with what a client of the tensorrtllm backend sends."""
    def sampling(**arrays: object) -> SamplingParams:
        base = {"input_ids": np.array([[1, 2]], dtype=np.int32), "request_output_len": np.array([2], dtype=np.int32)}
        [row] = decode_requests({**base, **{k: np.asarray(v) for k, v in arrays.items()}}, exclude_input_default=True)
        return row.request.sampling

    assert sampling() == GREEDY
    assert sampling(temperature=np.array([1.0], dtype=np.float32)) == GREEDY  # top_k = top_p = 0: greedy
    assert sampling(temperature=np.array([0.5], dtype=np.float32), runtime_top_p=np.array([0.875], dtype=np.float32)) \
        == SamplingParams(temperature=0.5, top_k=0, top_p=0.875)
    assert sampling(runtime_top_k=np.array([5], dtype=np.int32)) == SamplingParams(top_k=5)
    assert sampling(presence_penalty=np.array([0.5], dtype=np.float32), len_penalty=np.array([2.0], np.float32)) \
        == SamplingParams(top_k=1, presence_penalty=0.5)  # len_penalty: no effect at beam width 1


@pytest.mark.parametrize(("arrays", "message"), [
    ({"beam_width": np.array([2], dtype=np.int32)}, "beam_width must be 1"),
    ({"streaming": np.array([True])}, "Streaming is only supported if model is deployed using decoupled mode"),
    ({"request_output_len": None}, "request_output_len is not present"),
])
def test_engine_requests_the_backend_would_refuse_are_refused(arrays, message):
    base = {"input_ids": np.array([[1, 2]], dtype=np.int32), "request_output_len": np.array([2], dtype=np.int32)}
    with pytest.raises(RequestError, match=message):
        decode_requests({**base, **arrays}, exclude_input_default=True)


def test_engine_answers_with_or_without_the_input():
    request_ = EngineRequest([1, 2, 3], 2, return_logits=True)
    [row] = decode_requests(encode_request(request_), exclude_input_default=False)
    logits = torch.randn(2, 7)
    arrays = encode_outputs([row], [EngineOutput([8, 9], logits)], 7)
    assert arrays["output_ids"].shape == (1, 1, 2) and arrays["generation_logits"].shape == (1, 1, 2, 7)
    output = decode_output(arrays, request_)
    assert output.tokens == [8, 9]
    torch.testing.assert_close(output.logits, logits)
    echoed = {"output_ids": np.array([[[1, 2, 3, 8, 9]]], dtype=np.int32),
              "sequence_length": np.array([[5]], dtype=np.int32)}
    assert decode_output(echoed, request_).tokens == [8, 9]


def test_fast_logits_handles_pass_through_bit_for_bit():
    """With TensorRT-LLM's fast logits the draft returns a 16-byte handle as FP32 [1, 1, 1, 4]; the target
    must get exactly those bytes back as its draft_logits [1, 1, 4]."""
    handle = np.frombuffer(np.array([2**40 + 3], dtype=np.uint64).tobytes() + np.array([2, 0], dtype=np.int32)
                           .tobytes(), dtype=np.float32).reshape(1, 1, 1, 4)
    draft_request = EngineRequest([1, 2], 3, return_logits=True)
    answer = {"output_ids": np.array([[[4, 5, 6]]], dtype=np.int32), "sequence_length": np.array([[3]], dtype=np.int32),
              "generation_logits": handle}
    output = decode_output(answer, draft_request, fast_logits=True)
    sent = encode_request(EngineRequest([1, 2], 4, draft_tokens=output.tokens, draft_logits=output.logits))
    assert sent["draft_logits"].shape == (1, 1, 4)
    assert sent["draft_logits"].tobytes() == handle.tobytes()
