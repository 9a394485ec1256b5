"""The CPU stand-in of the ``tensorrtllm`` backend's guided decoding (the torch engine model's reading of NVIDIA's
guide inputs, :mod:`specbuild.package.backend_guides`, and :class:`BackendGuidedEngine`): it refuses what the backend
refuses and what the backend would drop silently, and it honours a guide from the request's first new token, one
masked step at a time, on a real tiny engine and xgrammar."""

from __future__ import annotations

import re

import numpy as np
import pytest

from random_llama import END, TOKENS
from specbuild.errors import RequestError
from specbuild.package.backend_guides import backend_guide, write_tokenizer_info
from specbuild.runtimes.torch.backend_guided import BackendGuidedEngine
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.speculation.engine_call import EngineRequest
from specbuild.speculation.guide_spec import GuideSpec
from specbuild.triton_models.engine_io import decode_requests, encode_request

REGEX = r"[ab]+c|[0-3]{2}x?"


@pytest.fixture(scope="module")
def tokenizer_info_path(tiny_tokenizer, tmp_path_factory):
    return write_tokenizer_info(tiny_tokenizer[1], tmp_path_factory.mktemp("tokenizer_info"))


@pytest.fixture(scope="module")
def guided_target(tiny, tokenizer_info_path):
    return BackendGuidedEngine(TorchEngine(tiny.target, max_draft_len=4), tokenizer_info_path)


def strings(**values: str) -> dict[str, np.ndarray]:
    return {name: np.array([[value.encode()]], dtype=object) for name, value in values.items()}


BASE = {"input_ids": np.array([[1, 5, 9]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
        "request_output_len": np.array([[8]], dtype=np.int32)}


@pytest.mark.parametrize(("inputs", "configured", "problem"), [
    (strings(guided_decoding_guide="[ab]+"), True, "guided_decoding_guide without guided_decoding_guide_type"),
    (strings(guided_decoding_guide_type="yaml"), True, "'yaml': the tensorrtllm backend knows json, json_schema"),
    (strings(guided_decoding_guide_type="regex"), True, "The guide string must be provided unless using GuideType::kJSON"),
    (strings(guided_decoding_guide_type="json"), False, "this engine has no guided decoding configured"),
    ({**strings(guided_decoding_guide_type="regex", guided_decoding_guide="[ab]+"),
      "draft_input_ids": np.array([[3, 4]], dtype=np.int32)}, True, "with draft_input_ids"),
], ids=["guide-without-type", "unknown-type", "regex-without-guide", "not-configured", "with-draft-tokens"])
def test_the_stand_in_refuses_what_the_backend_refuses_or_would_drop(inputs, configured, problem):
    with pytest.raises(RequestError, match=re.escape(problem)):
        decode_requests({**BASE, **inputs}, exclude_input_default=True, guided_decoding=configured)


def test_the_backends_guide_inputs_round_trip_and_json_needs_no_guide():
    for guide in (GuideSpec("json"), GuideSpec("regex", REGEX), GuideSpec("json_schema", '{"type": "object"}')):
        arrays = encode_request(EngineRequest([1, 5], 4, guide=guide))
        assert ("guided_decoding_guide" in arrays) == bool(guide.text)
        [decoded] = decode_requests(arrays, exclude_input_default=True, guided_decoding=True)
        assert decoded.request.guide == guide
    assert backend_guide(None, None, configured=False, draft_tokens=True) is None  # unguided: nothing to check


def text(tokens: list[int]) -> str:
    return "".join(TOKENS[token] for token in tokens)


@pytest.mark.parametrize("prompt", [[1, 5, 9], [1, 3, 4, 3, 4, 3]])
def test_the_stand_in_honours_a_guide_from_the_first_new_token(guided_target, prompt):
    unguided = guided_target.run(EngineRequest(prompt, 10, end_id=END))
    guided = guided_target.run(EngineRequest(prompt, 10, end_id=END, guide=GuideSpec("regex", REGEX)))
    assert unguided.tokens != guided.tokens  # the grammar changed the answer
    assert guided.tokens[-1] == END and re.fullmatch(REGEX, text(guided.tokens[:-1])), text(guided.tokens)


def test_an_invalid_guide_is_the_requests_error(guided_target):
    with pytest.raises(RequestError, match="guided_decoding_guide is not a valid regex"):
        guided_target.run(EngineRequest([1, 5, 9], 4, end_id=END, guide=GuideSpec("regex", "[ab")))
