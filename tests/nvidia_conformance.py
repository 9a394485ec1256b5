"""A conformance client for the ensemble: what NVIDIA's ``end_to_end_grpc_client.py`` does, written for this
project (its behaviour was learned by reading TensorRT-LLM ``triton_backend/inflight_batcher_llm/client/
end_to_end_grpc_client.py`` and tensorrtllm_backend v0.19.0's copy, which agree; none of its code is here).

With its default flags that client sends, per prompt, exactly six tensors shaped ``[1, 1]``: ``text_input``
(BYTES, the prompt as a Python ``str`` in an object array), ``max_tokens`` (INT32, 100), ``stream`` (BOOL),
``beam_width`` (INT32, 1), ``temperature`` (FP32, 1.0) and ``exclude_input_in_output`` (BOOL, False); it asks for
the output ``text_output`` only (and ``batch_index`` when the prompts go as one batch); it always uses the
bidirectional gRPC stream (``start_stream``, ``async_stream_infer`` with ``request_id=""`` and no
``enable_empty_final_response``, ``stop_stream`` to wait), and reads each response as
``result.as_numpy("text_output")[0].decode("utf-8")``: appended when streaming, the last one otherwise.
``--guided-decoding-guide-type`` and ``--guided-decoding-guide`` add those inputs, after the others
(:func:`guided_inputs`). ``--check-outputs`` compares each text with the expected one, preceded by the prompt when the request neither
streamed nor excluded the input.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

DEFAULT_OUTPUT_LEN = 100  # -o
DEFAULT_TEMPERATURE = 1.0  # --temperature
DEFAULT_BEAM_WIDTH = 1  # -b
# Flag inputs the client adds after exclude_input_in_output (the others go before it).
AFTER_EXCLUDE = ("lora_weights", "lora_config", "lora_task_id", "return_perf_metrics", "guided_decoding_guide_type",
                 "guided_decoding_guide")


@dataclass
class Answer:
    """What the client ends with: one text per prompt, and the errors it printed."""

    texts: list[str]
    errors: list[str]


def request_arrays(prompt: str, *, streaming: bool = False, output_len: int = DEFAULT_OUTPUT_LEN,
                   temperature: float = DEFAULT_TEMPERATURE, exclude_input_in_output: bool = False,
                   **optional: np.ndarray) -> dict[str, np.ndarray]:
    """One prompt's tensors, in the client's order, each ``[1, 1]``; ``optional`` adds what a flag would."""
    arrays = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.array([[output_len]], dtype=np.int32),
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[DEFAULT_BEAM_WIDTH]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
    }
    arrays.update({name: array for name, array in optional.items() if name not in AFTER_EXCLUDE})
    arrays["exclude_input_in_output"] = np.array([[exclude_input_in_output]], dtype=bool)
    arrays.update({name: array for name, array in optional.items() if name in AFTER_EXCLUDE})
    return arrays


def guided_inputs(guide_type: str, guide: str | None = None) -> dict[str, np.ndarray]:
    """What ``--guided-decoding-guide-type TYPE`` (and ``--guided-decoding-guide GUIDE``, when given) add: BYTES
    ``[1, 1]`` each, the guide only when the flag is there (the client sends none for ``json``)."""
    arrays = {"guided_decoding_guide_type": np.array([[guide_type]]).astype(object)}
    if guide is not None:
        arrays["guided_decoding_guide"] = np.array([[guide]]).astype(object)
    return arrays


def run(url: str, prompts: Sequence[str], *, streaming: bool = False, batch_inputs: bool = False,
        outputs: Sequence[str] = (), **options: Any) -> Answer:
    """Send ``prompts`` as the client does (one stream per request; with ``batch_inputs`` one request holding
    every prompt as a row) and assemble the texts as it does."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    per_prompt = [request_arrays(prompt, streaming=streaming, **options) for prompt in prompts]
    if batch_inputs:
        per_prompt = [{name: np.concatenate([arrays[name] for arrays in per_prompt]) for name in per_prompt[0]}]
    requested = ["text_output", *outputs, *(["batch_index"] if batch_inputs else [])]
    texts: list[str] = []
    errors: list[str] = []
    client = grpcclient.InferenceServerClient(url=url)
    for arrays in per_prompt:
        inputs = []
        for name, array in arrays.items():
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        results: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put(error if error else result))
        client.async_stream_infer("ensemble", inputs, outputs=[grpcclient.InferRequestedOutput(name)
                                                               for name in requested], request_id="")
        client.stop_stream()  # returns once the server has finished the request
        rows = [""] * arrays["text_input"].shape[0]
        while not results.empty():
            result = results.get()
            if isinstance(result, InferenceServerException):
                errors.append(result.message())
                continue
            index = result.as_numpy("batch_index")
            row = 0 if index is None else index[0][0]
            piece = result.as_numpy("text_output")[0].decode("utf-8")
            rows[row] = rows[row] + piece if streaming else piece
        texts.extend(rows)
    client.close()
    return Answer(texts, errors)


def check_outputs(prompts: Sequence[str], texts: Sequence[str], expected: Sequence[str], *, streaming: bool,
                  exclude_input_in_output: bool = False) -> None:
    """``--check-outputs``: one text per prompt, each the expected one, after the prompt when the request
    neither streamed nor excluded the input (raises AssertionError, the client's exit 1)."""
    assert len(expected) == len(texts), (expected, texts)
    for prompt, text, wanted in zip(prompts, texts, expected):
        if not streaming and not exclude_input_in_output:
            wanted = prompt + wanted
        assert text == wanted, (text, wanted)
