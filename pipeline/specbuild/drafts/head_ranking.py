"""Rank the ids a draft's sub-vocabulary head keeps (:mod:`specbuild.checkpoint.head_vocabulary`).

The ids are ranked by how often they occur in the target's own greedy answers to local distillation prompts
(never a benchmark set), as FR-Spec ranks them for EAGLE heads; ids with equal counts, unseen ones included,
keep the lower id first (byte-level BPE ids rise with merge order, so lower ids are the commoner merges). The
ranking depends on the target alone: one list serves every draft of that target, and costs the target's answers
once (``specbuild head-vocabulary``), or nothing when ``specbuild draft --head-vocabulary`` ranks from the answers
it distils from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.checkpoint.head_vocabulary import HeadVocabulary
from specbuild.errors import UsageError

if TYPE_CHECKING:
    from rich.progress import Progress


def rank_head_vocabulary(answers: Sequence[Sequence[int]], vocab_size: int, size: int,
                         provenance: dict[str, Any] | None = None) -> HeadVocabulary:
    """The ``size`` ids most frequent in ``answers`` (the target's answer tokens, prompts left out), with how
    they were counted and the share of the counted tokens they cover in the provenance."""
    import torch

    if not 1 <= size < vocab_size:
        raise UsageError(f"a head vocabulary of {size} ids for a {vocab_size}-id vocabulary",
                         f"pass a size between 1 and {vocab_size - 1} (the full head needs no list)")
    tokens = torch.tensor([token for answer in answers for token in answer], dtype=torch.long)
    if not len(tokens):
        raise UsageError("no answer tokens to rank a head vocabulary from", "rank from more prompts")
    counts = torch.bincount(tokens, minlength=vocab_size)
    ranking = torch.sort(-counts, stable=True).indices[:size]  # stable: equal counts keep the lower id first
    figures = {"answers": len(answers), "answer_tokens": len(tokens), "distinct_ids": int((counts > 0).sum()),
               "coverage": round(float(counts[ranking].sum()) / len(tokens), 4)}
    return HeadVocabulary.of(ranking.tolist(), {**(provenance or {}), **figures})


def coverage(vocabulary: HeadVocabulary, answers: Sequence[Sequence[int]]) -> float:
    """The share of ``answers``' tokens that ``vocabulary`` holds: a drafted token can only be one of them."""
    kept = set(vocabulary.ids)
    total = sum(len(answer) for answer in answers)
    return round(sum(token in kept for answer in answers for token in answer) / total, 4) if total else 1.0


def rank_for_target(target_dir: str | Path, size: int, *, prompts: int = 256, max_new_tokens: int = 96,
                    seed: int = 0, threads: int = 2, progress: Progress | None = None) -> HeadVocabulary:
    """Rank from the target's greedy answers to ``prompts`` distillation prompts (bfloat16 where the CPU or GPU
    is fast at it, as ``specbuild draft`` makes its data)."""
    import copy

    from specbuild.drafts.distill import compute_dtype, load_target, resolve_device
    from specbuild.drafts.distill_data import encode_prompts, target_answers
    from specbuild.drafts.distill_options import DraftOptions
    from specbuild.drafts.model_pairs import torch_threads

    options = DraftOptions(prompts=prompts, held_out=1, max_new_tokens=max_new_tokens, seed=seed)
    with torch_threads(threads):
        device = resolve_device("auto")
        target, tokenizer = load_target(Path(target_dir), device)
        dtype = compute_dtype("auto", device)
        teacher = target if dtype == target.dtype else copy.deepcopy(target).to(dtype)
        sequences = target_answers(teacher, tokenizer, encode_prompts(tokenizer, options), options, float("inf"),
                                   progress)
    answers = [sequence[prompt_len:] for sequence, prompt_len in sequences]
    return rank_head_vocabulary(answers, int(target.config.vocab_size), size, {
        "ranked_from": "the target's greedy answers to specbuild's distillation prompts",
        "target": Path(target_dir).name, "max_new_tokens": max_new_tokens, "seed": seed})


def write_for_draft(target_dir: str | Path, draft_dir: str | Path, size: int, *, replace: bool = False,
                    **ranking: Any) -> HeadVocabulary:
    """Rank (:func:`rank_for_target`) and write ``head_vocabulary.json`` into ``draft_dir``: a draft checkpoint of
    the target's vocabulary, or a folder of draft files such as the demo draft's asset."""
    from specbuild.checkpoint.head_vocabulary import HEAD_VOCABULARY
    from specbuild.checkpoint.json_files import MAX_CONFIG_JSON, read_json

    target, draft = Path(target_dir), Path(draft_dir)
    path = draft / HEAD_VOCABULARY
    if not draft.is_dir():
        raise UsageError(f"{draft} is not a folder", "pass the draft's checkpoint folder")
    if path.exists() and not replace:
        raise UsageError(f"{path} exists", "pass --replace to rank it again")
    vocab_size = read_json(target / "config.json", MAX_CONFIG_JSON).get("vocab_size")
    if (draft / "config.json").is_file() and read_json(draft / "config.json", MAX_CONFIG_JSON).get(
            "vocab_size") != vocab_size:
        raise UsageError(f"the draft {draft} and the target {target} have different vocabularies",
                         "a head vocabulary lists the target's ids: pass a draft of that target")
    vocabulary = rank_for_target(target, size, **ranking)
    vocabulary.write(draft)
    return vocabulary
