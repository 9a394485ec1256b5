"""A toy decoupled model behind the toy ensemble: echoes the prompt back word by word.

Test fixture for the server/client layer only (it mimics the ensemble's tensor contract, not its
behaviour). A prompt starting with ``gate:<path>`` makes it wait, after the first chunk, until <path>
exists (an error after 20 s), so a test can prove that chunks arrive before the request ends without
timing anything.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._answer(request, sender)
            except Exception as exc:  # report to the client, keep serving
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
        return None

    def _answer(self, request, sender):
        text = _scalar(request, "text_input", b"").decode("utf-8")
        max_tokens = int(_scalar(request, "max_tokens", 16))
        stream = bool(_scalar(request, "stream", False))
        k = int(_scalar(request, "num_draft_tokens", 2))
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        words = text.split(" ")
        gate = words.pop(0)[len("gate:"):] if words[0].startswith("gate:") else None
        words = words[:max_tokens]
        pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
        if stream:
            for count, piece in enumerate(pieces, start=1):
                sender.send(self._response(piece, count, k))
                if gate and count == 1:
                    deadline = time.monotonic() + 20
                    while not os.path.exists(gate):
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the gate {gate} was not opened within 20 s")
                        time.sleep(0.01)
        else:
            sender.send(self._response("".join(pieces), len(pieces), k))
        sender.send(flags=FINAL)

    @staticmethod
    def _response(text, count, k):
        drafted, accepted = k * count, (k * count) // 2
        now = time.time_ns()
        int32 = {"batch_index": 0, "total_accepted_draft_tokens": accepted, "total_draft_tokens": drafted,
                 "num_input_tokens": 1, "num_output_tokens": 1, "output_token_count": count}
        outputs = {
            "text_output": np.array([text.encode("utf-8")], dtype=object),  # 1-D, as NVIDIA's postprocessing
            "acceptance_rate": np.array([[accepted / drafted if drafted else 0.0]], dtype=np.float32),
            **{name: np.array([[value]], dtype=np.int32) for name, value in int32.items()},
            **{name: np.array([[now]], dtype=np.int64) for name in ("arrival_time_ns", "first_scheduled_time_ns",
                                                                     "first_token_time_ns", "last_token_time_ns")},
        }
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])
