"""Errors that name what is wrong and how to fix it.

Every error a user can cause is a :class:`SpecbuildError`; the CLI prints its ``message`` and ``fix``
and exits with its ``exit_code``, never with a traceback.
"""

from __future__ import annotations


class SpecbuildError(Exception):
    """A problem the user can act on: ``message`` says what is wrong, ``fix`` what to do."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

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
        super().__init__(f"{stage} failed: {message}", fix)
        self.stage = stage
        self.exit_code = self.STAGE_EXIT_CODES.get(stage, 1)


class VerificationError(SpecbuildError):
    """A release does not match its manifest."""


class ServerError(SpecbuildError):
    """The Triton server could not start, load its models or answer."""


class RequestError(SpecbuildError):
    """A generation request was rejected (by the client's checks or by the server)."""
