"""A small release compiled with the torch runtime and served by a real Triton server, for the reliability
tests (faults, bad input, safety, soak).

The pair is the ``checkpoints`` fixture's target and draft (random weights, one trained tokenizer): text is
meaningless, but every path (tokenizer, ensemble, BLS, both engines, KV-cache reuse, metrics) is real. The
server runs with explicit model control so tests can unload and reload models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from checkpoint_factory import Checkpoints, pair_spec

from specbuild import compiler
from specbuild.compiler import CompileResult
from specbuild.serve.server import TritonServer

MAX_INPUT_LEN = 64
MAX_SEQ_LEN = 192
MAX_DRAFT_LEN = 4


def compile_release(checkpoints: Checkpoints, root: Path, **overrides: Any) -> CompileResult:
    """Compile the factory pair into ``root/{build,engines,triton_repo}``; ``overrides`` are dotted spec keys."""
    return compiler.run(pair_spec(root, checkpoints.target, checkpoints.draft, **{
        "name": "tiny", "speculation.max_draft_len": MAX_DRAFT_LEN, "speculation.num_draft_tokens": 3,
        "limits.max_batch_size": 4, "limits.max_input_len": MAX_INPUT_LEN, "limits.max_seq_len": MAX_SEQ_LEN,
        **overrides}), json_mode=True)


_RELEASES: dict[Path, Path] = {}


@pytest.fixture(scope="session")
def tiny_repository(checkpoints: Checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled repository, built once per session even when several modules import the fixture."""
    base = tmp_path_factory.getbasetemp()
    if base not in _RELEASES:
        _RELEASES[base] = compile_release(checkpoints, base / "tiny_release").repository
    return _RELEASES[base]


@pytest.fixture(scope="session")
def capturing_repository(checkpoints: Checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The factory pair compiled as :func:`tiny_repository` is, with capture on (the spec's capture section)."""
    return compile_release(checkpoints, tmp_path_factory.mktemp("capturing_release"),
                           **{"capture.enabled": True}).repository


@pytest.fixture(scope="module")
def served(tiny_repository: Path) -> Any:
    """A server on ``tiny_repository`` with every model loaded and explicit model control."""
    with TritonServer(tiny_repository, model_control="explicit", extra_args=["--load-model=*"],
                      startup_timeout=300) as server:
        yield server
