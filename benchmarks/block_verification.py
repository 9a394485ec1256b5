"""Block verification against token-by-token rejection: tokens per round on the same sampled requests, in process.

Every bundled benchmark prompt, at each temperature (top-p 0.9) and seed, is generated under both rules
(``speculation.verification``: token, block) with the same K, seed and draft-logits acceptance, by
:class:`~specbuild.runtimes.torch.inprocess.InProcessSpeculator` (no server). A request's tokens per round is
``1 + accepted / drafting rounds``; each rule's figure is the mean over requests, and the gain is the mean of the
per-request differences (block - token), each with a 95% interval (normal, over requests). Tokens per round does not
depend on the machine's load; the rules' outputs differ after their first differing round, so the pairing is by
request, not by round.

    python benchmarks/block_verification.py --pair .cache/tiny-pair --k 4 --seeds 4
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import click
from transformers import AutoTokenizer

from specbuild.bench.prompts import load_prompts
from specbuild.runtimes.torch.inprocess import InProcessSpeculator
from specbuild.speculation.modes import VERIFICATION_MODES
from specbuild.speculation.request import GenerationRequest
from specbuild.speculation.rules import SamplingParams


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval."""
    return statistics.fmean(values), 1.96 * statistics.stdev(values) / math.sqrt(len(values))


@click.command()
@click.option("--pair", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="a folder with target/ and draft/ checkpoints")
@click.option("--k", default=4, show_default=True, help="draft tokens per round")
@click.option("--seeds", default=4, show_default=True, help="seeds per prompt and temperature")
@click.option("--max-tokens", default=48, show_default=True)
@click.option("--temperature", "temperatures", multiple=True, type=float, default=(0.7, 1.0), show_default=True)
def main(pair: Path, k: int, seeds: int, max_tokens: int, temperatures: tuple[float, ...]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(pair / "target"))
    speculator = InProcessSpeculator.from_checkpoints(pair / "target", pair / "draft", max_draft_len=k)
    prompts = [tokenizer(prompt.prompt)["input_ids"] for prompt in load_prompts()]
    for temperature in temperatures:
        sampling = SamplingParams(temperature=temperature, top_p=0.9)
        per_rule: dict[str, list[float]] = {mode: [] for mode in VERIFICATION_MODES}
        for ids in prompts:
            for seed in range(seeds):
                for mode in VERIFICATION_MODES:
                    stats = speculator.generate(GenerationRequest(
                        ids, max_tokens, sampling=sampling, seed=seed, num_draft_tokens=k,
                        verification=mode)).stats
                    per_rule[mode].append(stats.mean_acceptance_length)
        gain = [block - token for token, block in zip(per_rule["token"], per_rule["block"])]
        figures = {**{mode: interval(values) for mode, values in per_rule.items()}, "block - token": interval(gain)}
        click.echo(f"temperature {temperature}, top-p 0.9, K={k}, {len(gain)} requests: " + "; ".join(
            f"{name} {mean:.3f} ± {half:.3f}" for name, (mean, half) in figures.items()) + " tokens per round")


if __name__ == "__main__":
    main()
