"""A tiny target/draft pair made from nothing, for fast tests: no download, about a minute on 2 CPU cores.

Recipe: a byte-level BPE tokenizer trained on the Python standard library's own ``.py`` files (sorted by
name, so the selection is deterministic); a target Llama (2 layers, hidden 128, untied head, grouped-query
attention) trained on that text; a draft Llama (1 layer, hidden 64, tied embeddings) distilled from the
target's logits on the same text. Untrained models give meaningless acceptance (0 or ~0.9); this recipe
gives greedy acceptance per drafted token of roughly 0.7 at K=1 and 0.5 at K=4. The stamp holds every
setting below, so changing one rebuilds cached pairs; bump :data:`RECIPE_VERSION` for changes in code.
"""

from __future__ import annotations

import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.bench.acceptance import measure_acceptance, model_logits
from specbuild.drafts.model_pairs import ModelPair, cached_pair, folder_bytes, parameter_count, save_checkpoint
from specbuild.runtimes.torch.threads import torch_threads
from specbuild.terminal import stage

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

TinyPair = ModelPair

RECIPE_VERSION = 2  # 2: RoPE's legacy keys in config.json beside rope_parameters (transformers 4.57 reads them)
VOCAB_SIZE = 1024
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"  # ids 0, 1, 2
CORPUS_CHARS = 1_500_000
MAX_FILE_CHARS = 200_000
SEQ_LEN, BATCH = 128, 16
TARGET_STEPS, DRAFT_STEPS = 250, 150
LEARNING_RATE = 5e-3
THREADS = 2
EVAL_PROMPTS, EVAL_PROMPT_LEN, EVAL_NEW_TOKENS = 8, 24, 48
MAX_POSITIONS = 2048
TARGET_SIZES = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "tie_word_embeddings": False}
DRAFT_SIZES = {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 2, "tie_word_embeddings": True}


def build_tiny_pair(out_dir: str | Path, *, seed: int = 0, progress: Progress | None = None) -> TinyPair:
    """Build (or return the cached) tiny pair in ``out_dir``: ``target/`` and ``draft/`` checkpoints.

    The stamp records the recipe, sizes, the build time and the measured greedy acceptance per K.
    """
    recipe = {"kind": "tiny", "version": RECIPE_VERSION, "seed": seed, "vocab_size": VOCAB_SIZE,
              "target": TARGET_SIZES, "draft": DRAFT_SIZES, "steps": [TARGET_STEPS, DRAFT_STEPS],
              "batch": [BATCH, SEQ_LEN], "learning_rate": LEARNING_RATE, "corpus_chars": CORPUS_CHARS}
    return cached_pair(out_dir, recipe, lambda root: _build(root, seed, progress))


def _build(root: Path, seed: int, progress: Progress | None) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    with torch_threads(THREADS):
        with stage(progress, "tiny pair: tokenizer", 1) as advance:
            train_texts, eval_texts = stdlib_corpus()
            tokenizer = train_tokenizer(train_texts)
            ids = encode_stream(tokenizer, train_texts)
            advance(1)
        hf_tokenizer = wrap_tokenizer(tokenizer)
        with stage(progress, "tiny pair: train target", TARGET_STEPS) as advance:
            torch.manual_seed(seed)
            target = llama(TARGET_SIZES)
            train(target, ids, TARGET_STEPS, seed, _next_token_loss(target), advance)
        with stage(progress, "tiny pair: distill draft", DRAFT_STEPS) as advance:
            torch.manual_seed(seed + 1)
            draft = llama(DRAFT_SIZES)
            train(draft, ids, DRAFT_STEPS, seed + 1, _distillation_loss(draft, target), advance)
        with stage(progress, "tiny pair: measure acceptance", EVAL_PROMPTS) as advance:
            acceptance = measure_acceptance(target, model_logits(draft), _eval_prompts(tokenizer, eval_texts),
                                            EVAL_NEW_TOKENS, advance)
        for name, model in (("target", target), ("draft", draft)):
            save_checkpoint(model, hf_tokenizer, root / name)
    return {
        "build_seconds": round(time.perf_counter() - started, 1),
        "parameters": {"target": parameter_count(target), "draft": parameter_count(draft)},
        "bytes": {"target": folder_bytes(root / "target"), "draft": folder_bytes(root / "draft")},
        "greedy_acceptance": acceptance,
    }


def stdlib_corpus() -> tuple[list[str], list[str]]:
    """Training text (the first ~1.5 MB of top-level stdlib modules by name) and held-out text (the next few)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = (path.read_text(encoding="utf-8", errors="replace") for path in sorted(stdlib.glob("*.py")))
    train_texts: list[str] = []
    eval_texts: list[str] = []
    size = 0
    for text in texts:
        if len(text) > MAX_FILE_CHARS or len(text) < 2_000:
            continue
        if size < CORPUS_CHARS:
            train_texts.append(text)
            size += len(text)
        elif len(eval_texts) < EVAL_PROMPTS:
            eval_texts.append(text)
        else:
            break
    return train_texts, eval_texts


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """Byte-level BPE (every byte representable) that prepends the bos token, as Llama tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[PAD, BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 1)])
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=MAX_POSITIONS)


def encode_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one token stream, each file as ``bos ... eos``."""
    import torch

    eos = tokenizer.token_to_id(EOS)
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        stream.extend(encoding.ids)
        stream.append(eos)
    return torch.tensor(stream, dtype=torch.long)


def llama(sizes: dict[str, Any]) -> LlamaForCausalLM:
    """A randomly initialised Llama sharing the tokenizer's vocabulary and special-token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2, **sizes))


Loss = Callable[["torch.Tensor"], "torch.Tensor"]


def _next_token_loss(model: LlamaForCausalLM) -> Loss:
    return lambda batch: model(input_ids=batch, labels=batch).loss


def _distillation_loss(student: LlamaForCausalLM, teacher: LlamaForCausalLM) -> Loss:
    """KL(teacher || student) per token: the draft learns the target's distribution, not just the text."""
    import torch
    import torch.nn.functional as F

    def loss(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logp = teacher(input_ids=batch).logits.log_softmax(-1).flatten(0, 1)
        student_logp = student(input_ids=batch).logits.log_softmax(-1).flatten(0, 1)
        return F.kl_div(student_logp, teacher_logp, log_target=True, reduction="batchmean")

    return loss


def _batches(ids: torch.Tensor, seed: int) -> Iterator[torch.Tensor]:
    """Random windows of the stream, seeded."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(ids) - SEQ_LEN, (BATCH,), generator=generator)
        yield torch.stack([ids[start:start + SEQ_LEN] for start in starts.tolist()])


def train(model: LlamaForCausalLM, ids: torch.Tensor, steps: int, seed: int, loss_fn: Loss,
          advance: Callable[[float], None]) -> None:
    """AdamW with a one-cycle schedule: enough for a coherent tiny model in a few hundred steps."""
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LEARNING_RATE, total_steps=steps,
                                                   pct_start=0.1)
    for _, batch in zip(range(steps), _batches(ids, seed)):
        loss_fn(batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        advance(1)
    model.eval()


def _eval_prompts(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The opening tokens of held-out modules (not trained on)."""
    return [tokenizer.encode(text).ids[:EVAL_PROMPT_LEN] for text in texts]
