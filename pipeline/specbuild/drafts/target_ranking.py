"""``specbuild head-vocabulary``: rank a sub-vocabulary head from a target checkpoint's own answers
(:mod:`specbuild.drafts.head_ranking`), for a draft that exists already or a draft asset's folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.checkpoint.head_vocabulary import HeadVocabulary
from specbuild.drafts.head_ranking import rank_head_vocabulary
from specbuild.errors import UsageError

if TYPE_CHECKING:
    from rich.progress import Progress


def rank_for_target(target_dir: str | Path, size: int, *, prompts: int = 256, max_new_tokens: int = 96,
                    seed: int = 0, threads: int = 2, progress: Progress | None = None) -> HeadVocabulary:
    """Rank from the target's greedy answers to ``prompts`` distillation prompts (bfloat16 where the CPU or GPU
    is fast at it, as ``specbuild draft`` makes its data)."""
    import copy

    from specbuild.drafts.distill import compute_dtype, load_target, resolve_device
    from specbuild.drafts.distill_data import encode_prompts, target_answers
    from specbuild.drafts.distill_options import DraftOptions
    from specbuild.runtimes.torch.threads import torch_threads

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
