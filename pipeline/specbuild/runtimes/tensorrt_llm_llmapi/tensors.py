"""Requests to and answers from TensorRT-LLM's LLM-API model as its tensors, both ways (pure numpy; no Triton).

The adapter encodes each :class:`LLMAPIRequest` with :func:`encode_request` and reads each answer with
:func:`decode_answer`; the CPU stand-in of the LLM-API model decodes what it receives with :func:`decode_request`
and answers with :func:`encode_answer`. Names, dtypes and shapes are those of
:data:`specbuild.runtimes.tensorrt_llm_llmapi.contract.LLMAPI_INPUTS`/``LLMAPI_OUTPUTS``; how each is read follows
upstream ``helpers.py`` (every scalar of size 1, ``text_input`` one string) and how each is sent follows
``model.py`` (one string per output, statistics as strings, reasons and statistics only when asked for).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import NUMPY_DTYPES, by_name
from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_INPUTS, LLMAPI_OUTPUTS
from specbuild.triton_models.text import decode_utf8

Arrays = Mapping[str, "np.ndarray | None"]
_INPUTS = by_name(LLMAPI_INPUTS)
_OUTPUTS = by_name(LLMAPI_OUTPUTS)
# LLMAPIRequest field -> the model's input, where they differ.
_SAMPLING = {"max_tokens": "sampling_param_max_tokens", "temperature": "sampling_param_temperature",
             "top_k": "sampling_param_top_k", "top_p": "sampling_param_top_p", "seed": "sampling_param_seed",
             "presence_penalty": "sampling_param_presence_penalty",
             "frequency_penalty": "sampling_param_frequency_penalty",
             "exclude_input_from_output": "sampling_param_exclude_input_from_output",
             "return_perf_metrics": "sampling_param_return_perf_metrics"}
_FLAGS = ("streaming", "return_finish_reason", "return_stop_reason")
# Inputs that the stand-in does not rehearse, with the value that means "not used".
_UNUSED = {"sampling_param_best_of": 1, "return_cumulative_logprob": False, "stop": False}
# Inputs upstream declares but cannot take as Triton sends them, and why.
_BROKEN = {"sampling_param_stop": "upstream helpers.py hands the BYTES items to SamplingParams.stop, which tokenizes "
                                  "str only, so the request fails (the adapter ends stop words itself)"}


@dataclass(frozen=True)
class LLMAPIRequest:
    """One request to the LLM-API model, in ``SamplingParams`` terms; None: left to the model's default."""

    prompt: str
    max_tokens: int
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    exclude_input_from_output: bool = True
    streaming: bool = False
    return_perf_metrics: bool = True
    return_finish_reason: bool = True
    return_stop_reason: bool = True


@dataclass(frozen=True)
class LLMAPIAnswer:
    """One answer: the text so far (streamed: the whole of it, not a delta), why it ended, acceptance so far."""

    text: str
    finish_reason: str | None = None
    stop_reason: str | None = None
    acceptance_rate: float | None = None
    total_accepted_draft_tokens: int | None = None
    total_draft_tokens: int | None = None


def _array(name: str, value: Any, tensors: Mapping[str, Any]) -> np.ndarray:
    dtype = NUMPY_DTYPES[tensors[name].dtype]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if dtype == "object":
        items = [str(item).encode("utf-8") for item in items]
    return np.array(items, dtype=dtype)


def encode_request(request: LLMAPIRequest) -> dict[str, np.ndarray]:
    """The model's input tensors (``max_batch_size: 0``: whole shapes, every scalar ``[1]``)."""
    arrays = {"text_input": _array("text_input", request.prompt, _INPUTS)}
    for field, name in _SAMPLING.items():
        value = getattr(request, field)
        if value is not None:
            arrays[name] = _array(name, value, _INPUTS)
    for name in _FLAGS:
        arrays[name] = _array(name, getattr(request, name), _INPUTS)
    return arrays


def _scalar(arrays: Arrays, name: str) -> Any:
    """A scalar input as helpers.py reads it: absent is None, anything but one element is an error."""
    array = arrays.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise RequestError(f"{name} must hold one value, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    return value.item() if hasattr(value, "item") else value


def decode_request(arrays: Arrays) -> LLMAPIRequest:
    """The request the model received; inputs outside :data:`LLMAPI_INPUTS`, and the ones the stand-in does not
    rehearse at other than their neutral value, are refused naming the input."""
    unknown = sorted(set(arrays) - set(_INPUTS))
    if unknown:
        raise RequestError(f"unexpected input(s) {', '.join(unknown)}: not in the LLM-API model's contract")
    for name, why in _BROKEN.items():
        if arrays.get(name) is not None:
            raise RequestError(f"{name}: {why}")
    for name, array in arrays.items():
        if array is not None and np.dtype(NUMPY_DTYPES[_INPUTS[name].dtype]) != array.dtype:
            raise RequestError(f"{name} must be {_INPUTS[name].dtype}, got {array.dtype}")
    texts = arrays.get("text_input")
    if texts is None or texts.ndim != 1 or texts.size != 1:
        raise RequestError("text_input must be one string of shape [1]")
    for name, neutral in _UNUSED.items():
        value = _scalar(arrays, name)
        if value is not None and value != neutral:
            raise RequestError(f"{name}={value!r}: the CPU stand-in does not rehearse it (specbuild never sends it)")
    max_tokens = _scalar(arrays, "sampling_param_max_tokens")
    if max_tokens is None:
        raise RequestError("sampling_param_max_tokens is required here (the LLM API's default is 32 tokens)")
    fields = {field: _scalar(arrays, name) for field, name in _SAMPLING.items()}
    fields.update({name: bool(_scalar(arrays, name) or False) for name in _FLAGS})
    fields["exclude_input_from_output"] = bool(fields["exclude_input_from_output"] or False)
    fields["return_perf_metrics"] = bool(fields["return_perf_metrics"] or False)
    return LLMAPIRequest(
        prompt=decode_utf8(texts[0], "text_input"), **{**fields, "max_tokens": int(max_tokens)},
    )


def encode_answer(answer: LLMAPIAnswer, request: LLMAPIRequest) -> dict[str, np.ndarray]:
    """The model's output tensors for ``answer``: reasons and statistics only when the request asked for them,
    every one a string, as upstream ``model.py`` sends them."""
    arrays = {"text_output": _array("text_output", answer.text, _OUTPUTS)}
    if request.return_finish_reason:
        arrays["finish_reason"] = _array("finish_reason", answer.finish_reason, _OUTPUTS)
    if request.return_stop_reason:
        arrays["stop_reason"] = _array("stop_reason", answer.stop_reason, _OUTPUTS)
    if request.return_perf_metrics:
        for name in ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"):
            arrays[name] = _array(name, getattr(answer, name), _OUTPUTS)
    return arrays


def _first(arrays: Arrays, name: str) -> Any:
    array = arrays.get(name)
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    return decode_utf8(value, name) if isinstance(value, (bytes, np.bytes_)) else value


def _number(arrays: Arrays, name: str, kind: type) -> Any:
    """A statistic sent as a string (or, were upstream to send its declared type, as a number)."""
    value = _first(arrays, name)
    if value is None or value == "None":
        return None
    try:
        return kind(float(value))
    except ValueError:
        raise RequestError(f"the LLM-API model sent {name}={value!r}, not a number") from None


def decode_answer(arrays: Arrays) -> LLMAPIAnswer:
    """One answer of the model; its optional outputs None where it sent none."""
    text = _first(arrays, "text_output")
    if text is None:
        raise RequestError("the LLM-API model's answer lacks text_output")
    reasons = {name: _first(arrays, name) for name in ("finish_reason", "stop_reason")}
    return LLMAPIAnswer(
        text=text, **{name: None if value in (None, "None") else str(value) for name, value in reasons.items()},
        acceptance_rate=_number(arrays, "acceptance_rate", float),
        total_accepted_draft_tokens=_number(arrays, "total_accepted_draft_tokens", int),
        total_draft_tokens=_number(arrays, "total_draft_tokens", int),
    )
