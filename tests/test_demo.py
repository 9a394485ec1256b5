"""The README's main job (`specbuild demo`), end to end on the tiny pair: compile, serve, stream, compare."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rich.console import Console

from specbuild.demo import run_demo
from specbuild.drafts.model_pairs import CACHE_ENV, pair_dir


@pytest.mark.slow
@pytest.mark.e2e
def test_demo_compiles_serves_streams_and_matches_the_target_alone(tiny_pair, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    shutil.copytree(tiny_pair.root, pair_dir("tiny", tmp_path))  # the cached pair; its stamp skips a rebuild
    console = Console(record=True, width=120)
    result = run_demo(tmp_path, max_tokens=24, num_draft_tokens=3, tiny=True, console=console)
    assert result.identical
    assert result.speculative.output_token_count == result.baseline.output_token_count > 0
    assert result.speculative.total_draft_tokens > 0
    assert len(result.speculative.chunks) > 1  # streamed as rounds were accepted
    assert (tmp_path / "triton_repo" / "manifest.json").is_file()
    log = console.export_text()
    assert "server ready" in log and "identical" in log
    assert f"the pair's folder: {pair_dir('tiny', tmp_path)}" in " ".join(log.split())
    speculative = result.speculative
    accepted = speculative.total_accepted_draft_tokens
    own = speculative.output_token_count - accepted
    drafted = speculative.total_draft_tokens
    assert (f"where the tokens came from: {accepted} accepted from the draft model (of {drafted} drafted), 0 from "
            f"prompt lookup (of 0 drafted), {own} made by the target itself") in " ".join(log.split())


def test_token_sources_split_accepted_tokens_by_draft_source():
    from specbuild.bench.metrics import Counters
    from specbuild.demo import token_sources

    counters = Counters.of(output_tokens=64, rounds=40, drafts=30, drafted_tokens=60, accepted_tokens=24,
                           sources={"lookup": {"drafts": 10, "drafted_tokens": 20, "accepted_tokens": 9},
                                    "model": {"drafts": 20, "drafted_tokens": 40, "accepted_tokens": 15}})
    assert token_sources(counters) == ("15 accepted from the draft model (of 40 drafted), 9 from prompt lookup (of 20 "
                                       "drafted), 40 made by the target itself, in 40 target steps")
