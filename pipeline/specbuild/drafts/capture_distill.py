"""``specbuild draft --from-capture``: continue a draft on the traffic its release captured.

The records already hold the target's answers to the traffic (prompt and output ids as served: never decoded and
encoded again), so no answer is generated for them: one teacher-forced target pass labels them (the stored top-k
labels, or the joint teacher on a GPU) and the draft trains on from its own weights, as ``specbuild draft`` trains
(:class:`~specbuild.drafts.distill_training.Trainer`: the same loss, schedule, budget, checkpoints and resume).
The labelling keeps to the data budget: the held-out records always, the training records newest first until the
budget is spent, the older ones left out (``captured_unlabelled`` in the summary's data figures).

- **Held out by time and by source** (:mod:`specbuild.drafts.capture_split`): the newest records, whole template
  and near-duplicate groups only, measure the draft before and after, and are written back into their store
  (``held-out/<OUT name>.jsonl``) for ``bench`` to replay exactly them.
- **No forgetting**: a share of the training sequences (``pool_share``) are the target's answers to the original
  distillation pool (:mod:`specbuild.drafts.distill_prompts`), so kinds the traffic lacks are rehearsed (pool prompts
  of a held-out record's group are left out: the split's rules hold for them too); acceptance on bundled
  benchmark prompts (never trained on) is measured before and after.
- **The sub-vocabulary head** is ranked again from the training answers where the draft has one (or
  ``--head-vocabulary`` asks for one); the new list replaces the base's only where it covers more of the held-out
  captured answers (both coverages are reported).
- **Provenance without content**: the output carries :data:`CAPTURE_FILE` (the capture window and size, the stores'
  paths, the base draft's checksum, the held-out and bundled figures before and after), never an id or a text.

The state folder (``<OUT>.state``, owner-only) holds the captured ids while the run lasts: it is as private as the
stores, and is removed like them (the summary says so).
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.capture.records import CaptureRecord, read_file
from specbuild.checkpoint.head_vocabulary import read_head_vocabulary
from specbuild.checkpoint.tokenizer_files import folder_tokenizer_hash
from specbuild.drafts.capture_sources import (HELD_OUT_FOLDER, PRIVATE_FOLDER, CapturedTraffic, read_capture,
                                              write_held_out)
from specbuild.drafts.capture_split import CaptureSplit, apart_from, split_by_time_and_source
from specbuild.drafts.distill import (EVAL_RESERVE_SECONDS, acceptance_on, check_paths, compute_dtype, evaluate,
                                      head_vocabulary, load_target, resolve_device, save_draft, served_draft,
                                      state_dir, train)
from specbuild.drafts.distill_data import (DATA_FILE, DistillData, chat_encode, joined, label, load_data,
                                           save_data, target_answers)
from specbuild.drafts.distill_options import CaptureOptions, DraftOptions
from specbuild.drafts.distill_prompts import distillation_prompts
from specbuild.drafts.distill_training import Trainer
from specbuild.drafts.head_ranking import coverage
from specbuild.drafts.model_pairs import parameter_count
from specbuild.errors import CheckpointError
from specbuild.package.manifest import checkpoint_identity
from specbuild.runtimes.torch.threads import torch_threads
from specbuild.stages.atomic import atomic_write_bytes

if TYPE_CHECKING:
    from rich.progress import Progress
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

    from specbuild.checkpoint.head_vocabulary import HeadVocabulary

CAPTURE_FILE = "specbuild-capture.json"
PROVENANCE_FORMAT = 1
BUNDLED_FILE = "bundled.safetensors"  # the target's answers to bundled prompts, in the state folder
CAPTURE_STATE = "capture.json"  # the capture's figures (no ids), written last: the data is complete


def continue_draft(target_dir: str | Path, base_dir: str | Path, out_dir: str | Path, capture: CaptureOptions,
                   options: DraftOptions, *, resume: bool = False,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Continue the draft in ``base_dir`` for the target in ``target_dir`` on ``capture``'s stores into
    ``out_dir``; return the summary it saves (see the module docstring)."""
    import torch

    options.validate()
    capture.validate()
    started, budget = time.monotonic(), options.minutes * 60
    data_deadline = started + budget * options.data_share
    train_deadline = started + budget - min(EVAL_RESERVE_SECONDS, 0.1 * budget)
    target_dir, base_dir, out = Path(target_dir), Path(base_dir), Path(out_dir)
    work = state_dir(out)
    base = checkpoint_identity(base_dir) if (base_dir / "config.json").is_file() else None
    if base is None:
        raise CheckpointError(f"the base draft {base_dir} is not a Hugging Face checkpoint folder (no config.json)",
                              "pass the draft to continue (--base), or the release that holds it (--release)")
    checksum = folder_tokenizer_hash(target_dir)
    if folder_tokenizer_hash(base_dir) != checksum:
        raise CheckpointError(f"the base draft {base_dir} has another tokenizer than the target {target_dir}",
                              "pass the draft that serves with this target")
    # the capture is read and split before the state folder is made: a store that cannot train leaves nothing behind
    started_data = resume and (work / CAPTURE_STATE).is_file()
    traffic = None if started_data else read_capture(capture.stores, checksum)
    split = None if traffic is None else split_by_time_and_source(traffic.records, capture.held_out_share)
    check_paths(target_dir, out, work, resume, options,
                {**options.architecture(), **capture.settings(), "base_draft": base["digest"]})
    os.chmod(work, PRIVATE_FOLDER)  # it holds the captured ids
    device = resolve_device(options.device)
    with torch_threads(options.threads):
        torch.manual_seed(options.seed)
        target, tokenizer = load_target(target_dir, device)
        student, _ = load_target(base_dir, device, "draft")
        dtype = compute_dtype(options.precision, device)
        teacher = target if dtype == target.dtype else copy.deepcopy(target).to(dtype)  # fp32 needs no copy
        data, bundled, window = load_or_make_data(teacher, tokenizer, traffic, split, work, options, capture,
                                                  data_deadline, progress)
        vocab_size = int(target.config.vocab_size)
        base_vocabulary = read_head_vocabulary(base_dir, vocab_size)
        before_file = work / "before.json"
        if before_file.is_file():
            before = json.loads(before_file.read_text(encoding="utf-8"))
        else:
            before = measure(target, student, data, bundled, base_vocabulary, progress)
            atomic_write_bytes(before_file, json.dumps(before).encode("utf-8"))
        trainer = Trainer(student, data, options, dtype=dtype, frozen_head=shares_target_head(student, target),
                          teacher=teacher if options.teacher == "joint" else None, passes=capture.passes)
        del teacher
        resumed_from = train(trainer, work, resume, train_deadline, progress)
        vocabulary, head_figures = reranked_head(base_vocabulary, data, vocab_size, options)
        after = measure(target, student, data, bundled, vocabulary, progress)
    provenance = {
        "format": PROVENANCE_FORMAT, "capture": window["capture"],
        "base_draft": {"path": base["path"], "sha256": base["digest"]},
        "held_out": {**window["held_out"], "acceptance_before": before["held_out_acceptance"],
                     "acceptance_after": after["held_out_acceptance"],
                     "predicted_speedup_before": before["expected_speedup"],
                     "predicted_speedup_after": after["expected_speedup"],
                     "best_k_before": before["best_k"], "best_k_after": after["best_k"]},
        "pool": {"share": capture.pool_share, "sequences": data.figures["pool_sequences"]},
        "bundled": {"prompts": bundled.count, "acceptance_before": before["bundled_acceptance"],
                    "acceptance_after": after["bundled_acceptance"]},
        **({"head_vocabulary": head_figures} if head_figures else {}),
    }
    summary = {"target": str(target_dir), "base_draft": provenance["base_draft"], "options": asdict(trainer.options),
               "capture_options": capture.settings(), "device": str(device),
               "compute_dtype": str(dtype).removeprefix("torch."), "parameters": parameter_count(student),
               "resumed_from_step": resumed_from, "steps_done": trainer.step,
               "train_seconds": round(trainer.seconds, 1), "data": data.figures, **after,
               "before": before, "provenance": provenance, "state": str(work),
               "held_out_files": [str(write_held_out(store, out.name, list(read_file(kept))))
                                  for store, kept in held_out_in_state(work, capture)]}
    save_draft(out, student, tokenizer, vocabulary, summary, {CAPTURE_FILE: provenance})
    return summary


def shares_target_head(student: LlamaForCausalLM, target: LlamaForCausalLM) -> bool:
    """Whether the draft reads the target's own output head (``specbuild draft`` at the target's width): then it
    keeps it frozen and learns the target's final hidden state too, as it was made."""
    import torch

    return (student.config.hidden_size == target.config.hidden_size
            and torch.equal(student.lm_head.weight, target.lm_head.weight))


# --- data ------------------------------------------------------------------------------------------------
def load_or_make_data(teacher: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase,
                      traffic: CapturedTraffic | None, split: CaptureSplit | None, work: Path, options: DraftOptions,
                      capture: CaptureOptions, deadline: float,
                      progress: Progress | None) -> tuple[DistillData, DistillData, dict[str, Any]]:
    """The training data (held-out captured records first, then the training records newest first, as many as the
    data ``deadline`` let the target label, then the pool's answers in proportion to those), the target's answers to
    bundled prompts, and the capture's figures; made once from ``traffic`` and its ``split`` and kept in ``work``
    (they are None when it holds them), so a resumed run trains on the data it started with even if the stores
    have grown since."""
    if traffic is None or split is None:
        window = json.loads((work / CAPTURE_STATE).read_text(encoding="utf-8"))
        data = load_data(work / DATA_FILE, window["held_out"]["records"])
        bundled = load_data(work / BUNDLED_FILE, 0)
        if data is None or bundled is None:
            raise CheckpointError(f"{work} lacks the data its {CAPTURE_STATE} describes",
                                  f"remove {work} and run again without --resume")
        return data, bundled, window
    started = time.monotonic()
    def sequences(indices: tuple[int, ...]) -> list[tuple[list[int], int]]:
        return [(list(record.prompt_ids + record.output_ids), len(record.prompt_ids))
                for record in (traffic.records[index] for index in indices)]

    held_out, training = sequences(split.held_out), sequences(split.train[::-1])  # training records newest first
    top_k = options.top_k if options.teacher == "labels" else None
    bundled_answers = target_answers(teacher, tokenizer, chat_encode(tokenizer, bundled_texts(capture.bundled_prompts)),
                                     replace(options, held_out=capture.bundled_prompts), deadline, progress)
    # the traffic first: the held-out records always (they measure), the training ones while the budget lasts (a
    # teacher-forced pass is cheap); then the pool in proportion to the traffic labelled (generating its answers is
    # not: it stops at the deadline)
    data = label(teacher, held_out + training, top_k, progress, deadline=deadline, needed=len(held_out))
    data.held_out = len(held_out)
    trained = data.count - len(held_out)
    pool_count = min(options.prompts, math.ceil(trained * capture.pool_share / (1 - capture.pool_share)))
    candidates = chat_encode(tokenizer, distillation_prompts(pool_count, options.seed)) if pool_count else []
    kept = apart_from([traffic.records[index].prompt_ids for index in split.held_out], candidates)
    pool_prompts = [candidates[index] for index in kept]
    pool = target_answers(teacher, tokenizer, pool_prompts, replace(options, held_out=0), deadline,
                          progress) if pool_prompts and time.monotonic() < deadline else []  # none past the budget
    if pool:
        data = joined(data, label(teacher, pool, top_k, progress))
    data.figures.update(captured_sequences=len(held_out) + trained, captured_unlabelled=len(training) - trained,
                        pool_sequences=len(pool), pool_prompts_like_held_out=len(candidates) - len(pool_prompts),
                        generate_seconds=round(time.monotonic() - started, 1))
    bundled = label(teacher, bundled_answers, None, None)
    for index in sorted({traffic.stores[i] for i in split.held_out}):
        write_held_out(work, str(index), [traffic.records[i] for i in split.held_out if traffic.stores[i] == index])
    window = capture_window(traffic, split.held_out, split.groups, capture)
    save_data(data, work / DATA_FILE)
    save_data(bundled, work / BUNDLED_FILE)
    atomic_write_bytes(work / CAPTURE_STATE, json.dumps(window).encode("utf-8"))
    return data, bundled, window


def capture_window(traffic: CapturedTraffic, held_out: tuple[int, ...], groups: int,
                   capture: CaptureOptions) -> dict[str, Any]:
    """What the provenance says of the capture and its held-out part: times, counts and sizes, no content."""
    def span(records: list[CaptureRecord]) -> dict[str, str]:
        times = [record.finished_at for record in records]
        return {"first_finished_at": timestamp(min(times)), "last_finished_at": timestamp(max(times))}

    return {"capture": {**span(list(traffic.records)), "records": len(traffic.records), "bytes": traffic.bytes,
                        "stores": [str(store.resolve()) for store in capture.stores], "groups": groups,
                        "other_tokenizers": traffic.other_tokenizers, "without_answer": traffic.without_answer},
            "held_out": {**span([traffic.records[i] for i in held_out]), "records": len(held_out),
                         "share": capture.held_out_share}}


def timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def held_out_in_state(work: Path, capture: CaptureOptions) -> list[tuple[Path, Path]]:
    """(store, its held-out records kept in the state folder) for each store that has some."""
    return [(store, work / HELD_OUT_FOLDER / f"{index}.jsonl") for index, store in enumerate(capture.stores)
            if (work / HELD_OUT_FOLDER / f"{index}.jsonl").is_file()]


def bundled_texts(count: int) -> list[str]:
    """``count`` bundled benchmark prompts spread evenly over the file (so over its categories)."""
    from specbuild.drafts.held_out import benchmark_texts

    texts = benchmark_texts()["general"]
    return texts[::max(1, len(texts) // count)][:count]


# --- measuring -------------------------------------------------------------------------------------------
def measure(target: LlamaForCausalLM, student: LlamaForCausalLM, data: DistillData, bundled: DistillData,
            vocabulary: HeadVocabulary | None, progress: Progress | None) -> dict[str, Any]:
    """:func:`~specbuild.drafts.distill.evaluate` on the held-out captured records, and acceptance on the bundled
    prompts' answers, with the draft served as it would be (its head vocabulary, where it has one)."""
    figures = evaluate(target, student, data, progress, vocabulary)
    _, logits = served_draft(student, vocabulary, int(target.config.vocab_size))
    figures["bundled_acceptance"] = acceptance_on(logits, bundled, range(bundled.count), progress,
                                                  "draft: bundled prompts' acceptance")
    return figures


def reranked_head(base: HeadVocabulary | None, data: DistillData, vocab_size: int,
                  options: DraftOptions) -> tuple[HeadVocabulary | None, dict[str, Any]]:
    """The head vocabulary the continued draft keeps, and its held-out coverage before and after ranking again.

    Ranked from the training answers (captured and pool) at the base's size (or ``--head-vocabulary``'s); the
    base's list stays where the new one covers no more of the held-out captured answers at the same size."""
    size = options.head_vocabulary or (base.size if base is not None else None)
    if size is None:
        return None, {}
    ranked = head_vocabulary(data, vocab_size, replace(options, head_vocabulary=size))
    held_out = data.answers(range(data.held_out))
    comparable = base if base is not None and base.size == size else None
    before = coverage(comparable, held_out) if comparable is not None else None
    after = ranked.provenance["held_out_coverage"]
    if comparable is not None and before is not None and after <= before:
        training = data.answers(range(data.held_out, data.count))
        chosen = replace(comparable, provenance={**comparable.provenance, "coverage": coverage(comparable, training),
                                           "held_out_coverage": before})
    else:
        chosen = ranked
    return chosen, {"size": size, "held_out_coverage_before": before, "held_out_coverage_after": after,
                    "reranked": chosen is ranked}
