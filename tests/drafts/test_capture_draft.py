"""specbuild draft --from-capture: a draft continued on captured traffic (specbuild.drafts.capture_distill, the split
in capture_split, the stores in capture_sources).

The captures are the tiny release's real answers: its own engines and orchestrator run in this process
(:class:`~specbuild.bench.in_process.InProcessRelease`) and each finished request is written as a
:class:`~specbuild.capture.records.CaptureRecord`. Nothing here asserts what the tiny model says (no acceptance
rise): structure, the split's rules, refusals, resume, and that training lowers its own loss.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.capture.records import CaptureRecord, read_records
from specbuild.cli import main
from specbuild.checkpoint.tokenizer_files import folder_tokenizer_hash
from specbuild.drafts.capture_distill import CAPTURE_FILE, CAPTURE_STATE
from specbuild.drafts.capture_sources import HELD_OUT_FOLDER, release_models
from specbuild.drafts.capture_split import PREFIX_TOKENS, apart_from, source_groups, split_by_time_and_source
from specbuild.drafts.distill import SUMMARY_FILE, TRAIN_FILE, state_dir
from specbuild.drafts.distill_data import DATA_FILE
from specbuild.errors import UsageError

TEMPLATE = "Please summarize the following short note in exactly one sentence for my weekly report: "
NOTES = ["the printer on floor two is broken again", "lunch moves to noon on Friday",
         "the new intern starts on Monday", "the server room door must stay closed"]
RETRIED = ["How do I reset my password on the company website? I forgot it after the holidays.",
           "How do I reset my password on the company portal? I forgot it after the holidays."]
OTHERS = ["def add(a, b):", "The weather today", "Once upon a time", "for i in range(10):\n    total += i",
          "Write a haiku about rain.", "List three colours.", "import numpy as np", "class Stack:"]
# a budget no loaded machine reaches: these runs end by their steps (the deadline tests pass their own)
SMALL = ["--max-new-tokens", "8", "--minutes", "30", "--batch-tokens", "256"]


def served(release_dir: Path, prompts: list[str], started: float) -> list[CaptureRecord]:
    """Each prompt answered by the release in process (greedy, K=3), as the capture writer records it; request i
    finishes ``i`` minutes after ``started``."""
    from specbuild.bench.in_process import InProcessRelease, _Exchange
    from specbuild.serve.client import GenerationRequest

    release = InProcessRelease(release_dir)
    manifest = hashlib.sha256((release_dir / "manifest.json").read_bytes()).hexdigest()
    tokenizer = folder_tokenizer_hash(release_models(release_dir)[0])
    records = []
    for number, prompt in enumerate(prompts):
        arrays = release.orchestrator_arrays(GenerationRequest(prompt, 12, num_draft_tokens=3).arrays())
        exchange = _Exchange(arrays, time.perf_counter())
        asyncio.run(release.runner.serve(exchange))
        last = exchange.responses[-1][1]
        output = last["output_ids"].reshape(-1)[:int(last["output_length"].reshape(-1)[0])].tolist()
        records.append(CaptureRecord(
            prompt_ids=tuple(arrays["input_ids"].reshape(-1).tolist()), output_ids=tuple(output),
            sampling={"top_k": 1}, rounds=((int(last["total_draft_tokens"][0, 0]),
                                            int(last["total_accepted_draft_tokens"][0, 0])),),
            finish_reason="length", release=manifest, tokenizer=tokenizer, finished_at=started + 60 * number,
            instance="orchestrator_0"))
    return records


def write_store(folder: Path, records: list[CaptureRecord]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1796000000-orchestrator_0.jsonl").write_bytes(b"".join(record.to_line() for record in records))
    return folder


@pytest.fixture(scope="module")
def captured(tiny_release) -> list[CaptureRecord]:
    """Requests of a template, a retried request and unrelated prompts, interleaved in time: the newest is a
    template request."""
    prompts = [*OTHERS[:4], TEMPLATE + NOTES[0], RETRIED[0], *OTHERS[4:], TEMPLATE + NOTES[1], RETRIED[1],
               TEMPLATE + NOTES[2], TEMPLATE + NOTES[3]]
    return served(tiny_release.repository, prompts, started=1_796_000_000.0)


def run_draft(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["draft", *args, *SMALL, "--json"])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def first_run(tiny_release, captured, tmp_path_factory):
    """The release's own draft continued for 2 steps on a store of the captured records."""
    root = tmp_path_factory.mktemp("capture")
    store = write_store(root / "store", captured)
    out = root / "traffic-draft"
    code, output = run_draft(str(out), "--from-capture", str(store), "--release", str(tiny_release.repository),
                             "--steps", "2")
    assert code == 0, output
    return store, out, json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))


def test_the_release_s_stamp_the_bench_and_the_draft_read_one_tokenizer_hash(tiny_pair, tiny_release):
    """The hash a capturing release stamps into its records (its orchestrator's parameter, rendered when it was
    packaged), the one ``bench --captured`` checks records against and the one ``draft --from-capture`` reads them
    with are one (checkpoint.tokenizer_files.folder_tokenizer_hash)."""
    from specbuild.bench.captured import release_tokenizer_hash
    from specbuild.package.repository import orchestrator_settings

    settings = orchestrator_settings(tiny_release.repository)
    assert settings is not None and len(settings.tokenizer_hash) == 64
    target, draft = release_models(tiny_release.repository)
    assert release_tokenizer_hash(tiny_release.repository) == settings.tokenizer_hash
    assert folder_tokenizer_hash(target) == folder_tokenizer_hash(draft) == settings.tokenizer_hash
    assert folder_tokenizer_hash(tiny_pair.target_dir) == settings.tokenizer_hash


def test_the_split_keeps_groups_on_one_side_and_holds_out_the_newest(captured):
    groups = source_groups([record.prompt_ids for record in captured])
    template = [4, 10, 12, 13]
    assert len({groups[i] for i in template}) == 1  # one template, one group
    assert groups[5] == groups[11]  # the retried request and its near-copy
    assert len({groups[i] for i in range(len(captured)) if i not in (*template, 5, 11)}) == 8  # the rest apart
    split = split_by_time_and_source(captured, 0.1)
    held, train = set(split.held_out), set(split.train)
    assert held | train == set(range(len(captured))) and not held & train
    assert not {groups[i] for i in held} & {groups[i] for i in train}
    assert len(captured) - 1 in held  # the newest record
    assert set(template) <= held  # its group goes along, older members included
    newest_held = min(max(captured[j].finished_at for j in held if groups[j] == groups[i]) for i in held)
    assert all(captured[i].finished_at < newest_held for i in train)


def test_the_shared_chat_wrapping_does_not_make_one_group():
    wrap_head, wrap_tail = list(range(500, 500 + 2 * PREFIX_TOKENS)), [7, 8, 9]
    prompts = [wrap_head + [number, 10 + number, 20 + number] + wrap_tail for number in range(5)]
    assert len(set(source_groups(prompts))) == 5
    lead_in = list(range(100, 100 + PREFIX_TOKENS))
    assert len(set(source_groups([lead_in + [1, 2, 3], lead_in + [4, 5, 6, 7, 8], [9] * 20]))) == 2


def test_a_capture_of_one_group_cannot_be_split(captured):
    with pytest.raises(UsageError, match="group"):
        split_by_time_and_source([captured[4]] * 3, 0.5)


def test_the_run_writes_the_draft_its_provenance_and_the_held_out_records(first_run, captured, tiny_pair):
    from transformers import AutoModelForCausalLM

    store, out, summary = first_run
    AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    provenance = json.loads((out / CAPTURE_FILE).read_text(encoding="utf-8"))
    assert set(provenance) == {"format", "capture", "base_draft", "held_out", "pool", "bundled"}
    assert provenance["format"] == 1
    assert {"first_finished_at", "last_finished_at", "records", "bytes", "stores"} <= set(provenance["capture"])
    assert provenance["capture"]["records"] == len(captured)
    assert provenance["capture"]["stores"] == [str(store.resolve())]
    assert set(provenance["base_draft"]) == {"path", "sha256"} and len(provenance["base_draft"]["sha256"]) == 64
    held = provenance["held_out"]
    assert {"records", "acceptance_before", "acceptance_after", "predicted_speedup_before",
            "predicted_speedup_after"} <= set(held)
    assert set(held["acceptance_before"]) == set(held["acceptance_after"]) == {"1", "2", "3", "4"}
    assert set(provenance["bundled"]["acceptance_after"]) == {"1", "2", "3", "4"}
    assert provenance["pool"]["sequences"] >= 1
    text = (out / CAPTURE_FILE).read_text(encoding="utf-8")
    assert "prompt_ids" not in text and not any(note in text for note in NOTES)
    assert summary["steps_done"] == 2 and summary["resumed_from_step"] == 0
    assert summary["data"]["captured_unlabelled"] == 0 and summary["data"]["captured_sequences"] == len(captured)
    path = store / HELD_OUT_FOLDER / f"{out.name}.jsonl"
    assert summary["held_out_files"] == [str(path)]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    split = split_by_time_and_source(captured, 0.1)
    assert list(read_records([path])) == [captured[i] for i in split.held_out]
    assert held["records"] == len(split.held_out)
    assert list(read_records([store])) == captured  # the held-out folder is not read as capture
    assert stat.S_IMODE(state_dir(out).stat().st_mode) == 0o700


def copies_past_one_label_window(records: list[CaptureRecord]) -> list[CaptureRecord]:
    """``records`` again and again, each copy an hour later, until their tokens fill more than two labelling
    windows."""
    from dataclasses import replace

    from specbuild.drafts.distill_data import LABEL_WINDOW_TOKENS

    tokens = sum(len(record.prompt_ids) + len(record.output_ids) for record in records)
    return [replace(record, finished_at=record.finished_at + 3600 * copy)
            for copy in range(2 * LABEL_WINDOW_TOKENS // tokens + 2) for record in records]


def test_past_the_data_deadline_the_held_out_records_are_labelled_and_the_oldest_training_ones_left_out(
        captured, tiny_pair, tmp_path):
    """A data deadline already passed: every held-out record is labelled (they measure before and after), no pool
    answer is made, and the training records are labelled newest first for one window only (the least a run
    trains on); the older ones are left out and counted."""
    import torch

    from specbuild.drafts.capture_distill import load_or_make_data
    from specbuild.drafts.capture_sources import CapturedTraffic
    from specbuild.drafts.distill import load_target
    from specbuild.drafts.distill_data import LABEL_WINDOW_TOKENS
    from specbuild.drafts.distill_options import CaptureOptions, DraftOptions

    records = copies_past_one_label_window(captured)
    traffic = CapturedTraffic(tuple(records), (0,) * len(records))
    split = split_by_time_and_source(records, 0.1)
    target, tokenizer = load_target(tiny_pair.target_dir, torch.device("cpu"))
    work = tmp_path / "state"
    work.mkdir()
    data, _, _ = load_or_make_data(target, tokenizer, traffic, split, work, DraftOptions(max_new_tokens=8),
                                   CaptureOptions(stores=(tmp_path,), bundled_prompts=2), time.monotonic() - 1, None)
    newest_first = [records[i] for i in reversed(split.train)]
    labelled = data.count - data.held_out
    assert data.held_out == len(split.held_out) and data.figures["pool_sequences"] == 0
    assert 0 < labelled < len(split.train)
    assert data.figures["captured_unlabelled"] == len(split.train) - labelled
    assert data.figures["captured_sequences"] == data.count
    kept = [records[i] for i in split.held_out] + newest_first[:labelled]
    assert data.ids.tolist() == [token for record in kept for token in record.prompt_ids + record.output_ids]
    assert sum(len(r.prompt_ids) + len(r.output_ids) for r in newest_first[:labelled]) <= LABEL_WINDOW_TOKENS
    assert data.top_ids is not None and len(data.top_ids) == len(data.ids)  # every kept sequence labelled


def test_the_summary_says_how_many_training_records_the_budget_left_unlabelled(captured, tiny_release, tmp_path):
    store = write_store(tmp_path / "store", copies_past_one_label_window(captured))
    result = CliRunner().invoke(main, ["draft", str(tmp_path / "out"), "--from-capture", str(store), "--release",
                                       str(tiny_release.repository), "--minutes", "0.001", "--max-new-tokens", "8",
                                       "--batch-tokens", "256", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text(encoding="utf-8"))
    unlabelled = summary["data"]["captured_unlabelled"]
    assert unlabelled > 0
    assert f"left out: {unlabelled} older training records, unlabelled when the data budget ran out" in result.output


def test_the_continued_draft_passes_check(first_run, tiny_pair):
    _, out, _ = first_run
    result = CliRunner().invoke(main, ["check", str(tiny_pair.target_dir), str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["compatible"] is True


def test_resume_trains_on_from_the_saved_step_on_the_data_it_started_with(first_run, captured, tiny_pair,
                                                                           tmp_path):
    store, out, _ = first_run
    copy = tmp_path / "traffic-draft"
    shutil.copytree(out, copy)
    shutil.copytree(state_dir(out), state_dir(copy))
    data_before = (state_dir(copy) / DATA_FILE).read_bytes()
    later = store / "1796999999-orchestrator_1.jsonl"  # the store has grown since the run began
    later.write_bytes(captured[0].to_line())
    try:
        code, output = run_draft(str(tiny_pair.target_dir), str(copy), "--from-capture", str(store), "--base",
                                 str(release_base(first_run)), "--steps", "4", "--resume")
    finally:
        later.unlink()
    assert code == 0, output
    summary = json.loads((copy / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert summary["resumed_from_step"] == 2 and summary["steps_done"] == 4
    assert (state_dir(copy) / DATA_FILE).read_bytes() == data_before
    assert summary["provenance"]["capture"]["records"] == len(captured)  # the data it started with


def release_base(first_run) -> Path:
    return Path(first_run[2]["base_draft"]["path"])


def test_training_lowers_its_own_loss(first_run, tiny_pair, tmp_path):
    """The continued draft's loss on its own training batches, before and after some steps of the recipe."""
    import torch

    from specbuild.drafts.capture_distill import shares_target_head
    from specbuild.drafts.distill import load_target
    from specbuild.drafts.distill_data import load_data
    from specbuild.drafts.distill_options import CONTINUE_LEARNING_RATE, DraftOptions
    from specbuild.drafts.distill_training import Trainer

    _, out, _ = first_run
    work = state_dir(out)
    window = json.loads((work / CAPTURE_STATE).read_text(encoding="utf-8"))
    data = load_data(work / DATA_FILE, window["held_out"]["records"])
    device = torch.device("cpu")
    target, _ = load_target(tiny_pair.target_dir, device)
    student, _ = load_target(release_base(first_run), device, "draft")
    options = DraftOptions(steps=30, batch_tokens=256, learning_rate=CONTINUE_LEARNING_RATE, checkpoint_every=1000)
    torch.manual_seed(0)
    trainer = Trainer(student, data, options, dtype=torch.float32, frozen_head=shares_target_head(student, target))

    def loss() -> float:
        with torch.no_grad():
            return sum(float(trainer.loss(batch)) for batch in trainer.batches)

    before = loss()
    trainer.run(time.monotonic() + 120, tmp_path / TRAIN_FILE, None)
    assert trainer.step == 30 and loss() < before


def test_passes_set_the_schedule_in_passes_over_the_training_batches(first_run, tiny_pair):
    """Without --steps a continued draft trains CAPTURE_PASSES passes over its data, however large the capture."""
    import torch

    from specbuild.drafts.distill import load_target
    from specbuild.drafts.distill_data import load_data
    from specbuild.drafts.distill_options import CAPTURE_PASSES, CaptureOptions, DraftOptions
    from specbuild.drafts.distill_training import Trainer

    _, out, _ = first_run
    work = state_dir(out)
    data = load_data(work / DATA_FILE, json.loads((work / CAPTURE_STATE).read_text(encoding="utf-8"))["held_out"]["records"])
    student, _ = load_target(release_base(first_run), torch.device("cpu"), "draft")
    options = DraftOptions(steps=7, batch_tokens=256)
    assert CaptureOptions(stores=(out,)).passes == CAPTURE_PASSES
    trainer = Trainer(student, data, options, dtype=torch.float32, frozen_head=False, passes=2.5)
    assert trainer.options.steps == round(2.5 * len(trainer.batches)) and len(trainer.batches) > 1
    assert Trainer(student, data, options, dtype=torch.float32, frozen_head=False).options.steps == 7
    with pytest.raises(UsageError, match="passes"):
        CaptureOptions(stores=(out,), passes=0).validate()


def test_records_of_another_tokenizer_are_refused_by_count(captured, tiny_pair, tmp_path):
    from dataclasses import replace

    store = write_store(tmp_path / "store", [replace(record, tokenizer="f" * 64) for record in captured])
    code, output = run_draft(str(tiny_pair.target_dir), str(tmp_path / "out"), "--from-capture", str(store),
                             "--base", str(tiny_pair.draft_dir))
    assert code == 2 and f"{len(captured)} made with tokenizer ffffffffffff" in output and "Traceback" not in output


def test_an_empty_capture_is_refused_by_name(tiny_pair, tmp_path):
    store = tmp_path / "empty-store"
    store.mkdir()
    code, output = run_draft(str(tiny_pair.target_dir), str(tmp_path / "out"), "--from-capture", str(store),
                             "--base", str(tiny_pair.draft_dir))
    assert code == 2 and "empty-store holds no records" in output.replace("\n", "")
    assert not state_dir(tmp_path / "out").exists()  # a capture that cannot train leaves nothing to --resume


@pytest.mark.parametrize(("args", "words"), [
    (["OUT", "--from-capture", "S"], "--base CHECKPOINT"),
    (["T", "OUT", "--from-capture", "S", "--release", "R"], "OUT alone"),
    (["OUT", "--from-capture", "S", "--release", "R", "--base", "B"], "--base CHECKPOINT"),
    (["T", "OUT", "--from-capture", "S", "--base", "B", "--layers", "3"], "--layers"),
    (["T", "OUT", "--base", "B"], "--from-capture"),
    (["OUT"], "TARGET and OUT"),
])
def test_the_command_line_names_what_does_not_fit(args, words):
    code, output = run_draft(*args)
    assert code == 2 and words in output.replace("\n", " ") and "Traceback" not in output


def test_pool_prompts_of_a_held_out_group_are_left_out():
    lead_in = list(range(100, 100 + PREFIX_TOKENS))
    held_out = [lead_in + [1, 2, 3], list(range(300, 340))]
    candidates = [lead_in + [7, 8], list(range(300, 339)) + [999], list(range(600, 640))]
    assert apart_from(held_out, candidates) == [2]


def test_the_head_is_ranked_again_only_where_it_covers_more(first_run):
    """A base list that holds every held-out answer token stays; one of ids never answered is replaced."""
    from specbuild.checkpoint.head_vocabulary import HeadVocabulary
    from specbuild.drafts.capture_distill import reranked_head
    from specbuild.drafts.distill_data import load_data
    from specbuild.drafts.distill_options import DraftOptions

    work = state_dir(first_run[1])
    window = json.loads((work / CAPTURE_STATE).read_text(encoding="utf-8"))
    data = load_data(work / DATA_FILE, window["held_out"]["records"])
    answered = sorted({token for answer in data.answers(range(data.count)) for token in answer})
    unused = [token for token in range(1024) if token not in answered][:len(answered)]
    assert len(unused) == len(answered)
    for base, kept in ((HeadVocabulary.of(answered), True), (HeadVocabulary.of(unused), False)):
        chosen, figures = reranked_head(base, data, 1024, DraftOptions())
        assert figures["reranked"] is not kept and (chosen.ids == base.ids) is kept
        assert figures["held_out_coverage_before"] == (1.0 if kept else 0.0)
        assert 0 < figures["held_out_coverage_after"] <= 1 and chosen.provenance["held_out_coverage"] > 0
    chosen, figures = reranked_head(None, data, 1024, DraftOptions(head_vocabulary=64))
    assert chosen.size == 64 and figures["held_out_coverage_before"] is None and figures["reranked"]
    assert reranked_head(None, data, 1024, DraftOptions()) == (None, {})
