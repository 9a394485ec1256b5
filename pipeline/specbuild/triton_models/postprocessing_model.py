"""Triton model ``postprocessing``: token ids -> text, incrementally (see :func:`specbuild.triton_models.text.incremental_text`).

The tokenizer files are shipped in this model's version folder under ``tokenizer/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from specbuild.package.contract import POSTPROCESSING_INPUTS  # noqa: E402
from specbuild.triton_models.batch import row_value  # noqa: E402
from specbuild.triton_models.text import incremental_text  # noqa: E402
from specbuild.triton_models.model_io import error_response, model_dir, request_arrays, response  # noqa: E402


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args) / "tokenizer"), trust_remote_code=False)
        # A tokenizer's first decode builds its caches: done before Triton reports the model ready.
        incremental_text(self.tokenizer, self.tokenizer.encode("Hello, world"), 1, True)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                arrays = request_arrays(request, POSTPROCESSING_INPUTS)
                ids, lengths, skips, finals = (arrays[name] for name in ("output_ids", "output_length", "skip_tokens",
                                                                         "is_final"))
                texts = []
                for row in range(ids.shape[0]):
                    tokens = ids[row].reshape(-1)[: int(row_value(lengths, row))].tolist()
                    text = incremental_text(self.tokenizer, tokens, int(row_value(skips, row)),
                                            bool(row_value(finals, row)))
                    texts.append(text.encode("utf-8"))
                # 1-D, as NVIDIA's postprocessing answers: its clients read text_output[0] as bytes
                responses.append(response({"text_output": np.array(texts, dtype=np.object_)}))
            except ValueError as exc:
                responses.append(error_response(f"postprocessing: {exc}"))
        return responses
