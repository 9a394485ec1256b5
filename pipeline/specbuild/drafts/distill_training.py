"""The draft ``specbuild draft`` trains and how: a Llama initialised from the target, and the distillation
steps (top-k cross-entropy against stored labels, or KL divergence from a target run in the step, plus a
hidden-state regression), with a cosine schedule, checkpoints and resume (see :mod:`specbuild.drafts.distill`)."""

from __future__ import annotations

import io
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.errors import UsageError
from specbuild.stages.atomic import atomic_write_bytes
from specbuild.terminal import stage

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import LlamaForCausalLM

    from specbuild.drafts.distill_data import DistillData
    from specbuild.drafts.distill_options import DraftOptions

PROMPT_WEIGHT = 0.2  # prompt positions teach the draft too, but only answer positions are ever drafted
HIDDEN_WEIGHT = 1.0
WARMUP_SHARE, FINAL_LR_SHARE = 0.05, 0.1


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
                 frozen_head: bool, dtype: torch.dtype, teacher: LlamaForCausalLM | None = None,
                 passes: float | None = None) -> None:
        """``passes``: the schedule's length in passes over the training batches, in place of ``options.steps``
        (kept in :attr:`options`)."""
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
        if passes is not None:
            self.options = replace(options, steps=max(1, round(passes * len(self.batches))))
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

