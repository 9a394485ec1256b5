"""Block verification against token-by-token rejection: tokens per round on the same sampled requests, in process.

Every bundled benchmark prompt, at each temperature (top-p 0.9) and with ``--seeds`` seeds of its own, is generated
under both rules (``speculation.verification``: token, block) with the same K and seed, draft-logits acceptance, by
:class:`~specbuild.runtimes.torch.inprocess.InProcessSpeculator` (no server). Two figures per temperature, each
with a 95% interval (normal approximation):

- **realized**: a request's tokens per round, ``1 + accepted / drafting rounds``, averaged over requests, and the
  mean per-request difference block - token. The rules' texts part after their first differing round, so this
  pairing is by request only and carries the variance of the sampled texts;
- **expected, same blocks**: at every round of both runs that verified K drafts, both rules' exact expected
  accepted length for the block drafted there (:func:`~specbuild.speculation.rules.expected_accepted`, from the
  verifier's own p and q), so both are judged on the same contexts and the same drafted blocks. This figure is
  the rules' difference without the texts' variance; the realized one checks that the served rule delivers it.

Tokens per round does not depend on the machine's load.

    python benchmarks/block_verification.py --pair .cache/tiny-pair --k 4 --seeds 1
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import click
import torch
from transformers import AutoTokenizer

from specbuild.bench.prompts import load_prompts
from specbuild.runtimes.torch import engine as torch_engine
from specbuild.runtimes.torch.inprocess import InProcessSpeculator
from specbuild.speculation.modes import VERIFICATION_MODES
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.rules import SamplingParams, Verification, expected_accepted, probabilities, verify


def interval(values: list[float]) -> str:
    """Mean ± the half-width of its 95% interval."""
    return f"{statistics.fmean(values):.3f} ± {1.96 * statistics.stdev(values) / math.sqrt(len(values)):.3f}"


def observed_verify(blocks: list[tuple[float, float]], k: int):
    """The engine's :func:`verify`, unchanged, noting both rules' expected accepted length for each block of k."""
    def observe(drafts: list[int], target: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                draft: torch.Tensor | None = None, mode: str = "token") -> Verification:
        if draft is not None and len(drafts) == k and not params.is_greedy:
            p, q = probabilities(target, params), probabilities(draft, params)
            blocks.append((expected_accepted(drafts, q, p, "token"), expected_accepted(drafts, q, p, "block")))
        return verify(drafts, target, params, generator, draft, mode)
    return observe


@click.command()
@click.option("--pair", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="a folder with target/ and draft/ checkpoints")
@click.option("--k", default=4, show_default=True, help="draft tokens per round")
@click.option("--seeds", default=1, show_default=True, help="seeds per prompt and temperature")
@click.option("--max-tokens", default=32, show_default=True)
@click.option("--temperature", "temperatures", multiple=True, type=float, default=(0.7, 1.0), show_default=True)
def main(pair: Path, k: int, seeds: int, max_tokens: int, temperatures: tuple[float, ...]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(pair / "target"))
    speculator = InProcessSpeculator.from_checkpoints(pair / "target", pair / "draft", max_draft_len=k)
    prompts = [tokenizer(prompt.prompt)["input_ids"] for prompt in load_prompts()]
    blocks: list[tuple[float, float]] = []
    torch_engine.verify = observed_verify(blocks, k)  # the target engine's verification, observed
    for temperature in temperatures:
        sampling = SamplingParams(temperature=temperature, top_p=0.9)
        realized: dict[str, list[float]] = {mode: [] for mode in VERIFICATION_MODES}
        blocks.clear()
        for index, ids in enumerate(prompts):
            for seed in range(index * seeds, (index + 1) * seeds):  # a seed of its own per request: independent draws
                for mode in VERIFICATION_MODES:
                    stats = speculator.generate(TokenRequest(
                        ids, max_tokens, sampling=sampling, seed=seed, num_draft_tokens=k, verification=mode)).stats
                    realized[mode].append(stats.mean_acceptance_length)
        gain = [block - token for token, block in zip(realized["token"], realized["block"])]
        click.echo(f"temperature {temperature}, top-p 0.9, K={k}: realized over {len(gain)} requests: token "
                   f"{interval(realized['token'])}, block {interval(realized['block'])}, block - token "
                   f"{interval(gain)}; expected on the same {len(blocks)} drafted blocks: token "
                   f"{interval([1 + t for t, _ in blocks])}, block {interval([1 + b for _, b in blocks])}, "
                   f"block - token {interval([b - t for t, b in blocks])} tokens per round")


if __name__ == "__main__":
    main()
