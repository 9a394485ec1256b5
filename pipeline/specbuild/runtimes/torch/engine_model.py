"""Triton model ``target`` / ``draft`` for the torch runtime: the ``tensorrtllm`` backend's contract served by
:class:`specbuild.runtimes.torch.engine.TorchEngine`.

Parameters are :class:`specbuild.runtimes.torch.parameters.TorchEngineParameters`: the backend's own keys, read
by the backend's rules (a config without a key the backend requires does not load here either), plus
``torch_device`` and ``torch_threads``. ``gpt_model_path`` is the engine folder: absolute, or relative to the
release folder (the repository's parent) and then confined to it. The engine's limits (``max_seq_len``,
``max_draft_len``, dtype) come from its build record (:class:`~specbuild.package.build_record.BuildRecord`), as a
TensorRT-LLM engine's come from its ``config.json``. A draft with a sub-vocabulary head loads only when the head
vocabulary in its folder is the one its build record and ``head_vocabulary_sha256`` name
(:func:`specbuild.runtimes.torch.engine_loading.load_engine`).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from specbuild.runtimes.torch.threads import spin_briefly  # noqa: E402

spin_briefly()  # before torch starts its thread pool (runtimes/torch/threads.py says why)

from typing import Any  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.backend_contract import BLOCK_VERIFICATION, ENGINE_INPUTS, GUIDE_MASKS  # noqa: E402
from specbuild.runtimes.torch.engine_loading import load_engine  # noqa: E402
from specbuild.runtimes.torch.parameters import TorchEngineParameters  # noqa: E402
from specbuild.triton_models.engine_io import decode_requests, encode_outputs  # noqa: E402
from specbuild.triton_models.model_io import (  # noqa: E402
    error_response,
    model_parameters,
    request_arrays,
    response,
)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        warnings: list[str] = []
        self.parameters = TorchEngineParameters.from_parameters(model_parameters(args), warnings)
        for warning in warnings:
            pb_utils.Logger.log_warn(warning)
        release_root = Path(args["model_repository"]).resolve().parent.parent
        loaded = load_engine(self.parameters, release_root)
        pb_utils.Logger.log_info(f"{args['model_name']}: {loaded.description}")
        self.engine, self.runner, self.guided = loaded.engine, loaded.runner, loaded.guided

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                rows = decode_requests(request_arrays(request, ENGINE_INPUTS + (GUIDE_MASKS, BLOCK_VERIFICATION)),
                                       exclude_input_default=self.parameters.exclude_input_in_output,
                                       guided_decoding=self.guided)
                outputs = [self.runner.run(row.request) for row in rows]
                responses.append(response(encode_outputs(rows, outputs, self.engine.vocab_size)))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(str(exc)))
        return responses
