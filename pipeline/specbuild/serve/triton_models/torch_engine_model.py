"""Triton model ``target`` / ``draft`` for the torch runtime: the ``tensorrtllm`` backend's tensor interface
served by :class:`specbuild.speculation.torch_engine.TorchEngine`.

Parameters: ``engine_dir`` (the built engine folder: absolute, or relative to the repository's parent
folder and then confined to it), ``dtype``, ``max_seq_len``, ``max_draft_len``, ``cache_entries``,
``device`` ("auto": CUDA when available).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from specbuild.errors import RequestError
from specbuild.speculation.rules import SamplingParams
from specbuild.serve.text import decode_word_list
from specbuild.speculation.torch_engine import EngineRequest, TorchEngine
from specbuild.serve.triton_models.common import error_response, model_parameters, optional_input, required_input, row_scalar


def resolve_engine_dir(value: str, repository: Path) -> Path:
    """``engine_dir`` as a path; a relative one may not climb out of the release folder."""
    path = Path(value)
    if path.is_absolute():
        return path
    release_root = repository.parent.resolve()
    resolved = (release_root / path).resolve()
    if release_root != resolved and release_root not in resolved.parents:
        raise ValueError(f"engine_dir {value!r} escapes the release folder {release_root}")
    return resolved


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        parameters = model_parameters(args)
        repository = Path(args["model_repository"]).parent
        device = parameters.get("device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.engine = TorchEngine(
            resolve_engine_dir(parameters["engine_dir"], repository),
            dtype=parameters.get("dtype", "float32"),
            device=device,
            max_seq_len=int(parameters["max_seq_len"]),
            max_draft_len=int(parameters.get("max_draft_len", "0")),
            cache_entries=int(parameters.get("cache_entries", "8")),
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._run(request))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(f"{exc}"))
        return responses

    def _run(self, request: Any) -> Any:
        input_ids = required_input(request, "input_ids")
        lengths = optional_input(request, "input_lengths")
        output_len = required_input(request, "request_output_len")
        fields = {name: optional_input(request, name) for name in (
            "end_id", "runtime_top_k", "runtime_top_p", "temperature", "random_seed", "min_length",
            "return_generation_logits", "exclude_input_in_output", "beam_width")}
        draft_ids = optional_input(request, "draft_input_ids")
        draft_logits = optional_input(request, "draft_logits")
        bad_words = optional_input(request, "bad_words_list")
        rows, sequences, logits = input_ids.shape[0], [], []
        want_logits = False
        for row in range(rows):
            get = lambda name, default=None: row_scalar(fields[name], row, default)  # noqa: E731
            if int(get("beam_width", 1)) != 1:
                raise RequestError("beam_width must be 1 for the torch runtime")
            length = int(row_scalar(lengths, row, input_ids.shape[1]))
            prompt = input_ids[row].reshape(-1)[:length].tolist()
            drafts = draft_ids[row].reshape(-1).tolist() if draft_ids is not None and draft_ids.size else None
            want_logits = bool(get("return_generation_logits", False))
            output = self.engine.run(EngineRequest(
                input_ids=prompt,
                max_new_tokens=int(row_scalar(output_len, row)),
                sampling=SamplingParams.from_request(get("temperature"), get("runtime_top_k"), get("runtime_top_p")),
                seed=get("random_seed"),
                end_id=get("end_id"),
                min_new_tokens=int(get("min_length", 0)),
                draft_tokens=drafts,
                draft_logits=None if draft_logits is None or not draft_logits.size
                else torch.from_numpy(np.asarray(draft_logits[row], dtype=np.float32)),
                return_logits=want_logits,
                bad_words=decode_word_list(None if bad_words is None else bad_words[row]),
            ))
            keep_input = not bool(get("exclude_input_in_output", False))
            sequences.append((prompt if keep_input else []) + output.tokens)
            logits.append(output.logits)
        width = max(len(seq) for seq in sequences)
        ids = np.zeros((rows, 1, width), dtype=np.int32)
        for row, seq in enumerate(sequences):
            ids[row, 0, : len(seq)] = seq
        outputs = [
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", np.array([[len(seq)] for seq in sequences], dtype=np.int32)),
        ]
        if want_logits:
            steps = max(item.shape[0] for item in logits if item is not None)
            array = np.zeros((rows, 1, steps, self.engine.vocab_size), dtype=np.float32)
            for row, item in enumerate(logits):
                if item is not None:
                    array[row, 0, : item.shape[0]] = item.numpy()
            outputs.append(pb_utils.Tensor("generation_logits", array))
        return pb_utils.InferenceResponse(output_tensors=outputs)
