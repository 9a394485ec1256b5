"""Triton model ``postprocessing``: token ids -> text, incrementally (see :func:`specbuild.serve.text.incremental_text`).

The tokenizer files are shipped in this model's version folder under ``tokenizer/``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from specbuild.serve.text import incremental_text
from specbuild.serve.triton_models.common import error_response, model_dir, required_input, row_scalar, tensor


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args) / "tokenizer"), trust_remote_code=False)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                ids = required_input(request, "output_ids")
                lengths = required_input(request, "output_length")
                skips = required_input(request, "skip_tokens")
                finals = required_input(request, "is_final")
                texts = []
                for row in range(ids.shape[0]):
                    tokens = ids[row].reshape(-1)[: int(row_scalar(lengths, row))].tolist()
                    text = incremental_text(self.tokenizer, tokens, int(row_scalar(skips, row)),
                                            bool(row_scalar(finals, row)))
                    texts.append([text.encode("utf-8")])
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[tensor("text_output", np.array(texts, dtype=np.object_))]))
            except ValueError as exc:
                responses.append(error_response(f"postprocessing: {exc}"))
        return responses
