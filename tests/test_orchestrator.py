"""The orchestrator's logic without a server: its parameters as the repository renders them, request parsing,
response tensors, and engine requests through the backend's tensors and back (the engine model's decoder).
Serving is covered end to end in test_e2e_serving.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from specbuild.errors import RequestError, SpecError
from specbuild.package.contract import OrchestratorParameters
from specbuild.package.repository import EngineInfo, orchestrator_config
from specbuild.serve.engine_io import decode_output, decode_requests, encode_outputs, encode_request
from specbuild.serve.orchestration import parse_rows, response_arrays
from specbuild.spec import load_spec
from specbuild.speculation.engine import EngineOutput, EngineRequest
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.rules import GREEDY, SamplingParams
from specbuild.speculation.stats import SpeculationStats

TARGET_RECORD = {"max_draft_len": 8, "max_seq_len": 136, "max_input_len": 64}


def rendered_parameters(tmp_path: Path, runtime: str = "torch", **speculation: object) -> dict[str, str]:
    spec = load_spec(None, {"runtime": runtime, "target.checkpoint": "t", "draft.checkpoint": "d",
                            "limits.max_input_len": 64, "limits.max_seq_len": 128,
                            **{f"speculation.{key}": value for key, value in speculation.items()}}, base_dir=tmp_path)
    target = EngineInfo(role="target", runtime=runtime, path=tmp_path, dtype="float16", vocab_size=320,
                        build_config=TARGET_RECORD)
    return {key: value.string_value for key, value in orchestrator_config(spec, target).parameters.items()}


@pytest.mark.parametrize("runtime", ["torch", "tensorrt-llm"])
def test_parameters_read_back_what_the_repository_renders(tmp_path, runtime):
    settings = OrchestratorParameters.from_parameters(rendered_parameters(
        tmp_path, runtime, **{"prompt_lookup.enabled": True, "prompt_lookup.max_ngram": 3,
                              "prompt_lookup.min_ngram": 1, "prompt_lookup.draft_fallback": False}))
    assert settings.prompt_lookup is True and settings.lookup == PromptLookup(max_ngram=3, min_ngram=1)
    assert settings.lookup_draft_fallback is False and settings.fast_logits is False
    # limits come from the target engine's build record: what it was built for, less the draft tokens
    assert (settings.max_draft_len, settings.max_seq_len, settings.max_input_len) == (8, 128, 64)
    default = OrchestratorParameters.from_parameters(rendered_parameters(tmp_path, runtime))
    assert default.prompt_lookup is False and default.lookup == PromptLookup()


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
                                  prompt_lookup=False, lookup_max_ngram=4, lookup_min_ngram=2,
                                  lookup_draft_fallback=True, fast_logits=False, max_input_len=64, max_seq_len=128)


def request(**arrays: object) -> dict[str, np.ndarray]:
    base = {"input_ids": np.array([[5, 6, 7, 0], [8, 9, 0, 0]], dtype=np.int32),
            "input_length": np.array([[3], [2]], dtype=np.int32), "max_tokens": np.array([[10]], dtype=np.int32)}
    return {**base, **{name: np.asarray(value) for name, value in arrays.items()}}


def test_rows_take_their_own_prompt_and_a_broadcast_setting():
    rows = parse_rows(request(temperature=np.array([[0.5]], dtype=np.float32), stream=np.array([[True]])), SETTINGS)
    assert [row.generation.prompt_ids for row in rows] == [[5, 6, 7], [8, 9]]
    assert all(row.generation.max_tokens == 10 and row.stream for row in rows)
    assert all(row.generation.sampling == SamplingParams(temperature=0.5) for row in rows)
    assert all(row.generation.num_draft_tokens == 4 and row.generation.target_only_chunk == 1 for row in rows)


@pytest.mark.parametrize(("arrays", "message"), [
    ({"num_draft_tokens": np.array([[9]], dtype=np.int32)}, r"num_draft_tokens must be within 0\.\.8"),
    ({"beam_width": np.array([[2]], dtype=np.int32)}, "beam_width must be 1"),
    ({"max_tokens": np.array([[126]], dtype=np.int32)}, r"exceeds max_seq_len \(128\)"),
    ({"max_tokens": np.array([[0]], dtype=np.int32)}, "at least 1"),
    ({"temperature": np.array([[-1.0]], dtype=np.float32)}, "temperature must be >= 0"),
])
def test_bad_requests_name_the_input(arrays, message):
    with pytest.raises(RequestError, match=message):
        parse_rows(request(**arrays), SETTINGS)


def test_response_arrays_per_row():
    stats = SpeculationStats(drafted_tokens=4, accepted_tokens=3)
    arrays = response_arrays([[1, 2, 3], [4]], [1, 0], False, [stats, SpeculationStats()], [3, 1])
    assert arrays["output_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert arrays["output_length"].tolist() == [[3], [1]] and arrays["skip_tokens"].tolist() == [[1], [0]]
    assert arrays["acceptance_rate"].tolist() == [[0.75], [0.0]] and arrays["is_final"].tolist() == [[False]] * 2
    assert {name: array.dtype.name for name, array in arrays.items()} == {
        "output_ids": "int32", "output_length": "int32", "skip_tokens": "int32", "is_final": "bool",
        "acceptance_rate": "float32", "total_accepted_draft_tokens": "int32", "total_draft_tokens": "int32",
        "output_token_count": "int32"}


# --- engine requests through the tensorrtllm backend's tensors -----------------------------------------------
ROUND_TRIPS = [
    EngineRequest([1, 2, 3], 4),
    EngineRequest([1, 2, 3], 3, sampling=SamplingParams(temperature=0.75, top_k=5, top_p=0.875), seed=2**63 + 5,
                  end_id=2, min_new_tokens=3, return_logits=True, bad_words=[[4], [5, 6]]),
    EngineRequest([9], 3, sampling=SamplingParams(), seed=7, end_id=0, draft_tokens=[4, 5],
                  draft_logits=torch.randn(2, 11)),
]


@pytest.mark.parametrize("engine_request", ROUND_TRIPS, ids=["greedy", "sampled-draft-call", "verification"])
def test_an_engine_request_survives_the_backend_tensors(engine_request):
    arrays = encode_request(engine_request)
    assert {"random_seed", "min_length"}.isdisjoint(arrays)  # the backend's current names only
    [decoded] = decode_requests(arrays, exclude_input_default=False)
    assert decoded.exclude_input is True  # the orchestrator always asks for new tokens only
    got, expected = decoded.request, engine_request
    assert (got.input_ids, got.max_new_tokens, got.sampling, got.seed, got.end_id, got.min_new_tokens,
            got.draft_tokens, got.return_logits, got.bad_words) == (
        expected.input_ids, expected.max_new_tokens, expected.sampling, expected.seed, expected.end_id,
        expected.min_new_tokens, expected.draft_tokens, expected.return_logits, expected.bad_words)
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
