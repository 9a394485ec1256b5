"""Reading a server's metrics endpoint (specbuild.bench.sweep.read_metrics, which the bench and the served tests
share): a read that fails is tried again, and one that keeps failing is an error naming the URL and the cause, never
a None for the caller to trip over. Against a real HTTP server on the loopback that answers badly at first."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specbuild.bench.sweep import METRICS_ATTEMPTS, optional_metrics, read_counters, read_metrics
from specbuild.errors import MetricsUnreadable, ServerError

BODY = (b'# TYPE specbuild_spec_decode_rounds_total counter\n'
        b'specbuild_spec_decode_rounds_total{model="orchestrator"} 7\n'
        b'# TYPE specbuild_requests_total counter\nspecbuild_requests_total{model="orchestrator"} 2\n')


class Endpoint(ThreadingHTTPServer):
    """A metrics endpoint whose first ``failures`` answers fail as ``how`` says: ``"slow"`` (past the client's
    timeout), ``"503"`` (an HTTP error) or ``"cut"`` (a body cut short of its declared length)."""

    daemon_threads = True

    def __init__(self, failures: int, how: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.failures, self.how, self.requests = failures, how, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that timed out has hung up: expected
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    server: Endpoint

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.requests += 1
        failing = self.server.requests <= self.server.failures
        if failing and self.server.how == "slow":
            time.sleep(1.0)
        if failing and self.server.how == "503":
            self.send_error(503, "Service Unavailable")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(BODY) + (100 if failing and self.server.how == "cut" else 0)))
        self.end_headers()
        self.wfile.write(BODY)
        if failing and self.server.how == "cut":
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("specbuild.bench.sweep.METRICS_RETRY_PAUSE_S", 0.05)


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    server = Endpoint(*request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("endpoint", [(METRICS_ATTEMPTS - 1, how) for how in ("slow", "503", "cut")],
                         indirect=True, ids=["timed-out", "http-error", "cut-short"])
def test_a_failed_read_is_tried_again(endpoint: Endpoint):
    counters, _ = read_metrics(endpoint.url, timeout=0.3)
    assert (counters.rounds, counters.requests) == (7, 2)
    assert endpoint.requests == METRICS_ATTEMPTS


@pytest.mark.parametrize("endpoint, cause", [((METRICS_ATTEMPTS, "slow"), "timed out"),
                                             ((METRICS_ATTEMPTS, "503"), "HTTP Error 503")],
                         indirect=["endpoint"], ids=["timed-out", "http-error"])
def test_a_read_that_keeps_failing_is_an_error_naming_the_url_and_the_cause(endpoint: Endpoint, cause: str):
    with pytest.raises(MetricsUnreadable) as caught:
        read_metrics(endpoint.url, timeout=0.3)
    assert isinstance(caught.value, ServerError) and caught.value.fix
    assert endpoint.url in caught.value.message and cause in caught.value.message
    assert f"{METRICS_ATTEMPTS} tries" in caught.value.message and endpoint.requests == METRICS_ATTEMPTS


def test_the_counters_alone_raise_too_and_the_bench_s_optional_read_says_none():
    with socket.socket() as bound:  # a port held but not listening: every connection is refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/metrics"
        with pytest.raises(MetricsUnreadable, match=rf"{url} did not answer .*refused"):
            read_counters(url)
        assert optional_metrics(url) is None and optional_metrics(None) is None
