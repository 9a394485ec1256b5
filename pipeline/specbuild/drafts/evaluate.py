"""Measure a draft end to end: greedy in-process speculative decoding at several K, side by side in one run.

Each prompt runs once per K, in turn (so load from other work on a shared machine falls on every K alike),
with the engines' prefix caches emptied before every request, so no run reuses another's KV cache. Outputs
at every K are compared token for token with K=0 (the target alone, through the same engine).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.drafts.model_pairs import stage, torch_threads

if TYPE_CHECKING:
    from rich.progress import Progress


def compare_in_process(target_dir: str | Path, draft_dir: str | Path, ks: Sequence[int] = (0, 1, 2, 3), *,
                       prompts: int = 20, skip: int = 0, max_tokens: int = 64, threads: int = 2,
                       progress: Progress | None = None) -> dict[str, Any]:
    """Tokens/s, acceptance, mean acceptance length, speedup over K=0 and identical outputs per K.

    Prompts are the bundled benchmark set (held out from ``specbuild draft``'s data), ``skip`` onwards,
    in the target's chat template, encoded as the server's preprocessing encodes them.
    """
    from transformers import AutoTokenizer

    from specbuild.bench.runner import chat_prompts
    from specbuild.bench.prompts import load_prompts
    from specbuild.speculation.inprocess import InProcessSpeculator
    from specbuild.speculation.loop import GenerationRequest
    from specbuild.speculation.stats import SpeculationStats
    from specbuild.speculation.torch_engine import PrefixCache

    ks = sorted({0, *ks})
    texts = chat_prompts(target_dir, load_prompts(limit=skip + prompts)[skip:])
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    prompt_ids = [tokenizer.encode(text) for text in texts]
    eos = int(tokenizer.eos_token_id)
    totals = {k: {"tokens": 0, "seconds": 0.0, "stats": SpeculationStats(), "outputs": []} for k in ks}
    with torch_threads(threads):
        speculator = InProcessSpeculator.from_checkpoints(target_dir, draft_dir, max_draft_len=max(max(ks), 1))
        engines = [speculator.target, speculator.draft]
        with stage(progress, "in-process speculative decoding", len(prompt_ids) * len(ks)) as advance:
            for index, ids in enumerate(prompt_ids):
                order = ks if index % 2 == 0 else ks[::-1]
                for k in order:
                    for engine in engines:
                        engine.cache = PrefixCache(engine.cache.max_tokens)
                    request = GenerationRequest(prompt_ids=ids, max_tokens=max_tokens, end_id=eos, num_draft_tokens=k)
                    began = time.perf_counter()
                    result = speculator.generate(request)
                    total = totals[k]
                    total["seconds"] += time.perf_counter() - began
                    total["tokens"] += len(result.tokens)
                    total["outputs"].append(result.tokens)
                    total["stats"] += result.stats
                    advance(1)
    baseline = totals[0]["tokens"] / totals[0]["seconds"]
    rows = []
    for k in ks:
        total, stats = totals[k], totals[k]["stats"]
        rate = total["tokens"] / total["seconds"]
        rows.append({"k": k, "tokens": total["tokens"], "seconds": round(total["seconds"], 2),
                     "tokens_per_second": round(rate, 2), "speedup": round(rate / baseline, 3),
                     "acceptance": round(stats.acceptance_rate, 3) if k else None,
                     "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
                     "identical": sum(a == b for a, b in zip(total["outputs"], totals[0]["outputs"]))})
    return {"prompts": len(prompt_ids), "max_tokens": max_tokens, "rows": rows}

