"""The ``specbuild`` command line: thin Click wrappers that parse flags, call the API and report.

All logic lives in importable modules; every command here is a few lines that a release pipeline can
replace with a Python call. Errors the user can fix print as ``error: ... / fix: ...`` with a meaningful
exit code (README: "Exit codes"), never a traceback. Every command takes ``--json``: stdout then holds exactly
one JSON document, errors included (``{"error": ..., "fix": ..., "exit_code": ...}``), or, for the commands
that stream (``generate --stream``, ``serve``), one JSON object per line.

Commands by stage, each module registering its own on :data:`specbuild.cli.common.main`: :mod:`specbuild.cli.build` (init, check,
compile, convert, build, package), :mod:`specbuild.cli.serving` (serve, openai, generate, verify, doctor),
:mod:`specbuild.cli.deployment` (deploy, monitoring), :mod:`specbuild.cli.measure` (bench, tune, demo, demo-models,
draft), :mod:`specbuild.cli.capture` (capture show, capture purge).
"""

from specbuild.cli import build, capture, deployment, measure, serving  # each registers its commands on main
from specbuild.cli.common import main

__all__ = ["build", "capture", "deployment", "main", "measure", "serving"]
