"""Triton model ``preprocessing``: text -> token ids, stop/bad word lists, end id.

Parameters: :class:`specbuild.package.contract.PreprocessingParameters`. The tokenizer files are shipped in
this model's version folder under ``tokenizer/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.contract import PREPROCESSING_INPUTS, PreprocessingParameters  # noqa: E402
from specbuild.serve.batch import row_value  # noqa: E402
from specbuild.serve.text import decode_utf8, encode_word_list, pad_rows  # noqa: E402
from specbuild.serve.triton_models.common import (  # noqa: E402
    error_response,
    model_dir,
    model_parameters,
    request_arrays,
    response,
)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        self.parameters = PreprocessingParameters.from_parameters(model_parameters(args))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args) / "tokenizer"), trust_remote_code=False)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(response(self._preprocess(request_arrays(request, PREPROCESSING_INPUTS))))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(f"preprocessing: {exc}"))
        return responses

    def _words(self, raw: np.ndarray | None, name: str, rows: int) -> list[np.ndarray]:
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

    def _preprocess(self, arrays: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        texts = arrays["text_input"]
        if texts is None:
            raise RequestError("missing input 'text_input'")
        rows = texts.shape[0]
        max_input_len = self.parameters.max_input_len
        ids = []
        for row in range(rows):
            text = decode_utf8(np.asarray(texts[row]).reshape(-1)[0], "text_input")
            if not text.strip():
                raise RequestError("text_input is empty", "send a non-empty prompt")
            encoded = self.tokenizer.encode(text)
            if len(encoded) > max_input_len:
                raise RequestError(
                    f"prompt has {len(encoded)} tokens, more than max_input_len ({max_input_len})",
                    "shorten the prompt or rebuild with a larger limits.max_input_len",
                )
            ids.append(encoded)
        end_id = self.parameters.end_id
        outputs = {
            "input_ids": pad_rows(ids, end_id),
            "input_length": np.array([[len(row)] for row in ids], dtype=np.int32),
            "end_id": np.array([[row_value(arrays["end_id"], r, end_id)] for r in range(rows)], dtype=np.int32),
        }
        for name, output in (("stop_words", "stop_words_ids"), ("bad_words", "bad_words_ids")):
            lists = self._words(arrays[name], name, rows)
            width = max(item.shape[1] for item in lists)
            stacked = np.stack([np.pad(item, ((0, 0), (0, width - item.shape[1])), constant_values=-1)
                                for item in lists]).astype(np.int32)
            stacked[:, 0, :][stacked[:, 0, :] < 0] = 0
            outputs[output] = stacked
        return outputs
