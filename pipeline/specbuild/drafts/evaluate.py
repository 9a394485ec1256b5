"""Measure drafts end to end: greedy in-process speculative decoding at several settings, side by side in
one run.

A setting is a draft (by name), K and whether prompt lookup drafts first. Each prompt runs once per
setting, the order rotating from prompt to prompt (so load from other work on a shared machine falls on
every setting alike and none always goes first), with the engines' prefix caches emptied before every
request, so no run reuses another's KV cache. Outputs of every setting are compared token for token with
K=0 (the target alone, through the same engine).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.runtimes.torch.threads import torch_threads
from specbuild.terminal import stage

if TYPE_CHECKING:
    from rich.progress import Progress

    from specbuild.speculation.stats import SpeculationStats

DEFAULT_DRAFT = "draft"
WARMUP_TOKENS = 4


@dataclass(frozen=True)
class Setting:
    """One column of the comparison: ``draft`` names a draft (None at K=0, the target alone)."""

    draft: str | None
    k: int
    lookup: bool = False

    @property
    def label(self) -> str:
        if not self.k:
            return "K=0"
        return f"{self.draft} K={self.k}{'+lookup' if self.lookup else ''}"


def settings_for(drafts: Sequence[str], ks: Sequence[int], lookup: Sequence[bool] = (False,)) -> list[Setting]:
    """K=0 first, then every draft at every K > 0 with each lookup choice."""
    return [Setting(None, 0)] + [Setting(name, k, use) for name in drafts for k in sorted(set(ks) - {0})
                                 for use in sorted(set(lookup))]


def compare_in_process(target_dir: str | Path, drafts: str | Path | Mapping[str, str | Path],
                       ks: Sequence[int] = (0, 1, 2, 3), *, lookup: Sequence[bool] = (False,), prompts: int = 20,
                       skip: int = 0, max_tokens: int = 64, threads: int = 2,
                       progress: Progress | None = None) -> dict[str, Any]:
    """Tokens/s, speedup over K=0, acceptance, mean acceptance length, step costs (c, V(K)), prompt
    lookup's share of rounds and identical outputs per setting.

    ``drafts`` is one draft checkpoint folder or {name: folder}. Prompts are the bundled benchmark set
    (held out from ``specbuild draft``'s data), ``skip`` onwards, in the target's chat template, encoded as
    the server's preprocessing encodes them.
    """
    from transformers import AutoTokenizer

    from specbuild.bench.prompts import load_prompts
    from specbuild.bench.sweep import chat_prompts, rotated
    from specbuild.runtimes.torch.engine import PrefixCache, TorchEngine
    from specbuild.runtimes.torch.inprocess import InProcessSpeculator
    from specbuild.speculation.lookup import PromptLookup
    from specbuild.speculation.request import TokenRequest
    from specbuild.speculation.stats import SpeculationStats

    folders = {DEFAULT_DRAFT: drafts} if isinstance(drafts, (str, Path)) else dict(drafts)
    settings = settings_for(list(folders), ks, lookup)
    texts = chat_prompts(target_dir, load_prompts(limit=skip + prompts)[skip:])
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    prompt_ids = [tokenizer.encode(text) for text in texts]
    eos = int(tokenizer.eos_token_id)
    totals = {s: {"tokens": 0, "seconds": 0.0, "stats": SpeculationStats(), "outputs": []} for s in settings}
    with torch_threads(threads):
        target = TorchEngine(target_dir, max_draft_len=max(max(ks), 1))
        speculators = {name: InProcessSpeculator(target, TorchEngine(folder)) for name, folder in folders.items()}
        speculators[None] = InProcessSpeculator(target, None)
        engines = [target] + [s.draft for s in speculators.values() if s.draft is not None]
        for speculator in speculators.values():  # first calls are slow: none of them is timed
            speculator.generate(TokenRequest(prompt_ids=prompt_ids[0], max_tokens=WARMUP_TOKENS, end_id=eos,
                                                  num_draft_tokens=2 if speculator.draft else 0))
        with stage(progress, "in-process speculative decoding", len(prompt_ids) * len(settings)) as advance:
            for index, ids in enumerate(prompt_ids):
                for setting in rotated(settings, index):
                    for engine in engines:
                        engine.cache = PrefixCache(engine.cache.max_tokens)
                    request = TokenRequest(prompt_ids=ids, max_tokens=max_tokens, end_id=eos,
                                                num_draft_tokens=setting.k,
                                                prompt_lookup=PromptLookup() if setting.lookup else None)
                    began = time.perf_counter()
                    result = speculators[setting.draft].generate(request)
                    total = totals[setting]
                    total["seconds"] += time.perf_counter() - began
                    total["tokens"] += len(result.tokens)
                    total["outputs"].append(result.tokens)
                    total["stats"] += result.stats
                    advance(1)
    return {"prompts": len(prompt_ids), "max_tokens": max_tokens,
            "rows": [_row(setting, totals[setting], totals[settings[0]]) for setting in settings]}


def _row(setting: Setting, total: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    stats: SpeculationStats = total["stats"]
    rate = total["tokens"] / total["seconds"]
    # The target alone makes one token per forward pass: its seconds per token are one target step.
    step = baseline["stats"].target_seconds / baseline["tokens"]
    row = {"label": setting.label, "draft": setting.draft, "k": setting.k, "lookup": setting.lookup,
           "tokens": total["tokens"], "seconds": round(total["seconds"], 2), "tokens_per_second": round(rate, 2),
           "speedup": round(rate / (baseline["tokens"] / baseline["seconds"]), 3),
           "acceptance": round(stats.acceptance_rate, 3) if setting.k else None,
           "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
           "identical": sum(a == b for a, b in zip(total["outputs"], baseline["outputs"]))}
    if setting.k and stats.rounds:
        model_tokens = stats.source("model").drafted_tokens
        row.update(cost_ratio=round(stats.draft_seconds / model_tokens / step, 3) if model_tokens else None,
                   verify_cost=round(stats.target_seconds / stats.rounds / step, 3),
                   tokens_per_round=round(total["tokens"] / stats.rounds, 3),
                   lookup_share=round(stats.source("lookup").drafts / stats.rounds, 3) if setting.lookup else None)
    return row

