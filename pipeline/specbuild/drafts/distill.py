"""``specbuild draft``: make a small, fast draft for a target by knowledge distillation.

Recipe (chosen by measured cost on a 2-core CPU; see docs/benchmarks.md):

1. **Data the target produces itself.** The target answers locally composed prompts
   (:mod:`specbuild.drafts.distill_prompts`, never the benchmark set) greedily: that is exactly the text a greedy
   draft must predict while its tokens are being accepted. One teacher-forced pass over each answer keeps
   the target's top-k next-token log-probabilities and its final (normed) hidden state at every position.
2. **A draft initialised from the target.** A standard Llama causal LM with the target's tokenizer and
   vocabulary ids. At the target's hidden size it copies the embeddings, final norm and output head (all
   frozen) and ``layers`` decoder layers spread over the target's depth (first and last for 2): the draft
   learns to produce hidden states the target's own head reads. At a smaller hidden size the embeddings
   (and the tied head) start from the target's principal components and the layers from scratch.
3. **Distillation.** Cross-entropy against the target's top-k distribution (forward KL on the mass that
   matters), plus, at the target's hidden size, a regression on its final hidden state. The softmax is
   taken over the tokens that ever appear in the target's top-k (a reduced output vocabulary for training
   only: the saved head keeps every vocabulary id). Prompt positions count with a small weight, answer
   positions fully.

On CPUs with bfloat16 matrix units (Intel AMX, AVX512-BF16) the target's answers, their labels and the
training matmuls run in bfloat16 (``precision="auto"``): 4-6x the float32 throughput on such a CPU, so the
same budget buys that much more data. The saved draft and the acceptance summary stay float32.

The same code runs on a CUDA GPU (``device``; ``auto`` takes one when there is one, in bfloat16 where it
supports it): only the device and dtype differ, so the CPU tests cover it. Two options follow the recipe
that reached 0.42-0.53 held-out agreement for SmolLM2-135M on an H200 (docs/benchmarks.md), worth their
cost where compute is plentiful:

- ``answers="greedy+sampled"``: after the greedy answers, the target answers the training prompts again
  by sampling (temperature ``sample_temperature``): more, and more varied, text of the target's own;
- ``teacher="joint"``: no stored top-k labels; the target runs inside every training step and the loss is
  the KL divergence from its full-vocabulary distribution (plus the same hidden-state regression).

Everything runs under a hard wall-clock budget with periodic checkpoints in ``<OUT>.state/`` (outside the
checkpoint folder, so ``specbuild compile`` never sees it) and ``resume``. Seeds fix the prompts, the
batch order and the initialisation. The summary reports held-out greedy acceptance at K=1..4 (answers to
prompts never trained on), measured step costs and the expected speedup with the measured verification
cost V(K).

Step 1 lives in :mod:`specbuild.drafts.distill_data`, steps 2 and 3 in :mod:`specbuild.drafts.distill_training`;
this module holds the options, the run and its held-out evaluation.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specbuild.checkpoint.json_files import MAX_CONFIG_JSON, read_json
from specbuild.bench.acceptance import acceptance_by_k, model_logits, sequence_matches
from specbuild.bench.estimate import COST_REPEATS, measure_step_costs, predicted_speedups
from specbuild.drafts.distill_data import DistillData, load_or_make_data
from specbuild.drafts.distill_options import DraftOptions
from specbuild.drafts.distill_training import Trainer, student_from_target
from specbuild.drafts.head_ranking import coverage, rank_head_vocabulary
from specbuild.drafts.model_pairs import folder_bytes, parameter_count, save_checkpoint
from specbuild.errors import CheckpointError, UsageError
from specbuild.runtimes.torch.threads import torch_threads
from specbuild.stages.atomic import atomic_output_dir, atomic_write_bytes
from specbuild.terminal import stage

if TYPE_CHECKING:
    import torch
    from specbuild.checkpoint.head_vocabulary import HeadVocabulary
    from rich.progress import Progress
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

SUMMARY_FILE = "specbuild-draft.json"
TRAIN_FILE = "train.pt"
MAX_K = 4
EVAL_RESERVE_SECONDS = 60
def state_dir(out_dir: str | Path) -> Path:
    """Where checkpoints and data live: ``<OUT>.state`` next to the output checkpoint."""
    out = Path(out_dir)
    return out.with_name(out.name + ".state")


def make_draft(target_dir: str | Path, out_dir: str | Path, options: DraftOptions = DraftOptions(), *,
               resume: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """Distil a draft for the checkpoint in ``target_dir`` into ``out_dir``; return the summary it saves.

    ``resume`` continues from ``<out_dir>.state`` (data and the last checkpoint); without it an existing
    state folder is refused rather than overwritten.
    """
    import torch

    options.validate()
    started, budget = time.monotonic(), options.minutes * 60
    data_deadline = started + budget * options.data_share
    train_deadline = started + budget - min(EVAL_RESERVE_SECONDS, 0.1 * budget)  # leave time for the summary
    out, work = Path(out_dir), state_dir(out_dir)
    check_paths(Path(target_dir), out, work, resume, options)
    device = resolve_device(options.device)
    with torch_threads(options.threads):
        torch.manual_seed(options.seed)
        target, tokenizer = load_target(Path(target_dir), device)
        dtype = compute_dtype(options.precision, device)
        teacher = target if dtype == target.dtype else copy.deepcopy(target).to(dtype)  # fp32 needs no copy
        data = load_or_make_data(teacher, tokenizer, work, options, data_deadline, progress)
        student, copied = student_from_target(target, options.layers, options.hidden)
        trainer = Trainer(student.to(device), data, options, dtype=dtype,
                          frozen_head=options.hidden in (None, target.config.hidden_size),
                          teacher=teacher if options.teacher == "joint" else None)
        del teacher  # a labels teacher's bfloat16 copy is not needed any more
        resumed_from = train(trainer, work, resume, train_deadline, progress)
        vocabulary = head_vocabulary(data, int(target.config.vocab_size), options)
        figures = evaluate(target, student, data, progress, vocabulary)
    summary = {
        "target": str(target_dir), "options": asdict(options), "device": str(device),
        "compute_dtype": str(dtype).removeprefix("torch."),
        "copied_layers": copied,
        "parameters": parameter_count(student), "resumed_from_step": resumed_from, "steps_done": trainer.step,
        "train_seconds": round(trainer.seconds, 1), "data": data.figures, **figures,
    }
    save_draft(out, student, tokenizer, vocabulary, summary)
    return summary


def train(trainer: Trainer, work: Path, resume: bool, deadline: float, progress: Progress | None) -> int:
    """Run ``trainer`` until its steps or ``deadline``, from the state folder's last checkpoint with ``resume``;
    return the step it started from."""
    if resume and (work / TRAIN_FILE).is_file():
        trainer.load(work / TRAIN_FILE)
    resumed_from = trainer.step
    trainer.run(deadline, work / TRAIN_FILE, progress)
    return resumed_from


def save_draft(out: Path, student: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase,
               vocabulary: HeadVocabulary | None, summary: dict[str, Any],
               documents: dict[str, dict[str, Any]] | None = None) -> None:
    """The draft checkpoint, its head vocabulary, its summary (``bytes`` added) and any other JSON ``documents``
    by file name, written into ``out`` at once."""
    with atomic_output_dir(out) as scratch:
        save_checkpoint(student.cpu(), tokenizer, scratch)
        if vocabulary is not None:
            vocabulary.write(scratch)
        summary["bytes"] = folder_bytes(scratch)
        for name, document in {SUMMARY_FILE: summary, **(documents or {})}.items():
            (scratch / name).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def check_paths(target: Path, out: Path, work: Path, resume: bool, options: DraftOptions,
                settings: dict[str, Any] | None = None) -> None:
    """Refuse an output that is not ours or an earlier run continued with other ``settings`` (by default the
    options' :meth:`~DraftOptions.architecture`), and record them in the state folder ``work``."""
    settings = options.architecture() if settings is None else settings
    if not (target / "config.json").is_file():
        raise CheckpointError(f"{target} is not a Hugging Face checkpoint folder (no config.json)",
                              "pass the target's checkpoint folder")
    vocab_size = read_json(target / "config.json", MAX_CONFIG_JSON).get("vocab_size")
    if options.head_vocabulary is not None and isinstance(vocab_size, int) and options.head_vocabulary >= vocab_size:
        raise UsageError(f"--head-vocabulary {options.head_vocabulary} is not below the target's vocabulary "
                         f"({vocab_size} ids)", "pass a smaller size, or leave it out for the full head")
    if out.resolve() == target.resolve() or target.resolve() in out.resolve().parents:
        raise UsageError(f"output {out} would overwrite or nest inside the target", "choose a folder outside it")
    if out.exists() and any(out.iterdir()) and not (out / SUMMARY_FILE).is_file():
        raise UsageError(f"{out} exists and is not a specbuild draft", "choose an empty or new folder")
    recorded = work / "options.json"
    if work.exists() and not resume:
        raise UsageError(f"{work} holds an earlier run", "pass --resume to continue it, or remove the folder")
    if resume and recorded.is_file():  # settings added since that run was made have their defaults there
        previous = {**DraftOptions().architecture(), **json.loads(recorded.read_text(encoding="utf-8"))}
        if previous != settings:
            changed = sorted(key for key in previous.keys() | settings.keys()
                             if previous.get(key) != settings.get(key))
            raise UsageError(f"--resume with different settings than the saved run: {', '.join(changed)}",
                             f"repeat the earlier settings, or remove {work} to start over")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(recorded, json.dumps(settings, indent=2).encode("utf-8"))


def load_target(folder: Path, device: torch.device,
                role: str = "target") -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """The ``role``'s checkpoint (a Llama: drafts copy the target's layers and are Llamas) in float32, and its
    tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot load the {role} {folder}: {exc}",
                              "pass a safetensors Hugging Face checkpoint with its tokenizer") from exc
    if model.config.model_type != "llama":
        raise CheckpointError(f"specbuild draft makes Llama drafts, and copies layers from the target, but the {role} "
                              f"is {model.config.model_type!r}", f"use a Llama-architecture {role}")
    return model.float().to(device).eval(), tokenizer


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda``, or for ``auto`` CUDA when a GPU is visible; a clear error for ``cuda`` without one."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch sees no CUDA GPU",
                         "use --device cpu (or auto), or install a CUDA build of torch on a GPU machine")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def compute_dtype(precision: str, device: torch.device | None = None) -> torch.dtype:
    """The dtype for the target's answers, labels and training matmuls (see the module docstring)."""
    import torch

    if precision == "auto":
        if device is not None and device.type == "cuda":
            fast_bf16 = torch.cuda.is_bf16_supported()
        else:
            fast_bf16 = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
        return torch.bfloat16 if fast_bf16 else torch.float32
    return torch.bfloat16 if precision == "bfloat16" else torch.float32


def head_vocabulary(data: DistillData, vocab_size: int, options: DraftOptions) -> HeadVocabulary | None:
    """The sub-vocabulary head ``options.head_vocabulary`` asks for, ranked from the training answers only (the
    held-out ones measure it)."""
    if options.head_vocabulary is None:
        return None
    answers = data.answers(range(data.held_out, data.count))
    vocabulary = rank_head_vocabulary(answers, vocab_size, options.head_vocabulary, {
        "ranked_from": "the target's answers that specbuild draft distilled from", "seed": options.seed})
    held_out = coverage(vocabulary, data.answers(range(data.held_out)))
    return replace(vocabulary, provenance={**vocabulary.provenance, "held_out_coverage": held_out})


# --- evaluation ------------------------------------------------------------------------------------------
def evaluate(target: LlamaForCausalLM, student: LlamaForCausalLM, data: DistillData, progress: Progress | None,
             vocabulary: HeadVocabulary | None = None) -> dict[str, Any]:
    """Held-out greedy acceptance at K=1..4, step costs, V(K) and the expected speedup per K, all with the
    sub-vocabulary head where there is one (as the torch engine serves it)."""
    served, logits = served_draft(student, vocabulary, int(target.config.vocab_size))
    acceptance = acceptance_on(logits, data, range(data.held_out), progress, "draft: held-out acceptance")
    with stage(progress, "draft: step costs", COST_REPEATS) as advance:
        costs = measure_step_costs(target, served, MAX_K, advance=advance)
    expected = {str(k): round(speedup, 3) for k, speedup in predicted_speedups(acceptance, costs).items()}
    best = max(expected, key=lambda k: expected[k])
    head_figures = {} if vocabulary is None else {"head_vocabulary": {**vocabulary.summary(), **{
        key: vocabulary.provenance[key] for key in ("coverage", "held_out_coverage")}}}
    return {"held_out_acceptance": acceptance, **head_figures, "target_step_ms": round(costs.target_step_ms, 2),
            "draft_step_ms": round(costs.draft_step_ms, 2), "cost_ratio": round(costs.cost_ratio, 3),
            "verify_cost": {str(k): round(v, 3) for k, v in costs.verify_cost.items()}, "expected_speedup": expected,
            "best_k": int(best)}


def served_draft(student: LlamaForCausalLM, vocabulary: HeadVocabulary | None, vocab_size: int
                 ) -> tuple[LlamaForCausalLM, Callable[[torch.Tensor], torch.Tensor]]:
    """The draft as the torch engine serves it (a copy with its sub-vocabulary head, where it has one: the student
    itself is left as it is) and its vocabulary-wide logits for one sequence."""
    from specbuild.runtimes.torch.engine import SubVocabularyHead

    if vocabulary is None:
        return student, model_logits(student)
    served = copy.deepcopy(student)
    head = SubVocabularyHead(served, vocabulary, vocab_size)
    forward = model_logits(served)
    return served, lambda sequence: head.scatter(forward(sequence))


def acceptance_on(logits: Callable[[torch.Tensor], torch.Tensor], data: DistillData, indices: range,
                  progress: Progress | None, description: str) -> dict[str, float]:
    """Greedy acceptance at K=1..:data:`MAX_K` on the given sequences of ``data`` (their answers are the target's)."""
    with stage(progress, description, len(indices)) as advance:
        rows = ((data.ids[start:end], prompt_len) for start, end, prompt_len in data.rows(indices))
        return acceptance_by_k(sequence_matches(logits, rows, advance), MAX_K)
