"""Capture through a real Triton server, on the factory pair compiled with capture on: every finished request that
did not opt out is one record holding what was served (the orchestrator called with token ids, streamed and not;
the ensemble over HTTP; the gRPC client; the OpenAI-compatible API; ``specbuild generate``), the opted-out ones
none; a capturing release without a store does not load; and a killed orchestrator stub leaves every answered
request's record whole (``kill -9`` mid-traffic)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from triton_requests import delta, http_post, metrics, raw_stream

from specbuild.capture.records import read_records
from specbuild.capture.store import CAPTURE_DIR_ENV
from specbuild.errors import ServerError
from specbuild.package.contract import ORCHESTRATOR_MODEL
from specbuild.serve.orchestrator_client import orchestrator_arrays, release_requests
from specbuild.serve.server import TritonServer

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PROMPT = "def main():\n    return"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def capturing(capturing_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The capturing release served, and its store."""
    store = tmp_path_factory.mktemp("capture") / "store"
    with TritonServer(capturing_repository, startup_timeout=300, capture_dir=store) as server:
        yield server, store


def served_ids(responses: list[Any]) -> list[int]:
    """A row's whole answer from the orchestrator's responses (each holds every token so far, the last the whole)."""
    last = [response for response in responses if response.as_numpy("output_ids") is not None][-1]
    return last.as_numpy("output_ids").reshape(-1)[: int(last.as_numpy("output_length").reshape(-1)[0])].tolist()


def by_ids(server: TritonServer, repository: Path, prompt_ids: list[int], *, stream: bool,
           **settings: Any) -> list[int]:
    preprocessor, parameters = release_requests(repository)
    arrays = orchestrator_arrays(preprocessor, parameters, prompt_ids, MAX_TOKENS, stream=stream, **settings)
    responses, error = raw_stream(server, ORCHESTRATOR_MODEL, arrays)
    assert error is None, error
    return served_ids(responses)


def test_every_request_not_opted_out_is_one_record_of_what_was_served(capturing, capturing_repository) -> None:
    from specbuild.cli import main
    from specbuild.serve.client import SpecbuildClient
    from specbuild.serve.frontend import OpenAIFrontend

    server, store = capturing
    tokenizer = release_requests(capturing_repository)[0].tokenizer
    before = metrics(server)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    expected: list[tuple[str, Any]] = []  # (surface, what the record must hold), in the order they were served
    for stream in (False, True):
        expected.append(("ids", (prompt_ids, by_ids(server, capturing_repository, prompt_ids, stream=stream))))
        by_ids(server, capturing_repository, prompt_ids, stream=stream, store=False)
    body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "exclude_input_in_output": True}
    text = json.loads(http_post(server, "/v2/models/ensemble/generate", body))["text_output"]
    expected.append(("text", text))
    http_post(server, "/v2/models/ensemble/generate", {**body, "store": False})
    client = SpecbuildClient(server.grpc_url)
    expected.append(("text", client.generate(PROMPT, MAX_TOKENS, stream=True).text))
    client.generate(PROMPT, MAX_TOKENS, stream=True, store=False)
    with OpenAIFrontend(capturing_repository, server.grpc_url, "tiny", port=0) as frontend:
        for extra in ({}, {"store": False}):
            request = urllib.request.Request(f"{frontend.url}/completions", json.dumps(
                {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}).encode(),
                {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as response:
                answer = json.loads(response.read())["choices"][0]["text"]
            if not extra:
                expected.append(("text", answer))
    for option in ("--store", "--no-store"):
        result = CliRunner().invoke(main, ["generate", PROMPT, "--url", server.grpc_url, "--raw", "--no-stream",
                                           "--json", f"--max-tokens={MAX_TOKENS}", option])
        assert result.exit_code == 0, result.output
        if option == "--store":
            expected.append(("text", json.loads(result.stdout)["text"]))

    records = list(read_records([store]))
    assert len(records) == len(expected)  # one per request not opted out, none for the others
    for record, (kind, served) in zip(records, expected):
        if kind == "ids":
            assert (list(record.prompt_ids), list(record.output_ids)) == served
        else:
            assert tokenizer.decode(list(record.output_ids)) == served
        assert record.greedy and record.finish_reason == "length" and len(record.output_ids) == MAX_TOKENS
        assert sum(drafted for drafted, _ in record.rounds) > 0
    after = metrics(server)
    assert delta(before, after, "specbuild_capture_records_total") == len(records)
    assert delta(before, after, "specbuild_capture_bytes_total") == sum(path.stat().st_size
                                                                         for path in store.glob("*.jsonl"))
    assert delta(before, after, "specbuild_capture_dropped_records_total") == 0
    assert delta(before, after, "specbuild_capture_seconds_count") == len(records)


def test_the_log_says_where_it_captures_never_what(capturing) -> None:
    server, store = capturing
    log = server.read_log()
    assert f"capturing finished requests (token ids) to {store}" in log
    assert PROMPT not in log


def test_a_capturing_release_without_a_store_does_not_load(capturing_repository, monkeypatch) -> None:
    monkeypatch.delenv(CAPTURE_DIR_ENV, raising=False)
    with pytest.raises(ServerError) as error:
        with TritonServer(capturing_repository, startup_timeout=300):
            pass
    assert CAPTURE_DIR_ENV in str(error.value)


def test_a_killed_orchestrator_leaves_every_answered_request_captured_whole(capturing_repository,
                                                                            tmp_path: Path) -> None:
    """Requests one after another until the orchestrator's stub is killed: every answered one has its record,
    whole and in order; at most the one in flight has a record without an answer."""
    store = tmp_path / "store"
    answered: list[tuple[list[int], list[int]]] = []
    with TritonServer(capturing_repository, startup_timeout=300, capture_dir=store) as server:
        preprocessor, parameters = release_requests(capturing_repository)
        stub = server.processes()["orchestrator_0_0"]
        stop = threading.Event()

        def traffic() -> None:
            index = 0
            while not stop.is_set():
                prompt = [5 + index % 50, 9, 11 + index % 7]
                arrays = orchestrator_arrays(preprocessor, parameters, prompt, MAX_TOKENS, stream=index % 2 == 1)
                try:
                    responses, error = raw_stream(server, ORCHESTRATOR_MODEL, arrays, timeout=30)
                except Exception:  # noqa: BLE001 - the stub is gone: no answer will come
                    return
                if error is not None or not responses:
                    return
                answered.append((prompt, served_ids(responses)))
                index += 1

        thread = threading.Thread(target=traffic)
        thread.start()
        deadline = time.monotonic() + 120
        while len(answered) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(stub, signal.SIGKILL)
        thread.join(90)
        stop.set()
        assert not thread.is_alive()
    records = list(read_records([store]))  # a torn line anywhere but at a file's end is an error here
    assert len(answered) >= 6
    assert [(list(item.prompt_ids), list(item.output_ids)) for item in records[:len(answered)]] == answered
    assert len(answered) <= len(records) <= len(answered) + 1


def test_bench_measures_a_capturing_release_through_a_temporary_store_it_deletes(capturing_repository, tmp_path,
                                                                                 monkeypatch) -> None:
    """The release in service captures; ``bench --incumbent`` (and tune) start it: the capture path runs, into a
    store of the bench's own that is gone when the server stops (the nightly job failed to start it before)."""
    import tempfile

    from specbuild.bench.sweep import bench_server
    from specbuild.serve.client import SpecbuildClient

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with bench_server(None, capturing_repository) as (grpc_url, _):
        [store] = tmp_path.glob("specbuild-bench-capture-*")
        SpecbuildClient(grpc_url).generate(PROMPT, MAX_TOKENS)
        assert len(list(read_records([store]))) == 1
    assert not store.exists()
