"""Triton model ``tensorrt_llm`` of a CPU rehearsal:
:class:`specbuild.runtimes.tensorrt_llm_llmapi.stand_in.LLMAPIStandIn` under the LLM-API model's contract, in place
of TensorRT-LLM's ``model.py`` (see :mod:`specbuild.runtimes.tensorrt_llm_llmapi.rehearsal`).

It reads the release's ``model.yaml`` beside it as the real model does, by the rule table of the line named in
``stand_in.json`` (with the mounts: container path -> host folder, what ``docker run`` would mount). Requests are
decoded and answers encoded by :mod:`specbuild.runtimes.tensorrt_llm_llmapi.tensors` from the contract table; an
error answers ``text_output`` "N/A" with the error, as upstream does.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncio  # noqa: E402
import json  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml, parse  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_INPUTS, MODEL_YAML, STAND_IN_SETTINGS  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.tensors import decode_request, encode_answer  # noqa: E402
from specbuild.runtimes.tensorrt_llm_llmapi.stand_in import LLMAPIStandIn  # noqa: E402
from specbuild.triton_models.model_io import (  # noqa: E402
    FINAL,
    model_dir,
    request_arrays,
    response,
    send_cancelled,
)



class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        folder = model_dir(args)
        settings = json.loads((folder / STAND_IN_SETTINGS).read_text(encoding="utf-8"))
        config = parse(ModelYaml, (folder / MODEL_YAML).read_text(encoding="utf-8"), str(folder / MODEL_YAML),
                       LINES[settings["tensorrt_llm"]])
        decoupled = json.loads(args["model_config"]).get("model_transaction_policy", {}).get("decoupled", False)
        if decoupled != config.triton_config.decoupled:
            raise ValueError(f"config.pbtxt says decoupled={decoupled}, {MODEL_YAML} triton_config.decoupled="
                             f"{config.triton_config.decoupled}")
        self.stand_in = LLMAPIStandIn(config, settings["mounts"])

    async def execute(self, requests: list[Any]) -> None:
        await asyncio.gather(*(self._serve(request) for request in requests))
        return None

    async def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        try:
            llm_request = decode_request(request_arrays(request, LLMAPI_INPUTS))
            async for answer in self.stand_in.answers(llm_request):
                final = answer.finish_reason is not None
                sender.send(response(encode_answer(answer, llm_request)), flags=FINAL if final else 0)
                if not final and request.is_cancelled():  # (after the final response the request is gone)
                    send_cancelled(sender)
                    return
        except Exception as exc:  # noqa: BLE001 - one failed request must not take the model down
            message = str(exc) if isinstance(exc, RequestError) else repr(exc)
            sender.send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("text_output", np.array([b"N/A"], dtype=np.object_))],
                error=pb_utils.TritonError(message)), flags=FINAL)
