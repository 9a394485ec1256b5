"""``specbuild init``: a commented starter spec that does not make serving slower than the target alone.

Given both checkpoints, a quick in-process measurement (:func:`specbuild.bench.estimate.estimate_pair`: the
draft's greedy agreement with the target's answers to a few prompts and both models' step costs) predicts the
speedup per K; the spec starts from the K predicted fastest when that beats the target alone by
:data:`MIN_PREDICTED_SPEEDUP`, else from K=0 (the target alone). Without checkpoints (placeholders) or with
``measure=False`` nothing is measured and the spec starts from K=0. A comment in the spec says which and why;
``specbuild tune`` measures the compiled release through the server and writes the best K.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.errors import SpecError, UsageError
from specbuild.spec import RuntimeChoice, SpeculationSpec
from specbuild.spec_rendering import starter_spec

if TYPE_CHECKING:
    from rich.progress import Progress

    from specbuild.bench.estimate import PairEstimate

# Predictions within 5% of the target alone are within a shared CPU's timing noise: K=0 then.
MIN_PREDICTED_SPEEDUP = 1.05
TUNE_HINT = "`specbuild tune` (after compile) measures through the server and writes the best K"


@dataclass(frozen=True)
class Starter:
    """What ``init`` wrote: the spec text, its speculation settings, and the measurement (None: none made)."""

    text: str
    speculation: SpeculationSpec
    note: str
    estimate: PairEstimate | None


def choose_speculation(estimate: PairEstimate | None, why_unmeasured: str = "") -> tuple[SpeculationSpec, str]:
    """The starter's speculation settings and the comment that explains them."""
    if estimate is None:
        return SpeculationSpec(num_draft_tokens=0), (
            f"K=0 (the target alone): {why_unmeasured}; `specbuild init TARGET DRAFT` measures the pair and "
            f"starts from the K predicted fastest, and {TUNE_HINT}")
    k = estimate.best_k
    speedup = estimate.speedups[k]
    measured = {"verify_cost": {k: round(cost, 3) for k, cost in estimate.costs.verify_cost.items()},
                "draft_cost": round(estimate.costs.cost_ratio, 4),  # the release's cost model (and check's break-even)
                "measured_acceptance": round(estimate.per_token_acceptance, 3)}
    details = (f"greedy acceptance {estimate.acceptance[str(k)]:.0%}, a draft step costs "
               f"{estimate.costs.cost_ratio:.2f} and a verification {estimate.costs.verify_cost[k]:.2f} target "
               f"steps; measured by `specbuild init` in {estimate.seconds:.0f} s on {estimate.prompts} prompts on "
               "this machine's CPU")
    if speedup >= MIN_PREDICTED_SPEEDUP:
        return SpeculationSpec(num_draft_tokens=k, **measured), (
            f"K={k}: predicted {speedup:.2f}x the target alone ({details}); {TUNE_HINT}")
    return SpeculationSpec(num_draft_tokens=0, **measured), (
        f"K=0 (the target alone): the draft would not make it faster (best: {speedup:.2f}x at K={k}; {details}); "
        "prompt lookup (prompt_lookup.enabled: true with draft_fallback: false and K > 0) drafts without the "
        f"draft model, and {TUNE_HINT}")


def make_starter(target: str | None, draft: str | None, path: str | Path, *, placeholders: tuple[str, str],
                 runtime: RuntimeChoice = "auto", measure: bool = True, progress: Progress | None = None) -> Starter:
    """The starter spec for ``path``: for ``target`` and ``draft`` (measured unless ``measure`` is false), or
    for the ``placeholders`` when both are None. Checkpoint paths are written relative to the spec's folder."""
    if (target is None) != (draft is None):
        raise UsageError("init takes both TARGET and DRAFT, or neither (placeholders)",
                         "pass both checkpoint folders, or none; choose the file with --out")
    estimate = None
    if target is None or draft is None:
        target, draft = placeholders
        why = "placeholder checkpoints, nothing measured"
    elif not measure:
        why = "not measured (--no-measure)"
    else:
        for role, folder in (("target", target), ("draft", draft)):
            if not Path(folder, "config.json").is_file():
                raise UsageError(f"{role} checkpoint folder {folder!r} has no config.json",
                                 f"pass the {role}'s Hugging Face checkpoint folder, or --no-measure to write it as is")
        from specbuild.bench.estimate import estimate_pair

        estimate = estimate_pair(target, draft, progress=progress)
        why = ""
    speculation, note = choose_speculation(estimate, why)
    folder = Path(path).resolve().parent
    text = starter_spec(_relative(target, folder), _relative(draft, folder), runtime=runtime,
                        speculation=speculation, notes={"speculation.num_draft_tokens": f"specbuild init: {note}"})
    return Starter(text, speculation, note, estimate)


def refuse_existing(path: str | Path, force: bool) -> None:
    """An existing spec file is kept unless ``force`` (checked before measuring, and again before writing)."""
    if Path(path).exists() and not force:
        raise SpecError(f"{path} already exists", "pass --force to overwrite it, or choose another path with --out")


def write_starter(path: str | Path, starter: Starter, *, force: bool = False) -> None:
    """Write the starter spec; an existing file is kept unless ``force``."""
    refuse_existing(path, force)
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(starter.text, encoding="utf-8")


def _relative(checkpoint: str, folder: Path) -> str:
    """``checkpoint`` (relative to the cwd) as the spec file in ``folder`` must name it."""
    return os.path.relpath(Path(checkpoint).resolve(), folder)
