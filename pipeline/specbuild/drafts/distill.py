"""``specbuild draft``: make a small, fast draft for a target by knowledge distillation.

Recipe (chosen by measured cost on a 2-core CPU; see docs/benchmarks.md):

1. **Data the target produces itself.** The target answers locally composed prompts
   (:mod:`specbuild.drafts.prompts`, never the benchmark set) greedily: that is exactly the text a greedy
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
"""

from __future__ import annotations

import copy
import io
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.bench.estimate import COST_REPEATS, measure_step_costs, predicted_speedups
from specbuild.build.atomic import atomic_output_dir, atomic_write_bytes
from specbuild.errors import CheckpointError, UsageError
from specbuild.drafts.model_pairs import acceptance_by_k, draft_matches, folder_bytes, parameter_count, save_checkpoint, stage, torch_threads

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

SUMMARY_FILE = "specbuild-draft.json"
DATA_FILE, TRAIN_FILE = "data.safetensors", "train.pt"
PROMPT_WEIGHT = 0.2  # prompt positions teach the draft too, but only answer positions are ever drafted
HIDDEN_WEIGHT = 1.0
WARMUP_SHARE, FINAL_LR_SHARE = 0.05, 0.1
MAX_K = 4
EVAL_RESERVE_SECONDS = 60
PRECISIONS = ("auto", "float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ANSWERS = ("greedy", "greedy+sampled")
TEACHERS = ("labels", "joint")
LABEL_BATCH_TOKENS = 4096


@dataclass(frozen=True)
class DraftOptions:
    """How to make the draft. ``steps`` sets the schedule's length; ``minutes`` stops the run earlier."""

    layers: int = 2
    hidden: int | None = None  # None: the target's hidden size (layers copied from the target)
    minutes: float = 30.0
    steps: int = 1500
    prompts: int = 1200
    held_out: int = 48  # prompts kept out of training, for the acceptance summary
    max_new_tokens: int = 96
    data_share: float = 0.4  # at most this share of the budget goes to the target's answers
    generate_batch: int = 32
    batch_tokens: int = 2048
    learning_rate: float = 1e-3
    top_k: int = 32
    seed: int = 0
    checkpoint_every: int = 100
    threads: int = 2
    precision: str = "auto"  # "auto": bfloat16 where the CPU has bfloat16 matrix units, else float32
    device: str = "auto"  # "auto": CUDA when there is a GPU, else the CPU
    answers: str = "greedy"  # "greedy+sampled": a sampled answer to every training prompt as well
    sample_temperature: float = 0.7
    teacher: str = "labels"  # "joint": the target's full distribution computed in each training step

    def validate(self) -> None:
        checks = [(self.layers >= 1, "--layers must be at least 1"), (self.minutes > 0, "--minutes must be > 0"),
                  (self.steps >= 1, "--steps must be at least 1"), (self.prompts > self.held_out >= 1,
                  "prompts must outnumber the held-out prompts (at least 1)"),
                  (0 < self.data_share < 1, "data_share must be between 0 and 1"),
                  (self.hidden is None or self.hidden >= 1, "--hidden must be positive"),
                  (self.precision in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)}"),
                  (self.device in DEVICES, f"--device must be one of {', '.join(DEVICES)}"),
                  (self.answers in ANSWERS, f"--answers must be one of {', '.join(ANSWERS)}"),
                  (self.sample_temperature > 0, "the sampling temperature must be > 0"),
                  (self.teacher in TEACHERS, f"--teacher must be one of {', '.join(TEACHERS)}")]
        for ok, message in checks:
            if not ok:
                raise UsageError(message, "see `specbuild draft --help`")

    def architecture(self) -> dict[str, Any]:
        """The settings a resumed run must share with the run it continues (``steps`` may grow to train on)."""
        return {key: getattr(self, key) for key in ("layers", "hidden", "prompts", "held_out", "max_new_tokens",
                                                    "top_k", "seed", "batch_tokens", "learning_rate", "answers",
                                                    "sample_temperature", "teacher")}


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
    _check_paths(Path(target_dir), out, work, resume, options)
    device = resolve_device(options.device)
    with torch_threads(options.threads):
        torch.manual_seed(options.seed)
        target, tokenizer = _load_target(Path(target_dir), device)
        dtype = compute_dtype(options.precision, device)
        teacher = target if dtype == target.dtype else copy.deepcopy(target).to(dtype)  # fp32 needs no copy
        data = _load_or_make_data(teacher, tokenizer, work, options, data_deadline, progress)
        student, copied = student_from_target(target, options.layers, options.hidden)
        trainer = Trainer(student.to(device), data, options, dtype=dtype,
                          frozen_head=options.hidden in (None, target.config.hidden_size),
                          teacher=teacher if options.teacher == "joint" else None)
        del teacher  # a labels teacher's bfloat16 copy is not needed any more
        if resume and (work / TRAIN_FILE).is_file():
            trainer.load(work / TRAIN_FILE)
        resumed_from = trainer.step
        trainer.run(train_deadline, work / TRAIN_FILE, progress)
        figures = evaluate(target, student, data, progress)
    summary = {
        "target": str(target_dir), "options": asdict(options), "device": str(device),
        "compute_dtype": str(dtype).removeprefix("torch."),
        "copied_layers": copied,
        "parameters": parameter_count(student), "resumed_from_step": resumed_from, "steps_done": trainer.step,
        "train_seconds": round(trainer.seconds, 1), "data": data.figures, **figures,
    }
    with atomic_output_dir(out) as scratch:
        save_checkpoint(student.cpu(), tokenizer, scratch)
        summary["bytes"] = folder_bytes(scratch)
        (scratch / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _check_paths(target: Path, out: Path, work: Path, resume: bool, options: DraftOptions) -> None:
    if not (target / "config.json").is_file():
        raise CheckpointError(f"{target} is not a Hugging Face checkpoint folder (no config.json)",
                              "pass the target's checkpoint folder")
    if out.resolve() == target.resolve() or target.resolve() in out.resolve().parents:
        raise UsageError(f"output {out} would overwrite or nest inside the target", "choose a folder outside it")
    if out.exists() and any(out.iterdir()) and not (out / SUMMARY_FILE).is_file():
        raise UsageError(f"{out} exists and is not a specbuild draft", "choose an empty or new folder")
    recorded = work / "options.json"
    if work.exists() and not resume:
        raise UsageError(f"{work} holds an earlier run", "pass --resume to continue it, or remove the folder")
    if resume and recorded.is_file():  # settings added since that run was made have their defaults there
        previous = {**DraftOptions().architecture(), **json.loads(recorded.read_text(encoding="utf-8"))}
        if previous != options.architecture():
            changed = sorted(key for key in previous if previous.get(key) != options.architecture().get(key))
            raise UsageError(f"--resume with different settings than the saved run: {', '.join(changed)}",
                             f"repeat the earlier settings, or remove {work} to start over")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(recorded, json.dumps(options.architecture(), indent=2).encode("utf-8"))


def _load_target(folder: Path, device: torch.device) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot load the target {folder}: {exc}",
                              "pass a safetensors Hugging Face checkpoint with its tokenizer") from exc
    if model.config.model_type != "llama":
        raise CheckpointError(f"specbuild draft makes Llama drafts, and copies layers from the target, but the target "
                              f"is {model.config.model_type!r}", "use a Llama-architecture target")
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


# --- data ------------------------------------------------------------------------------------------------
@dataclass
class DistillData:
    """Every sequence (prompt + one of the target's answers) as one flat stream, with the target's labels.

    ``offsets[i]:offsets[i+1]`` is sequence i, the held-out ones first; ``top_ids``/``top_logp`` hold the
    target's top-k next-token ids and log-probabilities at each position, ``hidden`` its final normed hidden
    state (fp16). A joint teacher needs no labels: they are None then.
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    prompt_lens: torch.Tensor
    held_out: int
    figures: dict[str, Any]
    top_ids: torch.Tensor | None = None
    top_logp: torch.Tensor | None = None
    hidden: torch.Tensor | None = None

    def rows(self, indices: range) -> list[tuple[int, int, int]]:
        """(start, end, prompt length) of the given sequences."""
        return [(int(self.offsets[i]), int(self.offsets[i + 1]), int(self.prompt_lens[i])) for i in indices]

    @property
    def count(self) -> int:
        return len(self.prompt_lens)


def _load_or_make_data(teacher: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, work: Path,
                       options: DraftOptions, deadline: float, progress: Progress | None) -> DistillData:
    """The target's answers (and, for a ``labels`` teacher, their labels), made once and kept in ``work``."""
    from safetensors.torch import load, save

    path = work / DATA_FILE
    if path.is_file():
        tensors = load(path.read_bytes())
        figures = json.loads((work / "data.json").read_text(encoding="utf-8"))
        return DistillData(**tensors, held_out=options.held_out, figures=figures)
    started = time.monotonic()
    prompts = encode_prompts(tokenizer, options)
    sampled = options.answers == "greedy+sampled"
    greedy_deadline = started + (deadline - started) / 2 if sampled else deadline  # an even split of the time
    sequences = target_answers(teacher, tokenizer, prompts, options, greedy_deadline, progress)
    if len(sequences) <= options.held_out:
        raise UsageError(f"the data budget produced only {len(sequences)} answers, fewer than the {options.held_out} "
                         "held out", "give the run more --minutes")
    greedy_count = len(sequences)
    if sampled:  # the prompts answered greedily, held-out ones excepted, answered again by sampling
        sequences += target_answers(teacher, tokenizer, prompts[options.held_out:greedy_count], options, deadline,
                                    progress, temperature=options.sample_temperature)
    data = label(teacher, sequences, options.top_k if options.teacher == "labels" else None, progress)
    data.held_out = options.held_out
    data.figures.update(generate_seconds=round(time.monotonic() - started, 1), greedy_answers=greedy_count,
                        sampled_answers=len(sequences) - greedy_count)
    tensors = {name: getattr(data, name).contiguous() for name in
               ("ids", "offsets", "prompt_lens", "top_ids", "top_logp", "hidden") if getattr(data, name) is not None}
    atomic_write_bytes(path, save(tensors))
    atomic_write_bytes(work / "data.json", json.dumps(data.figures).encode("utf-8"))
    return data


def encode_prompts(tokenizer: PreTrainedTokenizerBase, options: DraftOptions) -> list[list[int]]:
    """The distillation prompts, held-out ones first, in the target's chat template when it has one."""
    from specbuild.drafts.prompts import distillation_prompts
    from specbuild.bench.prompts import load_prompts

    benchmark = frozenset(prompt.prompt for prompt in load_prompts())
    texts = distillation_prompts(options.prompts, options.seed, exclude=benchmark)
    if not getattr(tokenizer, "chat_template", None):
        return [tokenizer(text)["input_ids"] for text in texts]
    rendered = (tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True) for text in texts)
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]


def target_answers(target: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]],
                   options: DraftOptions, deadline: float, progress: Progress | None, *,
                   temperature: float | None = None) -> list[tuple[list[int], int]]:
    """The target's greedy answers (sampled ones at ``temperature``, no top-k or top-p cut), batched
    (left-padded) on the target's device, until the prompts or the data budget run out.

    Returns (prompt + answer, prompt length) per prompt, each answer cut after its first end-of-sequence.
    The budget never stops the greedy pass before it has the held-out answers.
    """
    import torch

    sampling = ({"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature else
                {"do_sample": False, "temperature": None, "top_p": None, "top_k": None})
    needed = 0 if temperature else options.held_out
    device = target.device

    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids), 0)
    sequences: list[tuple[list[int], int]] = []
    description = f"draft: target answers prompts ({'sampled' if temperature else 'greedy'})"
    with stage(progress, description, len(prompts)) as advance, torch.no_grad():
        for first in range(0, len(prompts), options.generate_batch):
            if time.monotonic() > deadline and len(sequences) > needed:
                break
            batch = prompts[first:first + options.generate_batch]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
            out = target.generate(ids, attention_mask=mask, max_new_tokens=options.max_new_tokens,
                                  pad_token_id=pad, **sampling)
            for prompt, row in zip(batch, out[:, width:].tolist()):
                answer = next((row[:i + 1] for i, token in enumerate(row) if token in eos_ids), row)
                sequences.append((prompt + answer, len(prompt)))
            advance(len(batch))
    return sequences


def label(target: LlamaForCausalLM, sequences: list[tuple[list[int], int]], top_k: int | None,
          progress: Progress | None) -> DistillData:
    """Teacher-forced target passes (sequences of similar length batched, right-padded: causal attention
    never lets a real position see padding) keeping top-k log-probabilities and final hidden states
    (on the CPU); ``top_k=None`` keeps the sequences only (a joint teacher labels them while training)."""
    import torch

    lengths = torch.tensor([0] + [len(sequence) for sequence, _ in sequences])
    data = DistillData(
        ids=torch.tensor([token for sequence, _ in sequences for token in sequence]),
        offsets=lengths.cumsum(0), prompt_lens=torch.tensor([length for _, length in sequences]), held_out=0,
        figures={"sequences": len(sequences), "tokens": int(lengths.sum()),
                 "answer_tokens": sum(len(s) - p for s, p in sequences)})
    if top_k is None:
        return data
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    top_ids: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    top_logp, hidden = list(top_ids), list(top_ids)
    with stage(progress, "draft: label with the target", len(sequences)) as advance, torch.no_grad():
        first = 0
        while first < len(order):
            last = first + 1
            while last < len(order) and (last - first + 1) * len(sequences[order[last]][0]) <= LABEL_BATCH_TOKENS:
                last += 1
            batch = order[first:last]
            width = len(sequences[batch[-1]][0])
            ids = torch.tensor([sequences[i][0] + [0] * (width - len(sequences[i][0])) for i in batch],
                               device=target.device)
            states = target.model(input_ids=ids).last_hidden_state
            values, indices = target.lm_head(states).float().log_softmax(-1).topk(top_k, dim=-1)
            for row, i in enumerate(batch):
                length = len(sequences[i][0])
                top_ids[i], top_logp[i] = indices[row, :length].int().cpu(), values[row, :length].cpu()
                hidden[i] = states[row, :length].half().cpu()
            advance(len(batch))
            first = last
    data.top_ids, data.top_logp, data.hidden = torch.cat(top_ids), torch.cat(top_logp), torch.cat(hidden)
    return data


# --- the draft -------------------------------------------------------------------------------------------
def spread_layers(count: int, depth: int) -> list[int]:
    """``count`` layer indices spread over ``depth`` layers, first and last included (first only for 1)."""
    if count > depth:
        raise UsageError(f"--layers {count} exceeds the target's {depth} layers", f"use at most {depth}")
    if count == 1:
        return [0]
    return [round(i * (depth - 1) / (count - 1)) for i in range(count)]


def student_from_target(target: LlamaForCausalLM, layers: int,
                        hidden: int | None = None) -> tuple[LlamaForCausalLM, list[int]]:
    """A Llama draft with the target's vocabulary, initialised from the target (see the module docstring),
    and the target layers it copied."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = target.config
    settings = {key: value for key, value in source.to_dict().items()
                if key not in ("_name_or_path", "architectures", "layer_types", "transformers_version")}
    settings["num_hidden_layers"] = layers
    copy_layers = hidden is None or hidden == source.hidden_size
    chosen = spread_layers(layers, source.num_hidden_layers) if copy_layers else []
    if not copy_layers:
        head_dim = getattr(source, "head_dim", None) or source.hidden_size // source.num_attention_heads
        if hidden % head_dim:
            raise UsageError(f"--hidden {hidden} is not a multiple of the target's head size {head_dim}",
                             f"use a multiple of {head_dim}, or omit --hidden to copy the target's layers")
        heads = hidden // head_dim
        settings.update(hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim,
                        num_key_value_heads=math.gcd(heads, source.num_key_value_heads),
                        intermediate_size=round(hidden * source.intermediate_size / source.hidden_size),
                        tie_word_embeddings=True)
    if getattr(source, "layer_types", None) and copy_layers:
        settings["layer_types"] = [source.layer_types[i] for i in chosen]
    student = LlamaForCausalLM(LlamaConfig(**settings))
    with torch.no_grad():
        if copy_layers:
            student.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
            student.lm_head.weight.copy_(target.lm_head.weight)
            student.model.norm.weight.copy_(target.model.norm.weight)
            for mine, theirs in zip(student.model.layers, chosen):
                mine.load_state_dict(target.model.layers[theirs].state_dict())
        else:  # the embeddings' top principal directions keep as much of the target's geometry as fits
            embeddings = target.model.embed_tokens.weight
            basis = torch.linalg.svd(embeddings - embeddings.mean(0), full_matrices=False).Vh[:hidden].T
            student.model.embed_tokens.weight.copy_(embeddings @ basis)
    student.generation_config = target.generation_config
    return student, chosen


# --- training --------------------------------------------------------------------------------------------
def learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of ``steps``, then cosine decay to 10% of ``peak``."""
    warmup = max(1, round(steps * WARMUP_SHARE))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (FINAL_LR_SHARE + (1 - FINAL_LR_SHARE) * 0.5 * (1 + math.cos(math.pi * progress)))


class Trainer:
    """Distillation steps over :class:`DistillData` with a cosine schedule, checkpoints and resume.

    The teacher's view of each position comes from the stored labels (top-k cross-entropy over the tokens
    the target ever ranks in its top-k), or with a ``teacher`` model from that model, run in the step
    (KL divergence from its full-vocabulary distribution). Batches are moved to the student's device.
    """

    def __init__(self, student: LlamaForCausalLM, data: DistillData, options: DraftOptions, *,
                 frozen_head: bool, dtype: torch.dtype, teacher: LlamaForCausalLM | None = None) -> None:
        import torch

        self.student, self.data, self.options, self.frozen_head = student, data, options, frozen_head
        self.teacher = teacher
        self.device = student.device
        self.dtype = dtype  # matmuls only: weights, optimizer state and the loss's softmax stay float32
        if frozen_head:
            student.model.embed_tokens.weight.requires_grad_(False)
            student.lm_head.weight.requires_grad_(False)
        self.parameters = [p for p in student.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=options.learning_rate, betas=(0.9, 0.95),
                                           weight_decay=0.0)
        self.batches = self._batches(range(data.held_out, data.count))
        if teacher is None:
            # Training softmax runs over the tokens the target ever ranks in its top-k (the saved head is whole).
            self.vocabulary = data.top_ids[int(data.offsets[data.held_out]):].unique().long()
            self.position = torch.full((student.config.vocab_size,), -1, dtype=torch.long)
            self.position[self.vocabulary] = torch.arange(len(self.vocabulary))
            self.vocabulary = self.vocabulary.to(self.device)
        self.step, self.seconds, self.last_loss = 0, 0.0, float("nan")

    def _batches(self, indices: range) -> list[list[tuple[int, int, int]]]:
        """Sequences sorted by length, grouped up to ``batch_tokens`` padded tokens per batch."""
        rows = sorted(self.data.rows(indices), key=lambda row: row[1] - row[0])
        batches: list[list[tuple[int, int, int]]] = [[]]
        for row in rows:
            if batches[-1] and (len(batches[-1]) + 1) * (row[1] - row[0]) > self.options.batch_tokens:
                batches.append([])
            batches[-1].append(row)
        return batches

    def batch_for(self, step: int) -> list[tuple[int, int, int]]:
        """The batch of ``step``: a seeded permutation per epoch, so a resumed run sees the same order."""
        import torch

        epoch, index = divmod(step, len(self.batches))
        order = torch.randperm(len(self.batches), generator=torch.Generator().manual_seed(self.options.seed * 7919 + epoch))
        return self.batches[int(order[index])]

    def loss(self, rows: list[tuple[int, int, int]]) -> torch.Tensor:
        import torch

        data, width = self.data, max(end - start for start, end, _ in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        weight = torch.zeros(len(rows), width)
        for row, (start, end, prompt_len) in enumerate(rows):
            length = end - start
            ids[row, :length] = data.ids[start:end]
            mask[row, :length] = 1
            weight[row, :length - 1] = PROMPT_WEIGHT  # position t is labelled with the target's view of t+1
            weight[row, prompt_len - 1:length - 1] = 1.0
        flat = torch.cat([torch.arange(start, end) for start, end, _ in rows])
        real = mask.bool()
        selected = weight[real] > 0
        labelled = flat[selected]  # stream positions, to look up stored labels (they stay on the CPU)
        weights = weight[real][selected].to(self.device)
        ids, mask, real, selected = (tensor.to(self.device) for tensor in (ids, mask, real, selected))
        states = self.student.model(input_ids=ids, attention_mask=mask).last_hidden_state[real][selected].float()
        if self.teacher is None:
            logits = states @ self.student.lm_head.weight[self.vocabulary].T
            columns = self.position[data.top_ids[labelled].long()].to(self.device)
            log_q = logits.log_softmax(-1).gather(-1, columns)
            per_token = -(data.top_logp[labelled].to(self.device).exp() * log_q).sum(-1)
            target_states = data.hidden[labelled].to(self.device).float()
        else:
            with torch.no_grad():
                target_states = self.teacher.model(input_ids=ids, attention_mask=mask).last_hidden_state[real][selected]
                log_p = self.teacher.lm_head(target_states).float().log_softmax(-1)
            target_states = target_states.float()
            log_q = self.student.lm_head(states).float().log_softmax(-1)
            per_token = (log_p.exp() * (log_p - log_q)).sum(-1)  # KL(teacher || student), full vocabulary
        if self.frozen_head:
            regression = ((states - target_states) ** 2).mean(-1) / target_states.pow(2).mean()
            per_token = per_token + HIDDEN_WEIGHT * regression
        return (per_token * weights).sum() / weights.sum()

    def run(self, deadline: float, checkpoint: Path, progress: Progress | None) -> None:
        """Train until ``options.steps`` or the deadline, saving every ``checkpoint_every`` steps and on exit."""
        import torch

        self.student.train()
        start_step = self.step
        with stage(progress, "draft: distil", self.options.steps) as advance:
            advance(start_step)
            try:
                while self.step < self.options.steps and time.monotonic() < deadline:
                    began = time.monotonic()
                    for group in self.optimizer.param_groups:
                        group["lr"] = learning_rate(self.step, self.options.steps, self.options.learning_rate)
                    with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
                        loss = self.loss(self.batch_for(self.step))
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.step += 1
                    self.seconds += time.monotonic() - began
                    self.last_loss = float(loss.detach())
                    advance(1)
                    if self.step % self.options.checkpoint_every == 0:
                        self.save(checkpoint)
                        if progress is not None:
                            progress.console.print(f"step {self.step}: loss {self.last_loss:.3f}", highlight=False)
            finally:  # an interrupted run keeps its progress for --resume
                if self.step > start_step:
                    self.save(checkpoint)
        self.student.eval()

    def save(self, path: Path) -> None:
        import torch

        buffer = io.BytesIO()
        torch.save({"student": self.student.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "step": self.step, "seconds": self.seconds}, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def load(self, path: Path) -> None:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and numbers only, never code
        self.student.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.seconds = int(state["step"]), float(state["seconds"])


# --- evaluation ------------------------------------------------------------------------------------------
def evaluate(target: LlamaForCausalLM, student: LlamaForCausalLM, data: DistillData,
             progress: Progress | None) -> dict[str, Any]:
    """Held-out greedy acceptance at K=1..4, step costs, V(K) and the expected speedup per K."""
    import torch

    matches = []
    with stage(progress, "draft: held-out acceptance", data.held_out) as advance, torch.no_grad():
        for start, end, prompt_len in data.rows(range(data.held_out)):
            sequence = data.ids[start:end].to(student.device)
            matches.append(draft_matches(student(input_ids=sequence[None]).logits[0], sequence, prompt_len))
            advance(1)
    acceptance = acceptance_by_k(matches, MAX_K)
    with stage(progress, "draft: step costs", COST_REPEATS) as advance:
        costs = measure_step_costs(target, student, MAX_K, advance=advance)
    expected = {str(k): round(speedup, 3) for k, speedup in predicted_speedups(acceptance, costs).items()}
    best = max(expected, key=lambda k: expected[k])
    return {"held_out_acceptance": acceptance, "target_step_ms": round(costs.target_step_ms, 2),
            "draft_step_ms": round(costs.draft_step_ms, 2), "cost_ratio": round(costs.cost_ratio, 3),
            "verify_cost": {str(k): round(v, 3) for k, v in costs.verify_cost.items()}, "expected_speedup": expected,
            "best_k": int(best)}
