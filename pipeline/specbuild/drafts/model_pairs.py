"""What the demo and tiny model pairs share: a cached, atomic pair folder and greedy-acceptance figures.

A pair folder holds ``target/`` and ``draft/`` (HF safetensors checkpoints sharing one tokenizer) and a
stamp file naming the recipe that made them. A build is written into a temporary sibling folder and
renamed into place only when complete, so an interrupted build never leaves a half-written pair, and a
folder whose stamp matches the recipe is returned at once.

Greedy acceptance needs no speculative loop: while the draft's tokens are accepted they equal the target's,
so the draft's proposal at every position of the target's own greedy continuation decides each round.
One teacher-forced draft pass over that continuation gives :func:`acceptance_rate` for every K.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from specbuild.checkpoint.rope import write_legacy_rope
from specbuild.errors import UsageError

if TYPE_CHECKING:  # heavy imports stay lazy: importing specbuild must not load torch
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STAMP_FILE = "specbuild-pair.json"
CACHE_ENV = "SPECBUILD_CACHE"
CACHE_FOLDER = ".cache"
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json")


@dataclass(frozen=True)
class ModelPair:
    """A target and a draft checkpoint folder under ``root``; ``info`` is the stamp (recipe, figures)."""

    root: Path
    info: dict[str, Any]

    @property
    def target_dir(self) -> Path:
        return self.root / "target"

    @property
    def draft_dir(self) -> Path:
        return self.root / "draft"


def cache_dir(base: str | Path = ".") -> Path:
    """The folder the demo and the tests build model pairs into, once, whichever runs first:
    ``$SPECBUILD_CACHE`` when set, else ``base/.cache``."""
    return Path(os.environ.get(CACHE_ENV) or Path(base) / CACHE_FOLDER)


def pair_dir(kind: Literal["demo", "tiny"], base: str | Path = ".") -> Path:
    """Where the demo (SmolLM2) or tiny pair is cached: ``<cache>/demo-pair`` or ``<cache>/tiny-pair``."""
    return cache_dir(base) / f"{kind}-pair"


def load_pair(out_dir: str | Path, recipe: dict[str, Any]) -> ModelPair | None:
    """The pair in ``out_dir`` if it is complete and was made by ``recipe``, else None."""
    root = Path(out_dir)
    try:
        info = json.loads((root / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("recipe") != recipe:
        return None
    pair = ModelPair(root, info)
    complete = all((folder / name).is_file() for folder in (pair.target_dir, pair.draft_dir)
                   for name in CHECKPOINT_FILES)
    return pair if complete else None


def cached_pair(out_dir: str | Path, recipe: dict[str, Any],
                build: Callable[[Path], dict[str, Any]]) -> ModelPair:
    """Return the pair in ``out_dir`` made by ``recipe``, building it with ``build(tmp_root)`` if needed.

    ``build`` writes ``target/`` and ``draft/`` into the folder it is given and returns figures worth
    keeping (sizes, timings, agreement); they are stored in the stamp next to the recipe. An existing
    ``out_dir`` is replaced only if it is empty or an older specbuild pair, never a folder of other files.
    """
    root = Path(out_dir)
    pair = load_pair(root, recipe)
    if pair is not None:
        return pair
    if root.exists() and not (root / STAMP_FILE).is_file() and (root.is_file() or any(root.iterdir())):
        raise UsageError(f"{root} exists and is not a specbuild model pair",
                         "choose an empty or new folder, or remove that one")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.building-", dir=root.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; servers in containers often read as another user
    try:
        figures = build(staging)
        info = {"recipe": recipe, **figures}
        (staging / STAMP_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        _replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # Another process may have finished the same build first; either copy is a complete pair.
    built = load_pair(root, recipe)
    assert built is not None, f"{root} was just built from this recipe"
    return built


def _replace(staging: Path, root: Path) -> None:
    """Move ``staging`` to ``root``, moving an older pair aside first so ``root`` is never half-written."""
    if root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
        root.rename(old / root.name)
        shutil.rmtree(old, ignore_errors=True)
    try:
        staging.rename(root)
    except OSError:
        if not root.exists():  # a concurrent build that renamed first wins; anything else is a real error
            raise


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save model (safetensors), generation config and tokenizer so transformers 4.57 and 5.x both load them (and
    read the same RoPE: the legacy keys beside 5.x's ``rope_parameters``)."""
    model.save_pretrained(folder, safe_serialization=True)
    write_legacy_rope(folder)
    tokenizer.save_pretrained(folder)
    # transformers 5 writes its own class name, unknown to 4.57; this name loads the same files in both.
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def greedy_continuations(model: PreTrainedModel, prompts: Sequence[Sequence[int]], new_tokens: int,
                         advance: Callable[[float], None] = lambda amount=1: None) -> list[torch.Tensor]:
    """Each prompt plus the model's greedy continuation (stopping early at end-of-sequence), 1-D."""
    import torch

    sequences = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False, temperature=None, top_p=None, top_k=None)
            sequences.append(out[0])
            advance(1)
    return sequences


def draft_matches(draft_logits: torch.Tensor, sequence: torch.Tensor, prompt_len: int) -> list[bool]:
    """Whether the draft's argmax (teacher-forced on ``sequence``) equals each generated token.

    ``draft_logits`` are the draft's logits for every position of ``sequence`` (shape ``[len, vocab]``).
    """
    predicted = draft_logits[prompt_len - 1:-1].argmax(dim=-1)
    return (predicted == sequence[prompt_len:]).tolist()


def acceptance_rate(matches: Sequence[Sequence[bool]], k: int) -> float:
    """Greedy speculative decoding's accepted / drafted tokens at ``k`` drafts per round.

    Each round drafts ``k`` tokens at the current position (fewer where the row ends, so the figure has no
    end-of-text bias), accepts the run of matches, and advances past it plus the target's own token,
    exactly as greedy verification does.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    accepted = drafted = 0
    for row in matches:
        position = 0
        while position < len(row):
            run = 0
            while run < k and position + run < len(row) and row[position + run]:
                run += 1
            accepted += run
            drafted += min(k, len(row) - position)
            position += run + 1
    return accepted / drafted if drafted else 0.0


def acceptance_by_k(matches: Sequence[Sequence[bool]], max_k: int = 8) -> dict[str, float]:
    """:func:`acceptance_rate` for K = 1..max_k, keyed by K as text (JSON-ready)."""
    return {str(k): round(acceptance_rate(matches, k), 3) for k in range(1, max_k + 1)}


def parameter_count(model: PreTrainedModel) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def model_logits(model: PreTrainedModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model``'s logits at every position of one token sequence (``[len, vocab]``), for :func:`sequence_matches`."""
    return lambda sequence: model(input_ids=sequence[None].to(model.device)).logits[0]


def sequence_matches(draft_logits: Callable[[torch.Tensor], torch.Tensor],
                     sequences: Iterable[tuple[torch.Tensor, int]],
                     advance: Callable[[float], None] = lambda amount=1: None) -> list[list[bool]]:
    """:func:`draft_matches` for each (prompt + answer, prompt length), teacher-forced in one pass each.

    ``draft_logits`` gives the draft's vocabulary-wide logits for a sequence: :func:`model_logits`, or a torch
    engine's ``sequence_logits``, which scatters a sub-vocabulary head's logits back to their token ids (the
    head's own indices are not token ids)."""
    import torch

    matches = []
    with torch.no_grad():
        for sequence, prompt_len in sequences:
            matches.append(draft_matches(draft_logits(sequence).to(sequence.device), sequence, prompt_len))
            advance(1)
    return matches


def measure_acceptance(target: PreTrainedModel, draft_logits: Callable[[torch.Tensor], torch.Tensor],
                       prompts: Sequence[Sequence[int]], new_tokens: int,
                       advance: Callable[[float], None] = lambda amount=1: None) -> dict[str, float]:
    """Greedy acceptance per drafted token at K=1..8 on the target's own continuations of ``prompts``
    (``draft_logits`` as for :func:`sequence_matches`)."""
    continuations = greedy_continuations(target, prompts, new_tokens, advance)
    return acceptance_by_k(sequence_matches(draft_logits, zip(continuations, map(len, prompts))))


def progress_display(console: Console | None = None) -> Progress:
    """A transient rich display for :func:`stage` tasks: spinner, description, bar, elapsed time (a task
    without steps still shows that it is alive)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


@contextlib.contextmanager
def stage(progress: Progress | None, description: str, total: float | None = None) -> Iterator[Callable[[float], None]]:
    """A progress task for one build stage; yields ``advance(amount)``, a no-op without ``progress``."""
    if progress is None:
        yield lambda amount=1: None
        return
    task = progress.add_task(description, total=total)
    try:
        yield lambda amount=1: progress.advance(task, amount)
    finally:
        progress.update(task, completed=total if total is not None else 1, total=total or 1)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads (reproducible timings on a shared machine), then restore."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
