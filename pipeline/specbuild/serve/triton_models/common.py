"""Helpers for the Triton python models: reading inputs, parameters and making responses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """The ``parameters`` of a model's config as a plain ``{key: string_value}`` dict."""
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def model_dir(args: dict[str, Any]) -> Path:
    """The model's version folder (``<repository>/<model>/<version>``), where its files are shipped."""
    return Path(args["model_repository"]) / str(args["model_version"])


def optional_input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def required_input(request: Any, name: str) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"missing input {name!r}")
    return tensor.as_numpy()


def row_scalar(array: np.ndarray | None, row: int, default: Any = None) -> Any:
    """Element ``row`` of a ``[batch, 1]`` input, or ``default`` when the input was not sent.

    A ``[1, 1]`` input is broadcast to every row (clients often send sampling settings once).
    """
    if array is None or array.size == 0:
        return default
    flat = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(-1, 1)
    value = flat[row if flat.shape[0] > 1 else 0, 0]
    return value.item() if hasattr(value, "item") else value


def error_response(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def tensor(name: str, value: np.ndarray) -> Any:
    return pb_utils.Tensor(name, value)
