"""The ensemble takes no request parameters (Triton's HTTP generate endpoint makes one of every key that names no
input): its first model refuses them, naming each, with the input meant where one is close."""

from __future__ import annotations

import pytest

from specbuild.errors import RequestError
from specbuild.package.contract import ENSEMBLE_INPUTS
from specbuild.triton_models.request_parameters import refuse_parameters

INPUTS = [tensor.name for tensor in ENSEMBLE_INPUTS]


@pytest.mark.parametrize("parameters", ["", "{}", '{"id": "request-7"}'])
def test_no_parameters_or_only_triton_s_own_pass(parameters: str) -> None:
    refuse_parameters(parameters, INPUTS)


def test_an_unknown_key_is_named_with_the_input_it_was_meant_to_be() -> None:
    with pytest.raises(RequestError) as refused:
        refuse_parameters('{"temprature": 0.9}', INPUTS)
    assert "unknown input 'temprature' (did you mean 'temperature'?)" in refused.value.message
    assert "GET /v2/models/ensemble/config" in (refused.value.fix or "")


def test_every_unknown_key_is_named_once() -> None:
    with pytest.raises(RequestError) as refused:
        refuse_parameters('{"no_such_input": 1, "max_token": 3, "id": "x"}', INPUTS)
    message = refused.value.message
    assert message.startswith("unknown inputs 'max_token' (did you mean 'max_tokens'?), 'no_such_input':")
    assert "'id'" not in message
