"""The data ``specbuild draft`` distils from: the target's own answers to local prompts, and its labels.

The target answers the distillation prompts (:mod:`specbuild.drafts.distill_prompts`, never the benchmark set)
greedily, and for ``answers="greedy+sampled"`` again by sampling; one teacher-forced pass over each answer
keeps the target's top-k next-token log-probabilities and final hidden state at every position (see
:mod:`specbuild.drafts.distill` for the whole recipe). Made once per run and kept in its state folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specbuild.errors import UsageError
from specbuild.stages.atomic import atomic_write_bytes
from specbuild.terminal import stage

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

    from specbuild.drafts.distill_options import DraftOptions

DATA_FILE = "data.safetensors"
LABEL_BATCH_TOKENS = 4096
LABEL_WINDOW_TOKENS = 4 * LABEL_BATCH_TOKENS  # under a deadline: labelled a window at a time, sorted within it


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

    def answers(self, indices: range) -> list[list[int]]:
        """The target's answer tokens (prompts left out) of the given sequences."""
        return [self.ids[start + prompt_len:end].tolist() for start, end, prompt_len in self.rows(indices)]

    @property
    def count(self) -> int:
        return len(self.prompt_lens)


def load_or_make_data(teacher: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, work: Path,
                       options: DraftOptions, deadline: float, progress: Progress | None) -> DistillData:
    """The target's answers (and, for a ``labels`` teacher, their labels), made once and kept in ``work``."""
    path = work / DATA_FILE
    if (stored := load_data(path, options.held_out)) is not None:
        return stored
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
    save_data(data, path)
    return data


def save_data(data: DistillData, path: Path) -> None:
    """``data``'s tensors into ``path`` (safetensors) and its figures beside it (``.json``)."""
    from safetensors.torch import save

    tensors = {name: getattr(data, name).contiguous() for name in
               ("ids", "offsets", "prompt_lens", "top_ids", "top_logp", "hidden") if getattr(data, name) is not None}
    atomic_write_bytes(path, save(tensors))
    atomic_write_bytes(path.with_suffix(".json"), json.dumps(data.figures).encode("utf-8"))


def load_data(path: Path, held_out: int) -> DistillData | None:
    """What :func:`save_data` wrote to ``path``, its first ``held_out`` sequences held out; None where nothing was."""
    from safetensors.torch import load

    if not path.is_file():
        return None
    figures = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    return DistillData(**load(path.read_bytes()), held_out=held_out, figures=figures)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, options: DraftOptions) -> list[list[int]]:
    """The distillation prompts (never a benchmark prompt), held-out ones first, encoded by :func:`chat_encode`."""
    from specbuild.drafts.distill_prompts import distillation_prompts

    return chat_encode(tokenizer, distillation_prompts(options.prompts, options.seed))


def chat_encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Each text as a user's message in the target's chat template (the plain text where it has none)."""
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
          progress: Progress | None, *, deadline: float | None = None, needed: int = 0) -> DistillData:
    """Teacher-forced target passes (sequences of similar length batched, right-padded: causal attention
    never lets a real position see padding) keeping top-k log-probabilities and final hidden states
    (on the CPU); ``top_k=None`` keeps the sequences only (a joint teacher labels them while training).

    With a ``deadline``, as :func:`target_answers` takes it: the first ``needed`` sequences are always labelled, the
    rest in their order (the caller's priority) a window at a time (:func:`label_windows`) until it has passed, one
    window of them at least; the data holds the sequences labelled, the rest are left out."""
    import torch

    if top_k is None:
        return sequence_data(sequences)
    windows = [range(len(sequences))] if deadline is None else label_windows(sequences, needed)
    labels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (top ids, top log-probs, hidden) in order
    with stage(progress, "draft: label with the target", len(sequences)) as advance, torch.no_grad():
        for window in windows:
            if deadline is not None and len(labels) > needed and time.monotonic() > deadline:
                break
            labels += label_window(target, sequences, window, top_k, advance)
    data = sequence_data(sequences[:len(labels)])
    data.top_ids, data.top_logp, data.hidden = (torch.cat(part) for part in zip(*labels))
    return data


def sequence_data(sequences: list[tuple[list[int], int]]) -> DistillData:
    """``sequences`` (prompt + answer, prompt length) as one flat stream, without labels."""
    import torch

    lengths = torch.tensor([0] + [len(sequence) for sequence, _ in sequences])
    return DistillData(
        ids=torch.tensor([token for sequence, _ in sequences for token in sequence]),
        offsets=lengths.cumsum(0), prompt_lens=torch.tensor([length for _, length in sequences]), held_out=0,
        figures={"sequences": len(sequences), "tokens": int(lengths.sum()),
                 "answer_tokens": sum(len(s) - p for s, p in sequences)})


def joined(first: DistillData, second: DistillData) -> DistillData:
    """``second``'s sequences after ``first``'s, labels and figures included (``first``'s held-out part kept)."""
    import torch

    labels = {name: None if getattr(first, name) is None else torch.cat([getattr(first, name), getattr(second, name)])
              for name in ("top_ids", "top_logp", "hidden")}
    return DistillData(ids=torch.cat([first.ids, second.ids]),
                       offsets=torch.cat([first.offsets, second.offsets[1:] + first.offsets[-1]]),
                       prompt_lens=torch.cat([first.prompt_lens, second.prompt_lens]), held_out=first.held_out,
                       figures={key: first.figures[key] + second.figures[key]
                                for key in ("sequences", "tokens", "answer_tokens")}, **labels)


def label_windows(sequences: list[tuple[list[int], int]], needed: int) -> list[range]:
    """The first ``needed`` sequences, then the rest in consecutive windows of up to :data:`LABEL_WINDOW_TOKENS`
    tokens (a longer sequence alone): a deadline is checked between windows, lengths are sorted within them."""
    windows, first, tokens = [range(needed)], needed, 0
    for index in range(needed, len(sequences)):
        if index > first and tokens + len(sequences[index][0]) > LABEL_WINDOW_TOKENS:
            windows.append(range(first, index))
            first, tokens = index, 0
        tokens += len(sequences[index][0])
    return windows + ([range(first, len(sequences))] if first < len(sequences) else [])


def label_window(target: LlamaForCausalLM, sequences: list[tuple[list[int], int]], window: range, top_k: int,
                 advance: Callable[[float], None]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The labels of the sequences in ``window``, in its order, from batches of similar lengths."""
    import torch

    order = sorted(window, key=lambda i: len(sequences[i][0]))
    labels = {}
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
            labels[i] = (indices[row, :length].int().cpu(), values[row, :length].cpu(),
                         states[row, :length].half().cpu())
        advance(len(batch))
        first = last
    return [labels[i] for i in window]
