"""Helpers for the Triton python models: their parameters, folders, input tensors and responses."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from specbuild.package.contract import Tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL  # the flag of a decoupled request's last response


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """The ``parameters`` of a model's config as a plain ``{key: string_value}`` dict (an empty value may come
    without its ``string_value``: the protobuf JSON form leaves out default values)."""
    config = json.loads(args["model_config"])
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def model_dir(args: dict[str, Any]) -> Path:
    """The model's version folder (``<repository>/<model>/<version>``), where its files are shipped; resolved
    first, so a repository path given with ``..`` in it still finds them."""
    return Path(args["model_repository"]).resolve() / str(args["model_version"])


def request_arrays(request: Any, tensors: Iterable[Tensor]) -> dict[str, np.ndarray | None]:
    """The request's inputs among ``tensors`` (the model's contract) as numpy arrays; None where not sent."""
    arrays = {}
    for item in tensors:
        tensor = pb_utils.get_input_tensor_by_name(request, item.name)
        arrays[item.name] = None if tensor is None else tensor.as_numpy()
    return arrays


def response(arrays: dict[str, np.ndarray]) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, value) for name, value in arrays.items()])


def error_response(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def send_error(sender: Any, message: str) -> None:
    """End a decoupled request with an error response."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)


def send_cancelled(sender: Any) -> None:
    """End a decoupled request whose client went away (Triton's CANCELLED status)."""
    cancelled = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
    sender.send(pb_utils.InferenceResponse(error=cancelled), flags=FINAL)
