"""A small release compiled with the torch runtime and served by a real Triton server, for the reliability
tests (faults, bad input, safety, soak).

The pair is the ``checkpoints`` fixture's target and draft (random weights, one trained tokenizer): text is
meaningless, but every path (tokenizer, ensemble, BLS, both engines, KV-cache reuse, metrics) is real. The
server runs with explicit model control so tests can unload and reload models.
"""

from __future__ import annotations

import queue
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoint_factory import Checkpoints, checkpoints  # noqa: F401  (the fixture, re-exported)

from specbuild import compiler
from specbuild.compiler import CompileResult
from specbuild.serve.client import grpc_inputs
from specbuild.serve.server import TritonServer
from specbuild.spec import load_spec

MAX_INPUT_LEN = 64
MAX_SEQ_LEN = 192
MAX_DRAFT_LEN = 4


def compile_release(checkpoints: Checkpoints, root: Path, **overrides: Any) -> CompileResult:  # noqa: F811
    """Compile the tiny pair into ``root/{build,engines,triton_repo}``; ``overrides`` are dotted spec keys."""
    spec = load_spec(None, {
        "name": "tiny", "runtime": "torch",
        "target.checkpoint": str(checkpoints.target), "draft.checkpoint": str(checkpoints.draft),
        "speculation.max_draft_len": MAX_DRAFT_LEN, "speculation.num_draft_tokens": 3,
        "limits.max_batch_size": 4, "limits.max_input_len": MAX_INPUT_LEN, "limits.max_seq_len": MAX_SEQ_LEN,
        "outputs.build_dir": str(root / "build"), "outputs.engines_dir": str(root / "engines"),
        "outputs.repository_dir": str(root / "triton_repo"), **overrides,
    })
    return compiler.run(spec, json_mode=True)


_RELEASES: dict[Path, Path] = {}


@pytest.fixture(scope="session")
def tiny_repository(checkpoints: Checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The compiled repository, built once per session even when several modules import the fixture."""
    base = tmp_path_factory.getbasetemp()
    if base not in _RELEASES:
        _RELEASES[base] = compile_release(checkpoints, base / "tiny_release").repository
    return _RELEASES[base]


@pytest.fixture(scope="module")
def served(tiny_repository: Path) -> Any:
    """A server on ``tiny_repository`` with every model loaded and explicit model control."""
    with TritonServer(tiny_repository, model_control="explicit", extra_args=["--load-model=*"],
                      startup_timeout=300) as server:
        yield server


def counters(server: TritonServer) -> dict[str, float]:
    """The orchestrator's ``specbuild_*`` counters (per-position ones left out)."""
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("specbuild_") and "position=" not in line}


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
