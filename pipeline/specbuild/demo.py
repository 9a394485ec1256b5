"""``specbuild demo``: the whole product on the embedded default, end to end.

Make the demo pair (SmolLM2-135M-Instruct and the draft specbuild ships for it, offline), compile it with
the ``torch`` runtime, start the bundled Triton server, stream one answer through the ensemble with
speculation on, ask the same question with speculation off for comparison, print both with their
acceptance figures and where the accepted draft tokens came from, stop the server.

The SmolLM2 release drafts by prompt lookup first and by its distilled draft model when lookup finds
nothing (:data:`DEMO_SPECULATION`). The tiny pair's draft drafts alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specbuild.terminal import make_console

if TYPE_CHECKING:
    from specbuild.bench.metrics import Counters

DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."
# K measured on this release (docs/benchmarks.md, "Cheap verification"): with the torch engine's packed linears,
# verifying one drafted token costs 1.05-1.23 target steps on 2 cores, and K=1 with lookup is the fastest setting
# (1.27x in process, 1.05x through the server on a loaded machine, interleaved against K=0); K=2-4 gain nothing more.
DEMO_SPECULATION = {"speculation.num_draft_tokens": 1, "speculation.prompt_lookup.enabled": True}


def token_sources(counters: Counters) -> str:
    """Where one request's tokens came from, from the orchestrator's counter deltas over it: accepted draft
    tokens by source (the draft model, prompt lookup), and the tokens the target made itself."""
    model, lookup = counters.source("model"), counters.source("lookup")
    own = counters.output_tokens - counters.accepted_tokens
    return (f"{model['accepted_tokens']:.0f} accepted from the draft model (of {model['drafted_tokens']:.0f} "
            f"drafted), {lookup['accepted_tokens']:.0f} from prompt lookup (of {lookup['drafted_tokens']:.0f} "
            f"drafted), {own:.0f} made by the target itself, in {counters.rounds:.0f} target steps")


@dataclass
class DemoResult:
    text: str
    speculative: Any  # client.Generation with speculation on
    baseline: Any  # the same request with num_draft_tokens=0
    repository: Path

    @property
    def identical(self) -> bool:
        return self.text == self.baseline.text


def run_demo(workdir: str | Path = ".", *, question: str = DEFAULT_PROMPT, max_tokens: int = 64,
             num_draft_tokens: int | None = None, tiny: bool = False, console: Console | None = None) -> DemoResult:
    from specbuild import compiler
    from specbuild.bench.prompts import Prompt
    from specbuild.bench.runner import chat_prompts, read_counters
    from specbuild.drafts.model_pairs import pair_dir, progress_display
    from specbuild.runtimes.names import TORCH
    from specbuild.serve.client import GenerationRequest, SpecbuildClient
    from specbuild.serve.server import TritonServer
    from specbuild.spec import load_spec

    console = console or make_console()
    workdir = Path(workdir).resolve()
    console.rule("[bold]1/4 demo models")
    folder = pair_dir("tiny" if tiny else "demo", workdir)
    console.print(f"the pair's folder: {folder} (built once, shared with the tests; $SPECBUILD_CACHE moves it)",
                  highlight=False)
    with progress_display(console) as progress:
        if tiny:
            from specbuild.drafts.tiny_models import build_tiny_pair

            pair = build_tiny_pair(folder, progress=progress)
        else:
            from specbuild.drafts.demo_models import build_demo_pair

            pair = build_demo_pair(folder, progress=progress)
    console.rule("[bold]2/4 compile (torch runtime)")
    spec = load_spec(None, {
        "name": "tiny" if tiny else "demo", "runtime": TORCH,
        "target.checkpoint": str(pair.target_dir), "draft.checkpoint": str(pair.draft_dir),
        "outputs.build_dir": str(workdir / "build"), "outputs.engines_dir": str(workdir / "engines"),
        "outputs.repository_dir": str(workdir / "triton_repo"),
        **({} if tiny else DEMO_SPECULATION),
    }, base_dir=workdir)
    result = compiler.run(spec, console=console)
    console.rule("[bold]3/4 serve (Triton, loopback)")
    with contextlib.ExitStack() as running:
        with console.status("starting Triton and loading the models"):
            server = running.enter_context(TritonServer(result.repository))
        console.print(f"server ready: gRPC {server.grpc_url}, HTTP {server.http_url}, metrics {server.metrics_url}")
        client = SpecbuildClient(server.grpc_url)
        [prompt] = chat_prompts(result.repository / "preprocessing" / "1" / "tokenizer",
                                [Prompt(category="chat", prompt=question)])
        console.rule("[bold]4/4 generate (streamed, speculation on)")
        console.print(f"[bold]question:[/] {question}")
        source = "the draft model" if tiny else "prompt lookup, and the distilled draft model when lookup finds nothing"
        console.print(f"[bold]drafts from:[/] {source}")
        client.generate(prompt, 1, num_draft_tokens=0, stream=True)  # warm-up, so neither timed run pays it
        request = GenerationRequest(prompt, max_tokens, stream=True, num_draft_tokens=num_draft_tokens)
        before = read_counters(server.metrics_url)
        speculative = client.run(request, on_chunk=lambda chunk: console.print(
            chunk.text, end="", highlight=False, markup=False, soft_wrap=True))
        after = read_counters(server.metrics_url)
        console.print()
        console.print(f"[bold]speculative:[/] {speculative.summary()}")
        if before is not None and after is not None:
            console.print(f"[bold]where the tokens came from:[/] {token_sources(after - before)}")
        # Streamed too, so both runs pay the same per-response cost and their tokens/s compare.
        baseline = client.generate(prompt, max_tokens, num_draft_tokens=0, stream=True)
        console.print(f"[bold]target alone:[/] {baseline.summary()}")
        if speculative.tokens_per_second and baseline.tokens_per_second:
            ratio = speculative.tokens_per_second / baseline.tokens_per_second
            console.print(f"speculative / target alone: [bold]{ratio:.2f}x[/] tokens/s "
                          "(one request; `specbuild bench` measures properly)")
    demo = DemoResult(speculative.text, speculative, baseline, result.repository)
    verdict = "identical" if demo.identical else "DIFFERENT (please report this)"
    console.print(f"greedy output with and without speculation: [bold]{verdict}[/]")
    return demo
