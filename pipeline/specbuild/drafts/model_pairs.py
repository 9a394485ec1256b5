"""What the demo and tiny model pairs share: a cached, atomic pair folder, saved checkpoints and their sizes.

A pair folder holds ``target/`` and ``draft/`` (HF safetensors checkpoints sharing one tokenizer) and a
stamp file naming the recipe that made them. A build is written into a temporary sibling folder and
renamed into place only when complete, so an interrupted build never leaves a half-written pair, and a
folder whose stamp matches the recipe is returned at once. A pair's greedy acceptance is measured by
:mod:`specbuild.bench.acceptance`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from specbuild.checkpoint.rope import write_legacy_rope
from specbuild.errors import UsageError

if TYPE_CHECKING:  # heavy imports stay lazy: importing specbuild must not load torch
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


def parameter_count(model: PreTrainedModel) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
