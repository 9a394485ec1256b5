"""`reports_errors`: a stop signal decides the exit code, even where Python swallowed the exception it raised."""

from __future__ import annotations

import signal

import click
import pytest
from click.testing import CliRunner

from specbuild.cli.common import json_option, reports_errors
from specbuild.errors import ServerError, Terminated

# the swallowed raise is the point of these tests
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class _SignalInFinalizer:
    """Raises Terminated from ``__del__``, as the stop-signal handler does when the signal lands in a finalizer:
    Python prints "Exception ignored in" and goes on."""

    def __del__(self) -> None:
        raise Terminated(signal.SIGTERM)


def _command(after_signal: str) -> click.Command:
    @click.command()
    @json_option
    @reports_errors
    def command(json_mode: bool) -> None:
        _SignalInFinalizer()  # collected at once: the raise is swallowed
        if after_signal == "server error":  # the command went on and found its server stopped
            raise ServerError("the server is not ready", fix="look at its log")
        if after_signal == "exit 1":
            raise SystemExit(1)
        if after_signal == "other error":
            raise RuntimeError("connection refused")

    return command


@pytest.mark.parametrize("after_signal", ["server error", "exit 1", "other error", "returned"])
def test_a_swallowed_stop_signal_still_exits_128_plus_the_signal(after_signal: str) -> None:
    result = CliRunner().invoke(_command(after_signal), ["--json"])
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    assert '"interrupted by SIGTERM; the servers it started were stopped first"' in result.output


def test_the_record_is_per_invocation() -> None:
    """One invocation's signal does not turn the next one's error (tests share a process) into an interrupt."""
    CliRunner().invoke(_command("returned"), [])

    @click.command()
    @json_option
    @reports_errors
    def failing(json_mode: bool) -> None:
        raise ServerError("the server is not ready", fix="look at its log")

    result = CliRunner().invoke(failing, ["--json"])
    assert result.exit_code == ServerError.exit_code and "interrupted" not in result.output
