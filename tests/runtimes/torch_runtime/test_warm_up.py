"""Warm models before ready: each model of a torch release takes a first request's paths while it loads (the
engines a prefill, decoding, sampling and a verification; the tokenizers an encode and a decode), so the first
request after the server reports ready costs about what later ones do.

Measured as the time to first token of the first request after the models load, as a ratio to the median of the
next three (other prompts of the same length, so the prefix cache cannot help them), over three reloads of every
model; the median ratio is reported, on the tiny release and on the demo pair's. Timing on 2 shared, busy cores is
noisy: on the demo release single ratios ranged 1.0-2.6 with the warm-up and 1.25-3.0 without it, medians
1.09-1.92 against 1.34-2.18 (2026-12-01); quiet, the engines' first forward cost 15-20 ms more than later ones
without it (89 against about 70 ms to the first token). So the test asserts only a generous bound on the median:
it catches a model that does its heavy work on the first request (loading or compiling then, many times slower),
not the fraction of a request the warm-up removes. What it cannot remove: the orchestrator's first BLS call to
each engine and the ensemble's first pass (a few ms; BLS is not available in ``initialize``, python_backend
README, r24.10).
"""

from __future__ import annotations

import queue
import statistics
import time
from typing import Any

import numpy as np
import pytest

from specbuild.package.contract import ENSEMBLE_MODEL, MODEL_NAMES
from specbuild.serve.server import TritonServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Prompts of about the same length, none a prefix of another (the prefix cache would make a later one cheaper).
PROMPTS = ("def parse(text):\n    ", "class Queue:\n    def put(", "import os\nimport sys\n\n", "for item in values:\n")
RELOADS = 3
MEDIAN_BOUND = 5.0


def _inputs(prompt: str) -> list[Any]:
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value, dtype in (("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
                               ("max_tokens", np.array([[8]], dtype=np.int32), "INT32"),
                               ("stream", np.array([[True]]), "BOOL")):
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def first_token_seconds(client: Any, answers: queue.Queue, prompt: str) -> float:
    """Send ``prompt`` on the open stream; the seconds until its first text arrives (the rest is read too)."""
    sent = time.perf_counter()
    client.async_stream_infer(ENSEMBLE_MODEL, _inputs(prompt), enable_empty_final_response=True)
    first = None
    while True:
        result, error, at = answers.get(timeout=300)
        assert error is None, error
        if first is None and result.as_numpy("text_output") is not None:
            first = at - sent
        if result.get_response().parameters["triton_final_response"].bool_param:
            return first


@pytest.fixture(scope="module", params=["tiny", "demo"])
def release(request: pytest.FixtureRequest) -> Any:
    """The tiny release, and the demo pair's (compiled once per machine into the cache folder; skipped without
    the demo's wheel), whose models are large enough for a cold start to show."""
    if request.param == "tiny":
        return request.getfixturevalue("tiny_release")
    from conftest import CACHE_DIR
    from specbuild import compiler
    from specbuild.spec import load_spec

    pair = request.getfixturevalue("demo_pair")
    spec = load_spec(None, {"name": "demo", "runtime": "torch", "target.checkpoint": str(pair.target_dir),
                            "draft.checkpoint": str(pair.draft_dir), "outputs.build_dir": "build",
                            "outputs.engines_dir": "release/engines", "outputs.repository_dir": "release/triton_repo"},
                     base_dir=CACHE_DIR / "demo-release")
    return compiler.run(spec, json_mode=True)


def test_the_first_request_after_loading_costs_what_later_ones_do(release, record_property) -> None:
    import tritonclient.grpc as grpcclient

    models = (*MODEL_NAMES[1:], ENSEMBLE_MODEL)  # the ensemble last: it needs the others
    ratios = []
    # The session's server serves this release too; its stubs' bytecode would fail the manifest check.
    with TritonServer(release.repository, model_control="explicit", verify=False, startup_timeout=300) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error, time.perf_counter())))
        try:
            for _ in range(RELOADS):
                for model in models:
                    server.load_model(model)
                assert all(server.model_ready(model) for model in models)
                first, *later = (first_token_seconds(client, answers, prompt) for prompt in PROMPTS)
                ratios.append(first / statistics.median(later))
                for model in reversed(models):
                    server.unload_model(model)
        finally:
            client.stop_stream()
    median = statistics.median(ratios)
    record_property("first_to_second_ttft_ratio", round(median, 2))
    print(f"the first request's time to first token after loading, over the later ones': "
          f"{', '.join(f'{ratio:.2f}' for ratio in ratios)} (median {median:.2f})")
    assert median < MEDIAN_BOUND, ratios
