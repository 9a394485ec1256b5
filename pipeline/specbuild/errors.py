"""Errors that name what is wrong and how to fix it.

Every error a user can cause is a :class:`SpecbuildError`; the CLI prints its ``message`` and ``fix``
and exits with its ``exit_code``, never with a traceback (under ``--json``: one JSON document on stdout, see
:meth:`SpecbuildError.to_json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class SpecbuildError(Exception):
    """A problem the user can act on: ``message`` says what is wrong, ``fix`` what to do. ``details``: the
    figures or report behind it (a failed verification's file lists, a failed gate's measurements), merged into
    the JSON error document."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.details = dict(details or {})

    def to_json(self) -> dict[str, Any]:
        """``{"error": ..., "fix": ..., "exit_code": ..., **details}``: what ``--json`` prints for this error."""
        return {**self.details, "error": self.message, "fix": self.fix, "exit_code": self.exit_code}

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message}\n  fix: {self.fix}"


class UsageError(SpecbuildError):
    """Bad flags, a bad spec file or a bad path: exit code 2, like Click's own usage errors."""

    exit_code = 2


class SpecError(UsageError):
    """The build spec (file or overrides) is invalid."""


class CheckpointError(SpecbuildError):
    """A checkpoint is missing, corrupt, unsafe to load or unsupported."""


class IncompatibleError(SpecbuildError):
    """Target and draft cannot be paired for speculative decoding."""


class StageError(SpecbuildError):
    """A compile stage failed; ``stage`` names it and sets the exit code."""

    STAGE_EXIT_CODES = {"check": 10, "convert": 11, "build": 12, "package": 13, "manifest": 14}

    def __init__(self, stage: str, message: str, fix: str | None = None) -> None:
        super().__init__(f"{stage} failed: {message}", fix, details={"stage": stage})
        self.stage = stage
        self.exit_code = self.STAGE_EXIT_CODES.get(stage, 1)


class VerificationError(SpecbuildError):
    """A release does not match its manifest."""


class ServerError(SpecbuildError):
    """The Triton server could not start, load its models or answer."""


class MetricsUnreadable(ServerError):
    """A server's metrics endpoint did not answer, however many times it was asked."""


class RequestError(SpecbuildError):
    """A generation request was rejected (by the client's checks or by the server)."""


class GateError(SpecbuildError):
    """A measured release missed a threshold of ``specbuild bench --gate`` (or a request failed that no
    tolerated error rate allows): exit code 3, so a pipeline tells a refused release from a broken run."""

    exit_code = 3


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGINT reached a process that runs Triton servers: they are stopped first, then this unwinds
    the program as Ctrl-C does (``except KeyboardInterrupt`` catches both); exit code 128 + the signal."""

    #: The stop signal this process last received, recorded as the exception is made: Python swallows an
    #: exception raised while a finalizer runs (a signal can land in one), so the CLI reads this as well.
    received: ClassVar[int | None] = None

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum
        Terminated.received = signum
