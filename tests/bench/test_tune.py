"""specbuild tune: choosing a setting and writing it into the spec file without losing the user's comments."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specbuild.bench.figures import Cell, percentiles
from specbuild.errors import SpecError, UsageError
from specbuild.spec import SpeculationSpec, load_spec
from specbuild.spec_rendering import render_spec, starter_spec
from checkpoint_factory import package_gpu_release, release_spec
from specbuild.bench.tune import (candidate_ks, load_schedule, measured_verify_cost, pick, release_max_draft_len,
                                  set_section_values, tune, tune_schedule, write_choice)


def cell(k: int, tokens_per_second: float, e2e: float, *, adaptive: bool = False, errors: int = 0,
         matches: float | None = 1.0, concurrency: int = 1, sampling: str = "greedy") -> Cell:
    return Cell(k=k, concurrency=concurrency, adaptive=adaptive, requests=4, errors=errors, output_tokens=100,
                wall_seconds=100 / tokens_per_second, tokens_per_second=tokens_per_second, ttft=percentiles([]),
                tpot=percentiles([]), itl=percentiles([]), e2e=percentiles([e2e]), acceptance_rate=None,
                mean_acceptance_length=None, matches_baseline=matches, sampling=sampling)


def test_pick_by_goal_skipping_failed_and_wrong_settings():
    cells = [cell(0, 20, 3.0), cell(2, 30, 2.5), cell(4, 35, 2.7), cell(4, 40, 2.0, adaptive=True, errors=1),
             cell(6, 50, 1.0, matches=0.9)]
    assert pick(cells, "throughput").k == 4
    assert pick(cells, "latency").k == 2
    assert pick([cell(0, 20, 3.0), cell(3, 20, 3.0)], "throughput").k == 0  # a tie: the smaller K
    with pytest.raises(UsageError, match="no setting"):
        pick([cell(2, 30, 2.0, errors=4)], "latency")


def test_pick_weighs_each_sampling_profile_by_its_share_of_the_traffic():
    """Greedy prefers K=4 and sampled traffic K=2: the mix decides, and a setting needs every profile's cell clean."""
    cells = [cell(0, 20, 3.0), cell(2, 30, 2.0), cell(4, 36, 2.0),
             cell(0, 20, 3.0, sampling="t0.7", matches=None), cell(2, 26, 2.0, sampling="t0.7", matches=None),
             cell(4, 18, 2.0, sampling="t0.7", matches=None)]
    assert pick(cells, "throughput").k == 4  # greedy alone
    assert pick(cells, "throughput", {"greedy": 0.8, "t0.7": 0.2}).k == 4  # 32.4 against 29.2
    mixed = pick(cells, "throughput", {"greedy": 0.5, "t0.7": 0.5})  # 28.0 against 27.0
    assert (mixed.k, mixed.sampling) == (2, "greedy")  # equal shares: the first profile's cell
    sampled = pick(cells, "throughput", {"greedy": 0.2, "t0.7": 0.8})
    assert (sampled.k, sampled.sampling) == (2, "t0.7")  # the cell of the mix's largest profile
    failed = [*cells[:3], cell(0, 20, 3.0, sampling="t0.7"), cell(2, 26, 2.0, sampling="t0.7", errors=1),
              cell(4, 18, 2.0, sampling="t0.7")]
    assert pick(failed, "throughput", {"greedy": 0.5, "t0.7": 0.5}).k == 4  # K=2 failed a sampled request


def test_the_break_even_prior_is_the_mix_acceptance_and_costs_come_from_greedy_cells():
    from dataclasses import replace

    from specbuild.bench.tune import measured_costs

    def costed(k: int, sampling: str, acceptance: float, c: float, v: float) -> Cell:
        return replace(cell(k, 30, 2.0, sampling=sampling), per_token_acceptance=acceptance, cost_ratio=c,
                       verify_cost=v)

    cells = [costed(2, "greedy", 0.6, 0.1, 1.1), costed(3, "greedy", 0.5, 0.1, 1.2),
             costed(2, "t1.0", 0.3, 0.2, 1.5), costed(3, "t1.0", 0.2, 0.2, 1.6)]
    assert measured_costs(cells) == {"verify_cost": {2: 1.1, 3: 1.2}, "draft_cost": 0.1, "measured_acceptance": 0.55}
    mixed = measured_costs(cells, {"greedy": 0.5, "t1.0": 0.5})
    assert mixed["measured_acceptance"] == 0.4 and mixed["draft_cost"] == 0.1
    assert measured_costs(cells, {"t0.7": 1.0}) == {}  # that profile was not measured


def test_a_verification_measured_cheaper_than_a_step_is_written_as_one_step():
    """V(K) < 1 is the load drifting between cells (bench warns of it): the cost model keeps the physical bound."""
    from dataclasses import replace

    cells = [replace(cell(1, 30, 2.0), verify_cost=0.68), replace(cell(2, 30, 2.0), verify_cost=1.234)]
    assert measured_verify_cost(cells) == {1: 1.0, 2: 1.234}


def test_candidate_ks_stay_within_the_engine_limit():
    assert candidate_ks(8) == (0, 1, 2, 3, 4, 6, 8)
    assert candidate_ks(3) == (0, 1, 2, 3)


def test_the_k_values_tried_are_bounded_by_the_release_engine_not_the_spec_file(checkpoints, tmp_path: Path):
    """The server enforces the target engine's max_draft_len; a spec file edited since the build must not widen
    (or narrow) what tune tries."""
    release = package_gpu_release(checkpoints, tmp_path, {"speculation.max_draft_len": 4})
    assert release_max_draft_len(release.repository) == 4
    edited = release_spec(checkpoints, tmp_path, "tensorrt-llm", {"speculation.max_draft_len": 8})
    spec_file = tmp_path / "specbuild.yaml"
    spec_file.write_text(render_spec(edited), encoding="utf-8")
    assert load_spec(spec_file).speculation.max_draft_len == 8
    with pytest.raises(UsageError, match=r"K=6 is above the engine's max_draft_len \(4\)"):
        tune(spec_file, "latency", [], ks=(2, 6), write=False)  # refused before any server starts
    with pytest.raises(UsageError, match=r"K=6 is above the engine's max_draft_len \(4\)"):
        tune_schedule(spec_file, "latency", [], ks=(2, 6), write=False)  # and before any packaging


def test_set_section_values_edits_only_the_scalars_and_keeps_comments():
    text = starter_spec("t", "d")
    updated = set_section_values(text, "speculation", {"num_draft_tokens": 2, "adaptive": True})
    assert "  # default K: draft tokens per round (0 = the target alone); requests may ask for 0..max_draft_len\n" \
        "  num_draft_tokens: 2\n" in updated
    assert "  adaptive: true\n" in updated
    assert updated.count("\n") == text.count("\n")
    data = yaml.safe_load(updated)
    assert data["speculation"] == {**yaml.safe_load(text)["speculation"], "num_draft_tokens": 2, "adaptive": True}


def test_set_section_values_adds_missing_keys_and_sections():
    text = "name: x  # mine\nspeculation:\n    max_draft_len: 6   # engine\ntarget:\n  checkpoint: t\n"
    updated = set_section_values(text, "speculation", {"num_draft_tokens": 3, "adaptive": False})
    assert yaml.safe_load(updated)["speculation"] == {"max_draft_len": 6, "num_draft_tokens": 3, "adaptive": False}
    assert "    num_draft_tokens: 3\n" in updated and "# engine" in updated
    plain = set_section_values("name: x", "speculation", {"num_draft_tokens": 1})
    assert yaml.safe_load(plain) == {"name": "x", "speculation": {"num_draft_tokens": 1}}
    with pytest.raises(SpecError, match="block mapping"):
        set_section_values("speculation: {adaptive: true}\n", "speculation", {"adaptive": False})


def test_write_choice_keeps_a_valid_spec_and_refuses_an_impossible_one(tmp_path: Path):
    path = tmp_path / "specbuild.yaml"
    path.write_text(starter_spec(str(tmp_path / "t"), str(tmp_path / "d")), encoding="utf-8")
    write_choice(path, 6, True)
    spec = load_spec(path)
    assert (spec.speculation.num_draft_tokens, spec.speculation.adaptive) == (6, True)
    before = path.read_text(encoding="utf-8")
    with pytest.raises(SpecError, match="larger than max_draft_len"):
        write_choice(path, 12, False)  # max_draft_len is 8
    assert path.read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specbuild.yaml"]  # no temporary file left


def test_write_choice_records_the_measured_verification_costs_over_earlier_ones(tmp_path: Path):
    """init writes V(K) for K=1..8 (a flow mapping); tune's server measurements replace those it measured again,
    in place, and check's break-even reads them."""
    path = tmp_path / "specbuild.yaml"
    path.write_text(starter_spec(str(tmp_path / "t"), str(tmp_path / "d"),
                                 speculation=SpeculationSpec(verify_cost={1: 1.05, 2: 1.1})), encoding="utf-8")
    write_choice(path, 2, False, {"verify_cost": {2: 1.3, 3: 1.4}, "draft_cost": 0.18, "measured_acceptance": 0.49})
    speculation = load_spec(path).speculation
    assert speculation.verify_cost == {1: 1.05, 2: 1.3, 3: 1.4}
    assert (speculation.draft_cost, speculation.measured_acceptance) == (0.18, 0.49)  # the release's cost model
    assert path.read_text(encoding="utf-8").count("verify_cost:") == 1
    write_choice(path, 2, False, traffic={"greedy": 0.3, "t0.7": 0.7})
    assert load_spec(path).speculation.traffic == {"greedy": 0.3, "t0.7": 0.7}


def test_missing_keys_are_added_when_the_section_ends_with_a_nested_block():
    text = starter_spec("t", "d").replace("  adaptive: false\n", "")
    updated = set_section_values(text, "speculation", {"adaptive": True})
    data = yaml.safe_load(updated)
    assert data["speculation"] == {**yaml.safe_load(text)["speculation"], "adaptive": True}
    assert data["limits"] == yaml.safe_load(text)["limits"]


def test_the_load_schedule_takes_the_best_k_per_level_never_rising_with_load():
    speeds = {1: {0: 10, 2: 14, 4: 16}, 2: {0: 18, 2: 22, 4: 21}, 4: {0: 30, 2: 29, 4: 31},  # 4 at c=4: noise
              8: {0: 40, 2: 35, 4: 33}, 16: {0: 50, 2: 40, 4: 38, 6: 60}}
    cells = [cell(k, speed, 1.0, concurrency=c) for c, row in speeds.items() for k, speed in row.items()]
    cells.append(cell(6, 99, 0.1, concurrency=2, matches=0.5))  # a wrong K never wins
    assert load_schedule(cells, "throughput") == {1: 4, 2: 2, 8: 0}
    assert load_schedule([cell(3, 20, 1.0, concurrency=c) for c in (1, 2)] + [cell(0, 10, 2.0, concurrency=c)
                                                                           for c in (1, 2)], "latency") == {1: 3}


def test_write_choice_writes_the_schedule_in_place_of_busy_in_flight(tmp_path: Path):
    path = tmp_path / "specbuild.yaml"
    path.write_text(starter_spec(str(tmp_path / "t"), str(tmp_path / "d"),
                                 speculation=SpeculationSpec(busy_in_flight=2)), encoding="utf-8")
    write_choice(path, 4, False, schedule={1: 4, 2: 2, 8: 0})
    speculation = load_spec(path).speculation
    assert speculation.draft_len_schedule == {1: 4, 2: 2, 8: 0} and speculation.busy_in_flight is None
    assert speculation.load_schedule(16).as_mapping() == {1: 4, 2: 2, 8: 0}
    write_choice(path, 2, False, schedule={1: 2})  # measured again: replaced in place
    assert load_spec(path).speculation.draft_len_schedule == {1: 2}
    assert path.read_text(encoding="utf-8").count("draft_len_schedule:") == 1


def test_the_schedule_is_measured_on_a_server_of_its_own():
    """A running server serves its release's load policy, which would turn the K measured at load into K=0."""
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, ["tune", "--concurrency-schedule", "--url", "127.0.0.1:1", "--num-prompts", "1"])
    assert result.exit_code != 0 and "drop --url and --concurrency" in result.output
    assert "Traceback" not in result.output
