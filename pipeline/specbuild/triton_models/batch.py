"""Per-row access to the tensors of a batched Triton request (pure numpy)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from specbuild.errors import RequestError

# Inputs tensorrtllm_backend renamed in May 2025 (PR #749): current name -> the name before.
RENAMED = {"seed": "random_seed", "min_tokens": "min_length"}


def row_value(array: np.ndarray | None, row: int, default: Any = None) -> Any:
    """Element ``row`` of a per-request scalar, or ``default`` when the input was not sent.

    Takes ``[batch, 1]`` as clients send it and ``[batch]`` as Triton hands it on under ``reshape: {shape: []}``;
    a single row is broadcast to every row (clients often send sampling settings once).
    """
    if array is None or array.size == 0:
        return default
    flat = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(-1, 1)
    value = flat[row if flat.shape[0] > 1 else 0, 0]
    return value.item() if hasattr(value, "item") else value


def renamed_value(get: Callable[[str], Any], current: str) -> Any:
    """An input sent under its current name or the one before the rename (:data:`RENAMED`), read with ``get``;
    both sent must agree (:class:`RequestError` naming them)."""
    value, older = get(current), get(RENAMED[current])
    if value is not None and older is not None and value != older:
        raise RequestError(f"{current}={value} and {RENAMED[current]}={older} disagree (the same input under its "
                           "current and former name)", f"send only {current}")
    return older if value is None else value


def finite(name: str, value: Any, *, positive: bool = False) -> float | None:
    """``value`` as a float, refused (naming ``name``) unless finite (and above 0 with ``positive``)."""
    if value is None:
        return None
    if not math.isfinite(float(value)) or (positive and float(value) <= 0):
        raise RequestError(f"{name} must be a finite number{' above 0' if positive else ''}, got {value}")
    return float(value)
