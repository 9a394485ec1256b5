"""A draft's sub-vocabulary head made by specbuild: the ranking, `specbuild draft --head-vocabulary` and
`specbuild head-vocabulary`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.checkpoint.head_vocabulary import HEAD_VOCABULARY, read_head_vocabulary
from specbuild.cli import main
from specbuild.drafts.distill import SUMMARY_FILE, state_dir
from specbuild.drafts.distill_data import DATA_FILE
from specbuild.drafts.head_ranking import coverage, rank_head_vocabulary
from specbuild.errors import UsageError

SIZE = 64
SMALL = ["--prompts", "6", "--held-out", "2", "--max-new-tokens", "8", "--minutes", "5", "--steps", "2"]


def test_ids_are_ranked_by_count_then_by_lower_id():
    vocabulary = rank_head_vocabulary([[7, 7, 3, 9], [9, 7, 5]], vocab_size=12, size=5)
    assert vocabulary.ids == (7, 9, 3, 5, 0)  # 7 three times, 9 twice, then 3 and 5 once, then unseen ids by id
    assert vocabulary.provenance == {"answers": 2, "answer_tokens": 7, "distinct_ids": 4, "coverage": 1.0}
    assert rank_head_vocabulary([[7, 7, 3, 9], [9, 7, 5]], 12, 2).provenance["coverage"] == round(5 / 7, 4)
    assert coverage(vocabulary, [[7, 1], [2, 3]]) == 0.5


@pytest.mark.parametrize("size", [0, 12, 13])
def test_a_size_outside_the_vocabulary_is_refused(size):
    with pytest.raises(UsageError, match="between 1 and 11"):
        rank_head_vocabulary([[1, 2]], vocab_size=12, size=size)


def test_no_answers_is_refused():
    with pytest.raises(UsageError, match="no answer tokens"):
        rank_head_vocabulary([[], []], vocab_size=12, size=4)


@pytest.fixture(scope="module")
def headed_draft(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("headed") / "draft"
    result = CliRunner().invoke(main, ["draft", str(tiny_pair.target_dir), str(out), *SMALL,
                                       "--head-vocabulary", str(SIZE), "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))


def test_draft_ranks_its_head_from_the_training_answers_only(tiny_pair, headed_draft):
    from safetensors.torch import load_file

    from specbuild.drafts.distill_data import DistillData

    out, summary = headed_draft
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    vocabulary = read_head_vocabulary(out, config["vocab_size"])
    assert vocabulary is not None and vocabulary.size == SIZE
    stored = load_file(str(state_dir(out) / DATA_FILE))
    data = DistillData(**stored, held_out=2, figures={})
    expected = rank_head_vocabulary(data.answers(range(2, data.count)), config["vocab_size"], SIZE)
    assert vocabulary.ids == expected.ids  # the two held-out answers are not counted
    assert vocabulary.provenance["held_out_coverage"] == coverage(vocabulary, data.answers(range(2)))
    assert summary["head_vocabulary"] == {"size": SIZE, "sha256": vocabulary.sha256,
                                          "coverage": vocabulary.provenance["coverage"],
                                          "held_out_coverage": vocabulary.provenance["held_out_coverage"]}


def test_a_headed_draft_compiles_and_stays_exact(tiny_pair, headed_draft):
    """check shows the head; greedy speculation with the cut head gives the target's own tokens."""
    from specbuild.drafts.evaluate import compare_in_process

    out, _ = headed_draft
    checked = CliRunner().invoke(main, ["check", str(tiny_pair.target_dir), str(out), "--json"])
    assert checked.exit_code == 0, checked.output
    assert SIZE == json.loads(checked.output)["draft"]["head_vocabulary"]["size"]
    report = compare_in_process(tiny_pair.target_dir, out, ks=(0, 3), prompts=3, max_tokens=12, threads=1)
    assert [row["identical"] for row in report["rows"]] == [3, 3]


def test_head_vocabulary_command_writes_a_list_for_an_existing_draft(tiny_pair, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair.draft_dir, draft)
    args = ["head-vocabulary", str(tiny_pair.target_dir), str(draft), "--size", str(SIZE), "--prompts", "4",
            "--max-new-tokens", "8", "--threads", "1"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    vocabulary = read_head_vocabulary(draft, json.loads((draft / "config.json").read_text())["vocab_size"])
    assert vocabulary is not None and shown["sha256"] == vocabulary.sha256 and shown["size"] == SIZE
    assert shown["provenance"]["answers"] == 4 and 0 < shown["provenance"]["coverage"] <= 1
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "--replace" in again.output
    assert CliRunner().invoke(main, [*args, "--replace"]).exit_code == 0


def test_head_vocabulary_command_refuses_a_draft_of_another_vocabulary(tiny_pair, tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"vocab_size": 7}))
    result = CliRunner().invoke(main, ["head-vocabulary", str(tiny_pair.target_dir), str(draft), "--size", "4"])
    assert result.exit_code == 2 and "different vocabularies" in result.output
    assert not (draft / HEAD_VOCABULARY).exists()


def test_draft_refuses_a_head_as_large_as_the_vocabulary_before_it_works(tiny_pair, tmp_path: Path):
    vocab = json.loads((Path(tiny_pair.target_dir) / "config.json").read_text())["vocab_size"]
    result = CliRunner().invoke(main, ["draft", str(tiny_pair.target_dir), str(tmp_path / "out"), *SMALL,
                                       "--head-vocabulary", str(vocab)])
    assert result.exit_code == 2 and "not below the target's vocabulary" in result.output
    assert not (tmp_path / "out").exists() and not state_dir(tmp_path / "out").exists()
