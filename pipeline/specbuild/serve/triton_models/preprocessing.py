"""Triton model ``preprocessing``: text -> token ids, stop/bad word lists, end id.

Parameters: ``max_input_len``, ``end_id`` (the tokenizer's eos).
The tokenizer files are shipped in this model's version folder under ``tokenizer/``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from specbuild.errors import RequestError
from specbuild.serve.text import decode_utf8, encode_word_list, pad_rows
from specbuild.serve.triton_models.common import (
    error_response,
    model_dir,
    model_parameters,
    optional_input,
    required_input,
    row_scalar,
    tensor,
)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        parameters = model_parameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args) / "tokenizer"), trust_remote_code=False)
        self.max_input_len = int(parameters["max_input_len"])
        self.default_end_id = int(parameters["end_id"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._preprocess(request))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(f"preprocessing: {exc}"))
        return responses

    def _words(self, request: Any, name: str, rows: int) -> list[np.ndarray]:
        raw = optional_input(request, name)
        lists = []
        for row in range(rows):
            words: list[list[int]] = []
            if raw is not None and raw.size:
                for item in np.asarray(raw[row if raw.shape[0] > 1 else 0]).reshape(-1):
                    text = decode_utf8(item, name)
                    if text:
                        words.append(self.tokenizer.encode(text, add_special_tokens=False))
            lists.append(encode_word_list(words))
        return lists

    def _preprocess(self, request: Any) -> Any:
        texts = required_input(request, "text_input")
        rows = texts.shape[0]
        ids = []
        for row in range(rows):
            text = decode_utf8(np.asarray(texts[row]).reshape(-1)[0], "text_input")
            if not text.strip():
                raise RequestError("text_input is empty", "send a non-empty prompt")
            encoded = self.tokenizer.encode(text)
            if len(encoded) > self.max_input_len:
                raise RequestError(
                    f"prompt has {len(encoded)} tokens, more than max_input_len ({self.max_input_len})",
                    "shorten the prompt or rebuild with a larger limits.max_input_len",
                )
            ids.append(encoded)
        end_ids = optional_input(request, "end_id")
        outputs = [
            tensor("input_ids", pad_rows(ids, self.default_end_id)),
            tensor("input_length", np.array([[len(row)] for row in ids], dtype=np.int32)),
            tensor("end_id", np.array([[row_scalar(end_ids, r, self.default_end_id)] for r in range(rows)],
                                      dtype=np.int32)),
        ]
        for name, output in (("stop_words", "stop_words_ids"), ("bad_words", "bad_words_ids")):
            lists = self._words(request, name, rows)
            width = max(item.shape[1] for item in lists)
            stacked = np.stack([np.pad(item, ((0, 0), (0, width - item.shape[1])), constant_values=-1)
                                for item in lists]).astype(np.int32)
            stacked[:, 0, :][stacked[:, 0, :] < 0] = 0
            outputs.append(tensor(output, stacked))
        import triton_python_backend_utils as pb_utils

        return pb_utils.InferenceResponse(output_tensors=outputs)
