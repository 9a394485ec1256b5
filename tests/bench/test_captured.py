"""``bench --captured``: captured prompts replayed by their token ids. Units: what is read from a store and what is
refused; end to end (slow): a capture file made from a real server's answers, replayed through two releases served
side by side (the tiny release and a copy compiled with other settings), texts compared, the gate both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specbuild.bench.captured import CAPTURED, captured_prompts
from specbuild.bench.sweep import BenchPlan, _request
from specbuild.errors import UsageError
from specbuild.serve.orchestrator_client import IdsRequest
from captures import TOKENIZER, served_records
from captures import captured_record as _record
from captures import write_store as _store


def test_a_store_s_records_become_prompts_of_one_kind_by_their_ids(tmp_path: Path):
    store = _store(tmp_path / "store", [_record((1, 2, 3), (4, 5))], [_record((6,), (7, 8, 9)), _record((10,), ())])
    (store / "held-out").mkdir()  # a subfolder is not part of the store
    _store(store / "held-out", [_record((99,), (1,))])
    prompts = captured_prompts([store], TOKENIZER)
    assert [(p.ids, p.max_tokens, p.category) for p in prompts] == [((1, 2, 3), 2, CAPTURED), ((6,), 3, CAPTURED),
                                                                     ((10,), 1, CAPTURED)]
    assert [p.ids for p in captured_prompts([store / "held-out"], TOKENIZER)] == [(99,)]  # 41b's held-out records
    assert [p.max_tokens for p in captured_prompts([store], TOKENIZER, max_tokens=16, limit=2)] == [16, 16]


def test_a_captured_prompt_is_sent_by_its_ids_with_the_cell_s_settings():
    from specbuild.bench.sweep import SentPrompt

    sent = SentPrompt("", CAPTURED, ids=(5, 6, 7), max_tokens=3)
    plan = BenchPlan(ks=(2,), samplings=("greedy", "t0.7"))
    greedy = _request(sent, 4, plan, (2, False, True, 1, "greedy"))
    assert greedy == IdsRequest((5, 6, 7), 3, stream=True, settings={"num_draft_tokens": 2, "adaptive_draft": False,
                                                                     "prompt_lookup": True})
    sampled = _request(sent, 4, plan, (0, False, False, 1, "t0.7"), max_tokens=8)
    assert sampled.max_tokens == 8 and sampled.settings["temperature"] == 0.7 and "seed" in sampled.settings


def test_the_report_says_the_max_tokens_the_requests_asked_for(tmp_path: Path):
    from specbuild.bench.report import markdown, max_tokens_line
    from specbuild.bench.sweep import BenchReport, asked_tokens

    store = _store(tmp_path / "store", [_record((1,), (2, 3, 4)), _record((5,), (6,)), _record((7,), (8, 9))])
    plan = BenchPlan(max_tokens=64)
    for given, line in ((None, "max_tokens: each record's own (1-3)"), (16, "max_tokens 16")):
        asked = [asked_tokens(prompt, plan) for prompt in captured_prompts([store], TOKENIZER, max_tokens=given)]
        report = BenchReport(plan, "127.0.0.1:1", 3, [], False, max_tokens_sent=(min(asked), max(asked)))
        assert max_tokens_line(report) == line and f"{line}, greedy" in markdown(report)
        assert report.to_dict()["max_tokens_sent"] == [min(asked), max(asked)]
    assert max_tokens_line(BenchReport(plan, "127.0.0.1:1", 3, [], False)) == "max_tokens 64"  # text prompts


def test_records_of_another_tokenizer_are_refused_by_name(tmp_path: Path):
    store = _store(tmp_path / "store", [_record((1,), (2,)), _record((3,), (4,), tokenizer="ef" * 32)])
    with pytest.raises(UsageError, match=r"record 2 was captured with tokenizer efefefefefef, and the release's is "
                                         r"abababababab") as caught:
        captured_prompts([store], TOKENIZER)
    assert "orchestrator_0.jsonl" in caught.value.message


@pytest.mark.parametrize("content, message", [
    (None, "no capture file or store at"),
    (b"", "no captured record in"),
    (b'{"format": "specbuild-capture/9"}\n', "not a specbuild-capture/1 record"),
])
def test_a_missing_empty_or_foreign_capture_is_a_clear_error(tmp_path: Path, content: bytes | None, message: str):
    path = tmp_path / "capture.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(Exception, match=message) as caught:
        captured_prompts([path], TOKENIZER)
    assert getattr(caught.value, "fix", None)


# --- end to end ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def other_release(tiny_pair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair compiled again with other settings (another release of the same target and tokenizer), its
    draft carrying the provenance of a traffic-trained one."""
    import shutil

    from checkpoint_factory import pair_spec
    from traffic_drafts import provenance

    from specbuild import compiler
    from specbuild.package.traffic_draft import PROVENANCE_FILE

    root = tmp_path_factory.mktemp("other_release")
    draft = shutil.copytree(tiny_pair.draft_dir, root / "draft")
    (draft / PROVENANCE_FILE).write_text(json.dumps(provenance()), encoding="utf-8")
    return compiler.run(pair_spec(root, tiny_pair.target_dir, draft, **{
        "name": "tiny-other", "runtime": "torch", "limits.max_input_len": 256, "limits.max_seq_len": 512,
        "speculation.max_draft_len": 4, "speculation.num_draft_tokens": 2, "limits.max_batch_size": 2}),
        json_mode=True).repository


@pytest.mark.slow
@pytest.mark.e2e
def test_the_release_of_a_traffic_trained_draft_records_it_and_serves_no_provenance(other_release: Path):
    from specbuild.package.manifest import verify
    from specbuild.package.traffic_draft import PROVENANCE_FILE

    manifest = json.loads((other_release / "manifest.json").read_text())
    record = manifest["extra"]["traffic_trained_draft"]
    assert record["capture"]["records"] == 1200 and record["base_draft"]["sha256"] == "ab" * 32
    assert record["held_out"]["acceptance_after"] == {"1": 0.66, "4": 0.45}
    served = [path for path in (other_release.parent / "engines").rglob("*")] + list(other_release.rglob("*"))
    assert served and not [path for path in served if path.name == PROVENANCE_FILE]
    assert verify(other_release).ok


@pytest.mark.slow
@pytest.mark.e2e
def test_captured_prompts_replayed_through_two_releases_side_by_side(tiny_release, tiny_server, other_release,
                                                                     tmp_path: Path):
    from click.testing import CliRunner

    from specbuild.bench.captured import release_tokenizer_hash
    from specbuild.cli import main
    from specbuild.serve.client import SpecbuildClient
    from specbuild.serve.orchestrator_client import IdsClient

    store = tmp_path / "capture"
    texts = ["The quick brown fox", "def add(a, b):", "Once upon a time"]
    served = [*served_records(tiny_release.repository, tiny_server.grpc_url, texts[:2], 12),
              *served_records(tiny_release.repository, tiny_server.grpc_url, texts[2:], 5)]
    _store(store, [record for record, _ in served])
    answers = [(answer, len(record.output_ids)) for record, answer in served]
    # replayed by ids, the orchestrator answers each captured prompt with the text the ensemble served for it
    ids_client = IdsClient.for_release(tiny_server.grpc_url, tiny_release.repository, timeout=300)
    for prompt, (answer, length) in zip(captured_prompts([store], release_tokenizer_hash(tiny_release.repository)),
                                        answers):
        replayed = ids_client.run(IdsRequest(prompt.ids, prompt.max_tokens, settings={"num_draft_tokens": 3}))
        assert (replayed.text, replayed.output_token_count) == (answer, length)
    assert SpecbuildClient(tiny_server.grpc_url).generate(texts[0], 4).text  # the ensemble still serves text

    def bench(out: Path, *gate: str) -> Any:
        return CliRunner().invoke(main, ["bench", "--repository", str(other_release), "--incumbent",
                                         str(tiny_release.repository), "--captured", str(store), "--k", "0,2",
                                         "--requests", "3", "--out", str(out), "--no-plots", "--json",
                                         "--gate", "greedy_identical", *gate])

    passed = bench(tmp_path / "pass", "--gate", "faster_than_incumbent=0.2")
    assert passed.exit_code == 0, passed.output
    report = json.loads((tmp_path / "pass" / "bench.json").read_text())
    assert json.loads((tmp_path / "pass" / "gate.json").read_text())["passed"] and report["incumbent"]["cells"]
    for cell in report["cells"]:
        assert cell["requests"] == 3 and cell["errors"] == 0 and list(cell["by_kind"]) == [CAPTURED]
        assert cell["matches_incumbent"] == 1.0 and cell["matches_baseline"] == 1.0
        # each record asks for its captured answer's length
        assert cell["incumbent_ratio"] > 0 and cell["output_tokens"] == sum(length for _, length in answers)
    fewest, most = min(length for _, length in answers), max(length for _, length in answers)
    assert fewest < most and report["max_tokens_sent"] == [fewest, most]  # not the plan's 64
    assert f"max_tokens: each record's own ({fewest}-{most})" in (tmp_path / "pass" / "bench.md").read_text()
    failed = bench(tmp_path / "fail", "--gate", "faster_than_incumbent=50")
    assert failed.exit_code == 3, failed.output
    verdict = json.loads((tmp_path / "fail" / "gate.json").read_text())
    assert [check["threshold"] for check in verdict["failures"]] == ["faster_than_incumbent"]
    assert verdict["failures"][0]["measured"] < 50
