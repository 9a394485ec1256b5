"""Engine requests and responses as the ``tensorrtllm`` backend's tensors, both ways (pure numpy; no Triton).

The orchestrator encodes each :class:`~specbuild.speculation.engine_call.EngineRequest` with
:func:`encode_request` and reads the answer with :func:`decode_output`; the torch runtime's engine model
decodes what it receives with :func:`decode_requests` and answers with :func:`encode_outputs`. Names, dtypes
and semantics are those of :mod:`specbuild.package.backend_contract`, so what the orchestrator sends to a
torch engine on a CPU is what it sends to a TensorRT-LLM engine on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specbuild.errors import RequestError
from specbuild.package.backend_contract import BLOCK_VERIFICATION, ENGINE_INPUTS, GUIDE_MASKS
from specbuild.package.backend_guides import backend_guide
from specbuild.package.contract import NUMPY_DTYPES, by_name
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.guide_spec import GUIDE_INPUT, TYPE_INPUT
from specbuild.speculation.rules import SamplingParams
from specbuild.triton_models.batch import row_value
from specbuild.triton_models.text import decode_utf8, decode_word_list, encode_word_list

Arrays = Mapping[str, "np.ndarray | None"]
_ENGINE_INPUTS = by_name(ENGINE_INPUTS)


def _scalar(value: Any, dtype: Any) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def encode_request(request: EngineRequest) -> dict[str, np.ndarray]:
    """One request as the backend's input tensors (a batch of one): new tokens only, never streamed."""
    arrays = {
        "input_ids": np.array([request.input_ids], dtype=np.int32),
        "input_lengths": _scalar(len(request.input_ids), np.int32),
        "request_output_len": _scalar(request.max_new_tokens, np.int32),
        "exclude_input_in_output": _scalar(True, bool),
        "streaming": _scalar(False, bool),
        **{name: _scalar(value, NUMPY_DTYPES[_ENGINE_INPUTS[name].dtype])
           for name, value in request.sampling.backend_values().items()},
    }
    if request.end_id is not None:
        arrays["end_id"] = arrays["pad_id"] = _scalar(request.end_id, np.int32)
    if request.seed is not None:
        arrays["seed"] = _scalar(request.seed, np.uint64)
    if request.min_new_tokens:
        arrays["min_tokens"] = _scalar(request.min_new_tokens, np.int32)
    if request.bad_words:
        arrays["bad_words_list"] = encode_word_list(request.bad_words)[None]
    if request.draft_tokens:
        arrays["draft_input_ids"] = np.array([request.draft_tokens], dtype=np.int32)
    if request.draft_logits is not None:
        arrays["draft_logits"] = request.draft_logits.numpy().astype(np.float32)[None]
    if request.verification == "block":  # specbuild's own input too: never sent to the tensorrtllm backend
        arrays[BLOCK_VERIFICATION.name] = _scalar(True, bool)
    if request.return_logits:
        arrays["return_generation_logits"] = _scalar(True, bool)
    if request.token_masks is not None:  # specbuild's own input (backend_contract.GUIDE_MASKS): torch engines only
        arrays[GUIDE_MASKS.name] = request.token_masks.numpy().astype(np.int32)[None]
    if request.guide is not None:  # NVIDIA's inputs, for engines with the backend's guided decoding
        arrays[TYPE_INPUT] = np.array([[request.guide.type.encode()]], dtype=object)
        if request.guide.text:
            arrays[GUIDE_INPUT] = np.array([[request.guide.text.encode()]], dtype=object)
    return arrays


@dataclass(frozen=True)
class DecodedRequest:
    """One row of an engine model's request, and whether its answer leaves the input out."""

    request: EngineRequest
    exclude_input: bool


def decode_requests(arrays: Arrays, *, exclude_input_default: bool,
                    guided_decoding: bool = False) -> list[DecodedRequest]:
    """The rows of an engine model's request, read as the ``tensorrtllm`` backend reads them
    (``utils.cc``): sampling by :meth:`SamplingParams.from_backend`, ``exclude_input_in_output`` overriding
    the model's parameter; beam search and streaming refused with the backend's reasons. ``len_penalty`` only
    scores finished beams, so at beam width 1 it has no effect, here as in the backend. A guide by
    :func:`~specbuild.package.backend_guides.backend_guide` (``guided_decoding``: the model's parameters turn the
    backend's guided decoding on)."""
    input_ids = arrays.get("input_ids")
    output_len = arrays.get("request_output_len")
    if input_ids is None:
        raise RequestError("input_ids is not present in the request")
    if output_len is None:
        raise RequestError("request_output_len is not present in the request")
    draft_ids, draft_logits, bad_words, masks = (arrays.get(name) for name in (
        "draft_input_ids", "draft_logits", "bad_words_list", GUIDE_MASKS.name))
    rows = []
    for row in range(input_ids.shape[0]):
        def get(name: str, row: int = row) -> Any:
            return row_value(arrays.get(name), row)

        if (get("beam_width") or 1) != 1:
            raise RequestError("beam_width must be 1: draft-target speculative decoding has no beam search")
        if get("streaming"):
            raise RequestError("Streaming is only supported if model is deployed using decoupled mode.")
        length = get("input_lengths")
        prompt = input_ids[row].reshape(-1)[: input_ids.shape[-1] if length is None else int(length)].tolist()
        drafts = draft_ids[row].reshape(-1).tolist() if draft_ids is not None and draft_ids.size else None
        sampling = SamplingParams.from_backend(get("temperature"), get("runtime_top_k"), get("runtime_top_p"),
                                               get("repetition_penalty"), get("presence_penalty"),
                                               get("frequency_penalty"))
        exclude = get("exclude_input_in_output")
        guide_type, guide = (None if get(name) is None else decode_utf8(get(name), name)
                             for name in (TYPE_INPUT, GUIDE_INPUT))
        rows.append(DecodedRequest(EngineRequest(
            input_ids=prompt,
            max_new_tokens=int(row_value(output_len, row)),
            sampling=sampling,
            seed=get("seed"),
            end_id=get("end_id"),
            min_new_tokens=int(get("min_tokens") or 0),
            draft_tokens=drafts,
            draft_logits=None if draft_logits is None or not draft_logits.size
            else torch.from_numpy(np.asarray(draft_logits[row], dtype=np.float32).reshape(-1, draft_logits.shape[-1])),
            verification="block" if get(BLOCK_VERIFICATION.name) else "token",
            return_logits=bool(get("return_generation_logits")),
            bad_words=decode_word_list(None if bad_words is None else bad_words[row]),
            token_masks=None if masks is None or not masks.size
            else torch.from_numpy(np.asarray(masks[row], dtype=np.int32).reshape(-1, masks.shape[-1])),
            guide=backend_guide(guide_type, guide, configured=guided_decoding, draft_tokens=bool(drafts)),
        ), exclude_input_default if exclude is None else bool(exclude)))
    return rows


def encode_outputs(rows: Sequence[DecodedRequest], outputs: Sequence[EngineOutput], vocab_size: int) -> dict[str, np.ndarray]:
    """The backend's outputs for ``rows``: ``output_ids [batch, beam, tokens]`` (-1 padded), ``sequence_length
    [batch, beam]`` and, when any row asked for them, ``generation_logits [batch, beam, tokens, vocab]``."""
    sequences = [(row.request.input_ids if not row.exclude_input else []) + output.tokens
                 for row, output in zip(rows, outputs)]
    width = max(len(sequence) for sequence in sequences)
    ids = np.full((len(sequences), 1, width), -1, dtype=np.int32)
    for index, sequence in enumerate(sequences):
        ids[index, 0, : len(sequence)] = sequence
    arrays = {"output_ids": ids,
              "sequence_length": np.array([[len(sequence)] for sequence in sequences], dtype=np.int32)}
    if any(row.request.return_logits for row in rows):
        steps = max(output.logits.shape[0] for output in outputs if output.logits is not None)
        logits = np.zeros((len(outputs), 1, steps, vocab_size), dtype=np.float32)
        for index, output in enumerate(outputs):
            if output.logits is not None:
                logits[index, 0, : output.logits.shape[0]] = output.logits.numpy()
        arrays["generation_logits"] = logits
    return arrays


def decode_output(arrays: Arrays, request: EngineRequest, *, fast_logits: bool = False) -> EngineOutput:
    """The new tokens (and logits) of one engine answer to ``request``, whether or not it echoed the input.

    With TensorRT-LLM's fast logits the draft's ``generation_logits`` are a small handle for the target to
    fetch the logits GPU to GPU: kept as they are, to be sent back unchanged as the target's ``draft_logits``.
    """
    ids, lengths = arrays.get("output_ids"), arrays.get("sequence_length")
    if ids is None or lengths is None:
        raise RequestError("the engine's answer lacks output_ids or sequence_length")
    length = int(lengths.reshape(-1)[0])
    tokens = ids.reshape(-1)[:length].tolist()
    if length > request.max_new_tokens:  # the engine returned input + output
        tokens = tokens[len(request.input_ids):]
    logits = None
    raw = arrays.get("generation_logits")
    if request.return_logits and raw is not None:
        if fast_logits:
            logits = torch.from_numpy(np.array(raw, dtype=np.float32).reshape(1, -1))
        else:
            logits = torch.from_numpy(np.array(raw, dtype=np.float32).reshape(-1, raw.shape[-1]))[: len(tokens)]
    return EngineOutput(tokens, logits)
