"""Everyday-advice chat traffic for the capture scenario (docs/benchmarks.md, "A draft that learns its traffic").

The bundled benchmark's weakest kind for the demo draft is chat; this composes many prompts of that kind (a
situation and an ask, each from its own list, none taken from the bundled prompts or the distillation pool's
templates in ``drafts/distill_prompts.py``), shuffled by a seed, as a ``bench --prompts`` file; and sends such a
file to a served release as its users would: in the release's chat template, with the release's own settings (no
per-request K or lookup), at a given concurrency:

    python benchmarks/chat_traffic.py write --count 110 --out /tmp/chat_traffic.jsonl
    python benchmarks/chat_traffic.py send 127.0.0.1:8001 --prompts /tmp/chat_traffic.jsonl \
        --tokenizer REPO/preprocessing/1/tokenizer --concurrency 4
"""

from __future__ import annotations

import itertools
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from specbuild.bench.prompts import load_prompts
from specbuild.bench.sweep import chat_prompts as in_chat_template
from specbuild.serve.client import SpecbuildClient

SITUATIONS = (
    "my flatmate never washes the dishes", "I start a new job on Monday", "my grandmother is moving in with us",
    "I want to run my first 10k race in spring", "our team missed an important deadline",
    "my teenage son spends all night gaming", "I have to give a toast at my sister's wedding",
    "my sourdough bread never rises", "I am moving to a country where I do not speak the language",
    "my best friend forgot my birthday", "I want to save money for a used car", "my cat scratches the sofa",
    "I feel nervous before every video call", "my tomato plants have yellow leaves",
    "I was asked to lead a meeting for the first time", "my neighbour's dog barks every morning",
    "I want to read more books this year", "my laptop has become very slow",
    "I am hosting eight people for dinner on Saturday", "my manager gives feedback only in public",
    "I want to learn to swim as an adult", "my daughter is afraid of the dark",
    "I need to pick a present for a coworker I barely know", "I keep waking up at 4 a.m.",
    "my bike chain keeps falling off", "I am visiting Japan for the first time in April",
    "my parents argue about money", "I got a parking ticket I think is unfair",
    "I want to start a vegetable garden on a small budget", "my houseplants keep dying in winter",
    "I was offered two jobs at once", "my roommate's boyfriend practically lives with us",
    "I have a fear of flying and a trip next month", "my old friends and I are drifting apart",
    "I want to cook more and order less takeaway", "my landlord will not fix the heating",
    "I have to write a cover letter tonight", "my toddler refuses to eat vegetables",
    "I need to pack a whole flat into boxes this weekend", "I want to volunteer but have little time",
)
ASKS = (
    "What would you do in my place?", "How should I handle it?", "Any advice?", "What are my options?",
    "Can you give me a simple plan?", "What is a kind way to deal with this?", "Where do I even start?",
    "What mistakes should I avoid?", "Could you suggest a few first steps?", "How do other people manage this?",
    "Is there a quick fix, or should I be patient?", "What would a sensible friend tell me?",
)
OPENERS = ("", "Hi, ", "Hello! ", "Quick question: ", "I need some help. ")


def chat_prompts(count: int, seed: int) -> list[str]:
    """``count`` distinct prompts, each a situation and an ask, in a seeded order."""
    combos = list(itertools.product(OPENERS, SITUATIONS, ASKS))
    random.Random(seed).shuffle(combos)
    if count > len(combos):
        raise click.UsageError(f"--count: at most {len(combos)} distinct prompts")
    return [f"{opener}{situation[0].upper() if not opener else situation[0]}{situation[1:]}. {ask}"
            for opener, situation, ask in combos[:count]]


@click.group()
def main() -> None:
    """Write chat traffic, or send it to a served release."""


@main.command()
@click.option("--count", default=160, show_default=True, help="prompts to write")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path))
def write(count: int, seed: int, out: Path) -> None:
    lines = [json.dumps({"category": "chat", "prompt": text}) for text in chat_prompts(count, seed)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    click.echo(f"{len(lines)} chat prompts -> {out}")


@main.command()
@click.argument("url")
@click.option("--prompts", "prompts_file", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", required=True, type=click.Path(exists=True, file_okay=False),
              help="the release's tokenizer (REPO/preprocessing/1/tokenizer): its chat template wraps each prompt")
@click.option("--concurrency", default=4, show_default=True)
@click.option("--max-tokens", default=64, show_default=True)
def send(url: str, prompts_file: str, tokenizer: str, concurrency: int, max_tokens: int) -> None:
    """Each prompt once, to the release's gRPC URL, ``concurrency`` at a time; a line of totals."""
    texts = in_chat_template(tokenizer, load_prompts(prompts_file))
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda text: SpecbuildClient(url).generate(text, max_tokens), texts))
    click.echo(json.dumps({"requests": len(done), "seconds": round(time.monotonic() - started, 1),
                           "tokens": sum(item.output_token_count or 0 for item in done)}))


if __name__ == "__main__":
    main()
