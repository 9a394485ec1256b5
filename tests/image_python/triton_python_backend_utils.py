"""A stand-in for the python backend's ``triton_python_backend_utils``, written for specbuild's tests: just
enough of its interface (tensors, responses, errors, logger, metrics) to import a repository's python models,
initialize them and run ``execute`` on requests built in the test, outside Triton."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    CANCELLED = "CANCELLED"

    def __init__(self, message: str, code: Any = None) -> None:
        self._message, self.code = message, code

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._tensors, self._error = list(output_tensors or []), error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class Request:
    """What ``execute`` receives: named input tensors, and the request's parameters as the backend hands them over
    (``InferenceRequest.parameters()``: one JSON object as a string; python_backend ``src/infer_request.cc``)."""

    def __init__(self, inputs: dict[str, np.ndarray], parameters: dict[str, object] | None = None) -> None:
        self._inputs = {name: Tensor(name, array) for name, array in inputs.items()}
        self._parameters = json.dumps(parameters or {})

    def inputs(self) -> list[Tensor]:
        return list(self._inputs.values())

    def parameters(self) -> str:
        return self._parameters


def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
    return request._inputs.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((tensor for tensor in response.output_tensors() if tensor.name() == name), None)


class Logger:
    lines: list[str] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(message)

    log_warn = log_error = log_verbose = log_info


class _Metric:
    def __init__(self, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels, self.value, self.buckets, self.observations = labels, 0.0, buckets, []

    def increment(self, value: float) -> None:
        self.value += value

    def set(self, value: float) -> None:
        self.value = value

    def observe(self, value: float) -> None:
        if self.buckets is None:
            raise TypeError("observe on a metric that is not a histogram")
        self.observations.append(value)


class MetricFamily:
    """As python_backend's (src/metric_family.cc, r24.08 to r26.04): a histogram's metrics need their buckets, as a
    list; the other kinds' refuse them."""

    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> _Metric:  # noqa: N802
        if buckets is not None and not isinstance(buckets, list):
            raise TypeError(f"{self.name}: the buckets are not a list")
        if (buckets is None) == (self.kind == self.HISTOGRAM):
            raise ValueError(f"{self.name}: a {self.kind} metric " + ("needs buckets" if buckets is None
                                                                      else "takes no buckets"))
        return _Metric(labels or {}, buckets)
