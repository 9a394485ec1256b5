"""Triton model ``preprocessing``: text -> token ids, stop/bad word lists, end id
(:class:`specbuild.triton_models.preprocessor.Preprocessor`, which the OpenAI-compatible front end uses too).

Parameters: :class:`specbuild.package.contract.PreprocessingParameters`. The tokenizer files are shipped in
this model's version folder under ``tokenizer/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from typing import Any  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.contract import ENSEMBLE_INPUTS, PREPROCESSING_INPUTS, PreprocessingParameters  # noqa: E402
from specbuild.triton_models.preprocessor import Preprocessor  # noqa: E402
from specbuild.triton_models.request_parameters import refuse_parameters  # noqa: E402
from specbuild.triton_models.model_io import (  # noqa: E402
    error_response,
    model_dir,
    model_parameters,
    request_arrays,
    response,
)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args) / "tokenizer"), trust_remote_code=False)
        self.preprocessor = Preprocessor(tokenizer, PreprocessingParameters.from_parameters(model_parameters(args)))
        self.preprocessor.warm_up()  # before Triton reports the model ready

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:  # the ensemble's first model: the only one that sees a request's parameters first
                refuse_parameters(request.parameters(), (tensor.name for tensor in ENSEMBLE_INPUTS))
                responses.append(response(self.preprocessor.tensors(request_arrays(request, PREPROCESSING_INPUTS))))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(f"preprocessing: {exc}"))
        return responses
