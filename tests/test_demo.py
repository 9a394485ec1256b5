"""The README's main job (`specbuild demo`), end to end on the tiny pair: measure, compile, serve, and compare the
release's speculation with the target alone, interleaved, per kind of prompt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rich.console import Console

from conftest import TINY_SEED
from specbuild.demo import DEMO_PROMPTS, DEMO_SAMPLINGS, KINDS, run_demo
from specbuild.drafts.model_pairs import CACHE_ENV, pair_dir
from specbuild.spec import load_spec


@pytest.mark.slow
@pytest.mark.e2e
def test_demo_measures_compiles_serves_and_compares_each_kind_with_the_target_alone(
        tiny_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    shutil.copytree(tiny_pair.root, pair_dir("tiny", tmp_path))  # the cached pair; its stamp skips a rebuild
    console = Console(record=True, width=160)
    result = run_demo(tmp_path, max_tokens=16, num_draft_tokens=3, tiny=True, tiny_seed=TINY_SEED, console=console)
    assert result.identical and result.k == 3
    for sampling in DEMO_SAMPLINGS:  # greedy and sampled, each kind against K=0 of the same sampling
        assert [kind.kind for kind in result.of(sampling)] == list(KINDS) == ["chat", "grounded", "code", "rewrite"]
        assert result.overall(sampling) is not None and result.overall(sampling) > 0
    for kind in result.kinds:
        prompts = sum(prompt.category == kind.kind for prompt in DEMO_PROMPTS)
        assert kind.baseline.requests == kind.speculative.requests == prompts
        assert kind.speculative.source == "metrics" and kind.speculative.break_even_share is not None
        if kind.sampling == "greedy":
            assert kind.baseline.output_tokens == kind.speculative.output_tokens > 0
        else:
            assert kind.speculative.matches_baseline is None and kind.speculative.output_tokens > 0
    assert sum(kind.speculative.sources.get("model", {}).get("share", 0) for kind in result.kinds) > 0
    assert set(result.to_dict()["overall"]) == set(DEMO_SAMPLINGS) == {"greedy", "t0.7"}
    assert (tmp_path / "triton_repo" / "manifest.json").is_file()
    written = load_spec(tmp_path / "demo.yaml")  # the spec it compiled, for `specbuild tune --spec demo.yaml`
    assert written.speculation.num_draft_tokens == 3 and written.outputs.repository_dir.endswith("triton_repo")
    log = " ".join(console.export_text().split())
    assert "server ready" in log and "identical" in log and "overall" in log
    assert "temperature 0.7, top-p 0.9, seeded" in log
    assert f"the pair's folder: {pair_dir('tiny', tmp_path)}" in log
    assert "measured in process on this machine: a draft step costs c =" in log
    assert result.verdict() in log and "speculation pays on:" in log
