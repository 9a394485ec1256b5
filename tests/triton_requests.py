"""Requests to a served release with no specbuild code between the test and the server (tritonclient's gRPC
stream, urllib for HTTP and the metrics endpoint), and reading what comes back."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from collections import Counter
from typing import Any, Iterable

import numpy as np

from specbuild.package.contract import ENSEMBLE_MODEL, ORCHESTRATOR_MODEL
from specbuild.serve.client import grpc_inputs
from specbuild.serve.server import TritonServer


def infer_stream(url: str, inputs: dict[str, np.ndarray], model: str = ENSEMBLE_MODEL,
                 outputs: Iterable[str] = ()) -> list[Any]:
    """One request on a gRPC stream, as tritonclient users write it; its responses, or the server's error."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tensors = grpc_inputs(inputs)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(o) for o in outputs] or None)
    client.stop_stream()  # waits until the server has closed the stream: every response is queued
    client.close()
    responses = []
    while not results.empty():
        result, error = results.get()
        if error is not None:
            raise error if isinstance(error, InferenceServerException) else InferenceServerException(str(error))
        responses.append(result)
    return responses


def texts_of(responses: list[Any]) -> list[str]:
    """Each batch row's text, the chunks of its responses joined (every response is about the row its
    batch_index names, and holds text_output 1-D as NVIDIA's clients read it: text_output[0])."""
    rows: dict[int, list[bytes]] = {}
    for response in responses:
        data = response.as_numpy("text_output")
        if data is None:
            continue
        assert data.ndim == 1 and isinstance(data[0], bytes)
        index = response.as_numpy("batch_index")  # absent when not asked for: row 0, as NVIDIA's client reads it
        rows.setdefault(0 if index is None else int(index[0][0]), []).append(data[0])
    return [b"".join(rows[row]).decode("utf-8") for row in sorted(rows)]


def text_array(*items: str | bytes) -> np.ndarray:
    return np.array([[item.encode() if isinstance(item, str) else item] for item in items], dtype=object)


def scalars(value: Any, dtype: Any, rows: int = 1) -> np.ndarray:
    return np.array([[value]] * rows, dtype=dtype)


def metrics(server: TritonServer, model: str = ORCHESTRATOR_MODEL) -> dict[str, float]:
    """The ``specbuild_*`` series of ``model`` (the orchestrator's counters), by name (per-position ones summed;
    per-source ones as ``name[source]``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    totals: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("specbuild_") and sample.labels.get("model") == model:
                source = sample.labels.get("source")
                totals[sample.name if source is None else f"{sample.name}[{source}]"] += sample.value
    return dict(totals)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def raw_stream(server: TritonServer, model: str, arrays: dict[str, np.ndarray], *, chunks: int | None = None,
               timeout: float = 120, outputs: tuple[str, ...] = ()) -> tuple[list[Any], str | None]:
    """Send ``arrays`` as they are (no client-side checks) over a gRPC stream, asking for ``outputs`` (default:
    all).

    Returns the responses and the error message, if any. With ``chunks``, stops (cancelling the request)
    after that many responses.
    """
    import tritonclient.grpc as grpcclient

    inputs = grpc_inputs(arrays)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list[Any] = []
    error = None
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True,
                                  outputs=[grpcclient.InferRequestedOutput(name) for name in outputs] or None)
        while chunks is None or len(results) < chunks:
            result, failure = responses.get(timeout=timeout)
            if failure is not None:
                error = failure.message()
                break
            results.append(result)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return results, error


def http_post(server: TritonServer, path: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(f"{server.http_url}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


def http_answer(server: TritonServer, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """The status and body of a POST, errors included."""
    try:
        return 200, http_post(server, path, body).decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
