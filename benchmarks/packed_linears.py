"""What the torch engine's packed linears (``torch_engine.PackedLinear``) change: the output head's product for
1..5 rows and the pair's step costs (c, V(K)), torch's default product against the packed one, one thread.

Both variants are timed in turn within every repeat (interleaved), keeping each one's fastest time, so load
from other jobs affects them alike:

    python benchmarks/packed_linears.py --target .cache/demo-pair/target --draft .cache/demo-pair/draft
"""

from __future__ import annotations

import json
import time

import click
import torch
from transformers import AutoModelForCausalLM

from specbuild.bench.estimate import measure_step_costs
from specbuild.runtimes.torch.engine import PackedLinear, pack_linears

ROWS = (1, 2, 3, 4, 5)


def head_ms(target: str, repeats: int) -> dict[str, dict[int, float]]:
    head = AutoModelForCausalLM.from_pretrained(target).get_output_embeddings()
    variants = {"default": head, "packed": PackedLinear(head)}
    times: dict[str, dict[int, list[float]]] = {name: {rows: [] for rows in ROWS} for name in variants}
    with torch.inference_mode():
        for _ in range(repeats + 2):
            for rows in ROWS:
                x = torch.randn(1, rows, head.in_features)
                for name, linear in variants.items():
                    began = time.perf_counter()
                    linear(x)
                    times[name][rows].append(time.perf_counter() - began)
    return {name: {rows: round(min(t[2:]) * 1000, 2) for rows, t in per_rows.items()}
            for name, per_rows in times.items()}


@click.command()
@click.option("--target", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--draft", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--repeats", default=12, show_default=True, help="timed rounds per variant and block")
@click.option("--blocks", default=2, show_default=True, help="step-cost blocks, each variant once per block")
def main(target: str, draft: str, repeats: int, blocks: int) -> None:
    torch.set_num_threads(1)
    report: dict[str, object] = {"head_ms": head_ms(target, repeats)}
    pairs = {}
    for packed in (False, True):
        models = [AutoModelForCausalLM.from_pretrained(path).eval() for path in (target, draft)]
        if packed:
            for model in models:
                pack_linears(model)
        pairs["packed" if packed else "default"] = models
    steps: dict[str, list[dict[str, object]]] = {name: [] for name in pairs}
    for _ in range(blocks):
        for name, (target_model, draft_model) in pairs.items():
            costs = measure_step_costs(target_model, draft_model, 4, repeats=repeats)
            steps[name].append({"target_ms": round(costs.target_step_ms, 1), "draft_ms": round(costs.draft_step_ms, 1),
                                "c": round(costs.cost_ratio, 3),
                                "V": {k: round(v, 2) for k, v in costs.verify_cost.items()}})
    report["step_costs"] = steps
    click.echo(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
