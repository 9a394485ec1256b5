"""Peers side by side: one target/draft pair, the same prompts, the same K, greedy.

Runs, prompt by prompt and in turn (each warmed up first):

1. the target alone: Hugging Face ``generate``;
2. Hugging Face assisted generation (``assistant_model=``, K fixed: constant schedule, no confidence cut);
3. specbuild's in-process speculator (:class:`specbuild.runtimes.torch.inprocess.InProcessSpeculator`);
4. the specbuild server (Triton, the release's ensemble), at K and at K=0;

and prints each one's output tokens/s, its ratio to the target alone, and whether its outputs equal the
target's. Run time is bounded by ``--prompts`` and ``--max-tokens``.

    python benchmarks/peers.py --target .cache/tiny-pair/target --draft .cache/tiny-pair/draft --prompts 8 --k 2
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)


@dataclass
class PeerRun:
    name: str
    generate: Callable[[int], tuple[int, Any]] = field(repr=False)  # prompt index -> (tokens, output)
    tokens: int = 0
    seconds: float = 0.0
    outputs: list[Any] = field(default_factory=list)  # token ids (in process) or text (server)
    identical: int | None = None
    ratio: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "tokens_per_second": round(self.tokens_per_second, 2), "ratio": self.ratio,
                "identical": self.identical, "prompts": len(self.outputs)}


def measure(runs: list[PeerRun], prompts: int) -> None:
    """Warm every system up on the first prompt, then time them prompt by prompt, in turn, so that load from
    other work on a shared machine falls on all of them alike."""
    for run in runs:
        run.generate(0)
    for index in range(prompts):
        for run in runs:
            started = time.perf_counter()
            count, output = run.generate(index)
            run.seconds += time.perf_counter() - started
            run.tokens += count
            run.outputs.append(output)
        console.print(f"  prompt {index + 1}/{prompts} done", highlight=False)


def hf_runs(target_dir: Path, draft_dir: Path, prompt_ids: list[list[int]], k: int, max_tokens: int,
            eos: int) -> list[PeerRun]:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    def load(path: Path) -> Any:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True).eval()

    target, draft = load(target_dir), load(draft_dir)
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0

    def generate(index: int, **extra: Any) -> tuple[int, list[int]]:
        ids = prompt_ids[index]
        with torch.inference_mode():
            out = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                                  **extra)
        new = out[0, len(ids):].tolist()
        new = new[: new.index(eos)] if eos in new else new
        return len(new), new

    return [PeerRun("target alone (HF generate)", generate),
            PeerRun(f"HF assisted K={k}", lambda index: generate(index, assistant_model=draft))]


def inprocess_run(target_dir: Path, draft_dir: Path, prompt_ids: list[list[int]], k: int, max_tokens: int,
                  eos: int) -> PeerRun:
    from specbuild.speculation.request import TokenRequest
    from specbuild.runtimes.torch.inprocess import InProcessSpeculator

    speculator = InProcessSpeculator.from_checkpoints(target_dir, draft_dir, max_draft_len=max(k, 1))

    def generate(index: int) -> tuple[int, list[int]]:
        result = speculator.generate(TokenRequest(prompt_ids=prompt_ids[index], max_tokens=max_tokens,
                                                       end_id=eos, num_draft_tokens=k))
        return len(result.tokens), result.tokens

    return PeerRun(f"specbuild in process K={k}", generate)


def server_runs(server: Any, texts: list[str], k: int, max_tokens: int) -> list[PeerRun]:
    from specbuild.serve.client import SpecbuildClient

    client = SpecbuildClient(server.grpc_url)

    def run(num_draft_tokens: int) -> PeerRun:
        def generate(index: int) -> tuple[int, str]:
            generation = client.generate(texts[index], max_tokens, num_draft_tokens=num_draft_tokens)
            return generation.output_token_count or 0, generation.text

        return PeerRun(f"specbuild server K={num_draft_tokens}", generate)

    return [run(k), run(0)]


def compile_pair(target: Path, draft: Path, workdir: Path, max_draft_len: int) -> Path:
    """The pair's release with the torch runtime (steps already done are skipped)."""
    from specbuild import compiler
    from specbuild.spec import load_spec

    spec = load_spec(None, {
        "name": "peers", "runtime": "torch", "target.checkpoint": str(target), "draft.checkpoint": str(draft),
        "speculation.max_draft_len": max_draft_len, "outputs.build_dir": str(workdir / "build"),
        "outputs.engines_dir": str(workdir / "engines"), "outputs.repository_dir": str(workdir / "triton_repo"),
    })
    return compiler.run(spec, console=console).repository


def table(runs: list[PeerRun]) -> Table:
    result = Table(title="peers: same pair, prompts and K; greedy", title_justify="left")
    for name in ("system", "tokens", "seconds", "tokens/s", "vs target", "= target"):
        result.add_column(name, justify="left" if name == "system" else "right")
    for run in runs:
        result.add_row(run.name, str(run.tokens), f"{run.seconds:.1f}", f"{run.tokens_per_second:.1f}",
                       "-" if run.ratio is None else f"{run.ratio:.2f}x",
                       "-" if run.identical is None else f"{run.identical}/{len(run.outputs)}")
    return result


@click.command()
@click.option("--target", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--draft", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--repository", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="the pair's compiled repository  [default: compile it into --workdir]")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("build/peers"),
              show_default=True)
@click.option("--k", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--prompts", "num_prompts", type=click.IntRange(1, 200), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 1024), default=64, show_default=True)
@click.option("--no-server", is_flag=True, help="skip the Triton server rows")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the figures here")
def main(target: Path, draft: Path, repository: Path | None, workdir: Path, k: int, num_prompts: int,
         max_tokens: int, no_server: bool, json_path: Path | None) -> None:
    """Target alone, HF assisted generation, specbuild in process and the specbuild server, side by side."""
    from transformers import AutoTokenizer

    from specbuild.bench.sweep import chat_prompts
    from specbuild.bench.prompts import load_prompts

    prompts = load_prompts(limit=num_prompts)
    texts = chat_prompts(target, prompts)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    prompt_ids = [tokenizer.encode(text) for text in texts]  # as the server's preprocessing encodes them
    eos = int(tokenizer.eos_token_id)
    console.print(f"{len(prompts)} prompts, K={k}, max_tokens {max_tokens}, greedy")
    with contextlib.ExitStack() as stack:
        runs = hf_runs(target, draft, prompt_ids, k, max_tokens, eos)
        runs.append(inprocess_run(target, draft, prompt_ids, k, max_tokens, eos))
        if not no_server:
            from specbuild.serve.server import TritonServer

            release = repository or compile_pair(target, draft, workdir, max(k, 8))
            server = stack.enter_context(TritonServer(release, startup_timeout=300))
            runs += server_runs(server, texts, k, max_tokens)
        measure(runs, len(prompts))
    reference = runs[0]
    reference_texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in reference.outputs]
    for run in runs:
        run.ratio = run.tokens_per_second / reference.tokens_per_second if reference.tokens_per_second else None
        expected = reference_texts if run.outputs and isinstance(run.outputs[0], str) else reference.outputs
        run.identical = sum(a == b for a, b in zip(run.outputs, expected))
    Console().print(table(runs))
    if json_path:
        json_path.write_text(json.dumps([run.to_dict() for run in runs], indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
