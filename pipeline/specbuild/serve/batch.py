"""Per-row access to the tensors of a batched Triton request (pure numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np


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
