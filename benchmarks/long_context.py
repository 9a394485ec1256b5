"""What long context does to a release's two costs of speculation, in process (docs/benchmarks.md, "Long prompts and
the draft's window"):

- ``verify``: the target's verification of 3 drafted tokens over its step, after N cached tokens, with transformers'
  ``sdpa`` (the keys copied per query head) and with the query heads packed as rows (runtimes/torch/attention.py),
  interleaved, median of ``--repeats``, and the largest logit difference between the two;
- ``agreement``: on each prompt of the long workload (bench/long_prompts.py), the target's greedy continuation, then
  the draft's teacher-forced greedy agreement with it reading the whole context or only its last W tokens (at
  positions from 0, as ``speculation.draft_context`` sends them), and what reading them took.

    python benchmarks/long_context.py verify RELEASE_ENGINES --lengths 256,1024,2048
    python benchmarks/long_context.py agreement RELEASE_ENGINES --windows 512,256,128
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import click

from specbuild.runtimes.torch.threads import spin_briefly, torch_threads

spin_briefly()  # before torch starts its thread pool, as the engine models do (runtimes/torch/threads.py)

import torch  # noqa: E402

from specbuild.runtimes.torch.engine import TorchEngine  # noqa: E402
from specbuild.speculation.engine_call import EngineRequest  # noqa: E402

DRAFTED = 3


def _numbers(text: str) -> list[int]:
    return [int(value) for value in text.split(",")]


@click.group()
def main() -> None:
    """Long-context costs of a torch release's engines (the folder holding target/ and draft/)."""


@main.command()
@click.argument("engines", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--lengths", default="256,1024,2048", help="cached tokens before each call")
@click.option("--repeats", default=12, show_default=True)
@click.option("--threads", default=2, show_default=True)
def verify(engines: Path, lengths: str, repeats: int, threads: int) -> None:
    """V(3) after N cached tokens, sdpa against packed query heads."""
    with torch_threads(threads):
        packed = TorchEngine(engines / "target", max_seq_len=max(_numbers(lengths)) + 16, max_draft_len=DRAFTED)
        stock = TorchEngine(engines / "target", max_seq_len=max(_numbers(lengths)) + 16, max_draft_len=DRAFTED)
        stock.model.set_attn_implementation("sdpa")
        for engine in (packed, stock):
            engine.warm_up()
        draw = random.Random(0)
        vocabulary = packed.vocab_size
        for length in _numbers(lengths):
            prompt = [draw.randrange(100, vocabulary) for _ in range(length)]
            drafts = [draw.randrange(100, vocabulary) for _ in range(DRAFTED)]
            seconds: dict[tuple[str, int], list[float]] = {}
            logits = {}
            for name, engine in (("sdpa", stock), ("packed", packed)):
                engine.run(EngineRequest(prompt, 1))  # the prompt in the prefix cache
                verified = engine.run(EngineRequest(prompt + [5], 1, draft_tokens=drafts, return_logits=True))
                logits[name] = verified.logits
            for _ in range(repeats):
                for name, engine in (("sdpa", stock), ("packed", packed)):
                    for k in (0, DRAFTED):
                        started = time.perf_counter()
                        engine.run(EngineRequest(prompt + [5], 1, draft_tokens=drafts[:k] or None))
                        seconds.setdefault((name, k), []).append(time.perf_counter() - started)
            median = {key: statistics.median(values) for key, values in seconds.items()}
            click.echo(json.dumps({
                "cached": length, "step_ms": round(median["packed", 0] * 1000, 1),
                "V3_sdpa": round(median["sdpa", DRAFTED] / median["sdpa", 0], 2),
                "V3_packed": round(median["packed", DRAFTED] / median["packed", 0], 2),
                "max_logit_difference": float((logits["sdpa"] - logits["packed"]).abs().max())}))


@main.command()
@click.argument("engines", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--windows", default="512,256,128", help="the last W tokens the draft reads")
@click.option("--tokens", default=48, show_default=True, help="target tokens per prompt")
@click.option("--threads", default=2, show_default=True)
def agreement(engines: Path, windows: str, tokens: int, threads: int) -> None:
    """The draft's greedy agreement with the target's continuation of each long prompt, by context read."""
    from transformers import AutoTokenizer

    from specbuild.bench.long_prompts import long_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(engines / "target"))
    with torch_threads(threads):
        target = TorchEngine(engines / "target", max_seq_len=4096, cache_tokens=0)
        draft = TorchEngine(engines / "draft", max_seq_len=4096, cache_tokens=0)
        for kind, text in long_prompts():
            prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                        add_generation_prompt=True, tokenize=True, return_dict=False))
            answer = target.run(EngineRequest(prompt, tokens, end_id=tokenizer.eos_token_id)).tokens
            sequence = torch.tensor(prompt + answer)
            row: dict[str, object] = {"kind": kind, "prompt": len(prompt), "answer": len(answer)}
            for window in (None, *_numbers(windows)):
                start = 0 if window is None else max(0, len(prompt) - window)
                started = time.perf_counter()
                logits = draft.sequence_logits(sequence[start:])
                label = "whole" if window is None else str(window)
                row[f"read_s_{label}"] = round(time.perf_counter() - started, 2)
                guesses = logits[len(prompt) - start - 1:-1].argmax(-1)
                row[f"agree_{label}"] = round(float((guesses == sequence[len(prompt):]).float().mean()), 3)
            click.echo(json.dumps(row))


if __name__ == "__main__":
    main()
