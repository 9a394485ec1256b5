"""Would a draft head over a frequency-ranked sub-vocabulary pay? Cost and agreement, measured.

A draft whose output head covers only the N token ids the target uses most stays exact (the target
verifies every token, and rejection sampling would use the draft's own distribution, zero outside the N
ids), but it can never propose the other ids. This measures both sides on one target and its drafts:

- **ranking**: as ``specbuild head-vocabulary`` ranks (:mod:`specbuild.drafts.target_ranking`): the target's
  greedy answers to local distillation prompts (never the benchmark set), ids by their count, then by id;
- **agreement**: teacher-forced on the target's greedy answers to the bundled benchmark prompts, the share
  of positions where the draft's argmax equals the target's token, over the full head and over each
  sub-vocabulary (plus the share of the target's tokens the sub-vocabulary contains at all), and the
  greedy acceptance at K=1..4 that follows from it;
- **cost**: one decode step after a 200-token cache, median milliseconds, every variant in turn per repeat
  (interleaved), with the full head and with each reduced head, against the target's step.

    python benchmarks/reduced_head.py --target .cache/demo-pair/target --draft layers2=DIR --draft layers4=DIR
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from specbuild.bench.acceptance import acceptance_by_k
from specbuild.bench.prompts import load_prompts
from specbuild.bench.sweep import chat_prompts
from specbuild.drafts.distill import DraftOptions
from specbuild.drafts.distill_data import target_answers
from specbuild.drafts.target_ranking import rank_for_target

CONTEXT = 200


def held_out_answers(target, tokenizer, prompts: int, max_new_tokens: int) -> list[tuple[torch.Tensor, int]]:
    """The target's greedy answers (float32) to the first bundled benchmark prompts: (sequence, prompt length)."""
    texts = chat_prompts(target.name_or_path, load_prompts(limit=prompts))
    options = DraftOptions(prompts=2, held_out=1, max_new_tokens=max_new_tokens, generate_batch=16)
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    return [(torch.tensor(sequence), prompt_len)
            for sequence, prompt_len in target_answers(target, tokenizer, encoded, options, float("inf"), None)]


def agreement(draft, answers, heads: dict[str, torch.Tensor | None]) -> dict[str, dict]:
    """Per head (None: the full head), teacher-forced argmax agreement, acceptance at K=1..4 and coverage."""
    matches = {name: [] for name in heads}
    covered = {name: [0, 0] for name in heads}
    with torch.inference_mode():
        for sequence, prompt_len in answers:
            hidden = draft.model(input_ids=sequence[None]).last_hidden_state[0, prompt_len - 1:-1]
            wanted = sequence[prompt_len:]
            for name, ids in heads.items():
                if ids is None:
                    predicted = draft.lm_head(hidden).argmax(-1)
                else:
                    predicted = ids[(hidden @ draft.lm_head.weight[ids].T).argmax(-1)]
                    covered[name][0] += int(torch.isin(wanted, ids).sum())
                covered[name][1] += len(wanted)
                matches[name].append((predicted == wanted).tolist())
    result = {}
    for name, rows in matches.items():
        flat = [m for row in rows for m in row]
        result[name] = {"agreement": round(sum(flat) / len(flat), 4), "acceptance": acceptance_by_k(rows, 4),
                        "coverage": round(covered[name][0] / covered[name][1], 4) if heads[name] is not None else 1.0}
    return result


def step_costs(target, drafts: dict, heads: dict[str, torch.Tensor | None], repeats: int) -> dict[str, float]:
    """Median ms of one decode step after a CONTEXT-token cache: the target, then every draft with every head,
    all in turn within each repeat."""
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, target.config.vocab_size, (1, CONTEXT), generator=generator)
    step = torch.randint(0, target.config.vocab_size, (1, 1), generator=generator)
    variants = {"target": (target, None)}
    for draft_name, draft in drafts.items():
        for head_name, ids in heads.items():
            weight = None if ids is None else draft.lm_head.weight[ids].contiguous()
            variants[f"{draft_name} {head_name}"] = (draft, weight)
    caches = {}
    with torch.inference_mode():
        for name, (model, _) in variants.items():
            caches[name] = DynamicCache()
            model(input_ids=prefix, use_cache=True, past_key_values=caches[name])
        times = {name: [] for name in variants}
        for _ in range(repeats + 2):
            for name, (model, weight) in variants.items():
                began = time.perf_counter()
                if weight is None:
                    model(input_ids=step, use_cache=True, past_key_values=caches[name]).logits.float()
                else:
                    hidden = model.model(input_ids=step, use_cache=True, past_key_values=caches[name]).last_hidden_state
                    (hidden[:, -1] @ weight.T).float()
                times[name].append(time.perf_counter() - began)
                caches[name].crop(-1)
    return {name: round(statistics.median(values[2:]) * 1000, 2) for name, values in times.items()}


@click.command()
@click.option("--target", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--draft", "drafts", multiple=True, required=True, help="NAME=DIR (repeatable)")
@click.option("--sizes", default="8192,16384", show_default=True, help="sub-vocabulary sizes")
@click.option("--rank-prompts", type=int, default=256, show_default=True)
@click.option("--eval-prompts", type=int, default=40, show_default=True)
@click.option("--max-new-tokens", type=int, default=96, show_default=True)
@click.option("--repeats", type=int, default=40, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
def main(target: Path, drafts: tuple[str, ...], sizes: str, rank_prompts: int, eval_prompts: int,
         max_new_tokens: int, repeats: int, threads: int) -> None:
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, use_safetensors=True).eval()
    loaded = {name: AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True).eval()
              for name, folder in (item.split("=", 1) for item in drafts)}
    started = time.perf_counter()
    cuts = [int(size) for size in sizes.split(",")]
    ranking = rank_for_target(target, max(cuts), prompts=rank_prompts, max_new_tokens=max_new_tokens,
                              threads=threads)
    rank_seconds = time.perf_counter() - started
    ids = torch.tensor(ranking.ids)
    heads = {"full": None, **{f"{size // 1024}k": ids[:size].sort().values for size in cuts}}
    answers = held_out_answers(model, tokenizer, eval_prompts, max_new_tokens)
    counted = {key: ranking.provenance[key] for key in ("answer_tokens", "distinct_ids")}
    report = {"ranking": {"prompts": rank_prompts, **counted, "seconds": round(rank_seconds, 1)},
              "held_out": {"prompts": eval_prompts, "positions": sum(len(s) - p for s, p in answers)},
              "agreement": {name: agreement(draft, answers, heads) for name, draft in loaded.items()},
              "step_ms": step_costs(model, loaded, heads, repeats)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
