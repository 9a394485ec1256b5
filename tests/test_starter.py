"""``specbuild init``: a starter spec generated from the model that never starts slower than the target alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specbuild.bench.estimate import PairEstimate, StepCosts
from specbuild.cli import main
from specbuild.drafts.model_pairs import CACHE_ENV
from specbuild.spec import load_spec
from specbuild.starter import MIN_PREDICTED_SPEEDUP, choose_speculation


def estimate_with(acceptance: dict[str, float], cost_ratio: float) -> PairEstimate:
    costs = StepCosts(target_step_ms=10.0, draft_step_ms=10.0 * cost_ratio,
                      verify_cost={int(k): 1.0 + 0.05 * int(k) for k in acceptance})
    from specbuild.bench.estimate import predicted_speedups

    return PairEstimate(acceptance=acceptance, costs=costs, speedups=predicted_speedups(acceptance, costs),
                        prompts=4, new_tokens=32, seconds=12.0)


def test_a_good_draft_starts_from_the_k_predicted_fastest():
    good = estimate_with({"1": 0.9, "2": 0.85, "3": 0.8, "4": 0.5}, cost_ratio=0.05)
    speculation, note = choose_speculation(good)
    assert speculation.num_draft_tokens == good.best_k == 3 and good.speedups[3] >= MIN_PREDICTED_SPEEDUP
    assert note.startswith(f"K=3: predicted {good.speedups[3]:.2f}x the target alone (greedy acceptance 80%") and "`specbuild tune`" in note
    assert speculation.verify_cost == {1: 1.05, 2: 1.1, 3: 1.15, 4: 1.2}  # what check's break-even reads


def test_a_draft_that_would_slow_the_target_down_starts_from_k0():
    """The demo's truncated draft: 5% agreement at a fifth of a target step's cost."""
    weak = estimate_with({"1": 0.05, "2": 0.03}, cost_ratio=0.2)
    speculation, note = choose_speculation(weak)
    assert max(weak.speedups.values()) < 1 and speculation.num_draft_tokens == 0
    assert note.startswith("K=0 (the target alone): the draft would not make it faster")
    assert "prompt lookup" in note and "`specbuild tune`" in note
    assert speculation.verify_cost == {1: 1.05, 2: 1.1}
    borderline = estimate_with({"1": 0.2}, cost_ratio=0.1)  # 1.04x: within timing noise
    assert choose_speculation(borderline)[0].num_draft_tokens == 0


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["init", *args], env={"COLUMNS": "300"})
    return result.exit_code, " ".join(result.output.split())


def test_placeholders_start_from_k0_and_point_at_the_demo_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    code, output = invoke()
    assert code == 0, output
    assert "K=0 (the target alone): placeholder checkpoints, nothing measured" in output
    text = Path("specbuild.yaml").read_text()
    assert "# specbuild init: K=0 (the target alone): placeholder checkpoints" in text
    spec = load_spec("specbuild.yaml")
    assert spec.speculation.num_draft_tokens == 0
    assert spec.target.checkpoint == str(tmp_path / ".cache" / "demo-pair" / "target")
    assert invoke()[0] == 2  # exists: not overwritten
    assert invoke("--force")[0] == 0


def test_checkpoints_relative_to_the_spec_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_pair):
    monkeypatch.chdir(tmp_path)
    code, output = invoke(str(tiny_pair.target_dir), str(tiny_pair.draft_dir), "--no-measure", "--out", "sub/x.yaml")
    assert code == 0, output
    assert "not measured (--no-measure)" in output
    spec = load_spec(tmp_path / "sub" / "x.yaml")
    assert Path(spec.target.checkpoint) == tiny_pair.target_dir.resolve()
    assert spec.speculation.num_draft_tokens == 0


def test_target_without_draft_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    code, output = invoke("models/target")
    assert code == 2 and "both TARGET and DRAFT" in output and not Path("specbuild.yaml").exists()
    code, output = invoke("missing/target", "missing/draft")
    assert code == 2 and "has no config.json" in output and "--no-measure" in output
    Path("specbuild.yaml").write_text("mine")
    code, output = invoke("missing/target", "missing/draft")  # refused before anything is measured
    assert code == 2 and "specbuild.yaml already exists" in output and Path("specbuild.yaml").read_text() == "mine"


@pytest.mark.slow
def test_init_measures_the_pair_and_writes_what_the_measurement_chose(tmp_path: Path, tiny_pair):
    from specbuild.starter import make_starter

    starter = make_starter(str(tiny_pair.target_dir), str(tiny_pair.draft_dir), tmp_path / "specbuild.yaml",
                           placeholders=("t", "d"))
    estimate = starter.estimate
    assert estimate is not None and estimate.prompts == 4 and set(estimate.speedups) == set(range(1, 9))
    assert (starter.speculation, starter.note) == choose_speculation(estimate)
    best = estimate.speedups[estimate.best_k]
    assert starter.speculation.num_draft_tokens == (estimate.best_k if best >= MIN_PREDICTED_SPEEDUP else 0)
    data = yaml.safe_load(starter.text)
    assert data["speculation"]["num_draft_tokens"] == starter.speculation.num_draft_tokens
    assert f"in {estimate.seconds:.0f} s on 4 prompts" in " ".join(
        line.strip("# ") for line in starter.text.splitlines() if line.lstrip().startswith("#"))
