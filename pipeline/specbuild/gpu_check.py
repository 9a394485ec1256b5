"""``scripts/gpu-check.sh``: one short check of the torch runtime on a GPU, in process.

For a machine that has a CUDA GPU, PyTorch and transformers and nothing else: it installs nothing and downloads
nothing (the tiny pair is made from the Python standard library's sources). It checks that greedy speculative
decoding is token-identical to the target alone at K = 0, 2 and 4, and measures what decides the speedup:
the target's step, the verification cost V(K) of K+1 tokens and the draft's per-token cost c (both in target
steps, at a realistic context; :func:`specbuild.bench.estimate.measure_step_costs`), tokens/s at each K, and the
speedup the analytic model expects from them (:func:`specbuild.speculation.cost.expected_speedup`). Besides the tiny pair it times a sized pair with random
weights (the shapes of a ~1B target and a 2-layer draft of the same width), where only the costs mean anything.

    python -m specbuild.gpu_check --device cuda [--json report.json]

Imports only torch, transformers, tokenizers, safetensors, numpy, pyyaml, click and rich (besides specbuild itself,
from its source tree; ``tests/device_machine.py`` runs it with everything else unimportable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

KS = (0, 2, 4)
SIZED = {"target": {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "intermediate": 8192},
         "draft": {"layers": 2, "hidden": 2048, "heads": 16, "kv_heads": 8, "intermediate": 8192}}


def _sized_model(sizes: dict[str, int], vocab: int, device: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=sizes["hidden"], num_hidden_layers=sizes["layers"],
                         num_attention_heads=sizes["heads"], num_key_value_heads=sizes["kv_heads"],
                         intermediate_size=sizes["intermediate"], max_position_embeddings=4096)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16 if device.startswith("cuda")
                                       else torch.float32).eval()


def speculation(target_dir: Path, draft_dir: Path, device: str, prompts: list[list[int]], max_tokens: int,
                end_id: int | None) -> dict[str, Any]:
    """Greedy generation at each K on the same prompts, interleaved: identity with K=0, tokens/s, acceptance."""
    from specbuild.runtimes.torch.inprocess import InProcessSpeculator
    from specbuild.speculation.request import TokenRequest

    speculator = InProcessSpeculator.from_checkpoints(target_dir, draft_dir, max_draft_len=max(KS), device=device)
    speculator.generate(TokenRequest(prompts[0], 4, num_draft_tokens=max(KS)))  # warm-up (CUDA kernels)
    totals = {k: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "outputs": []} for k in KS}
    for index, prompt in enumerate(prompts):
        for k in (KS if index % 2 == 0 else KS[::-1]):
            started = time.perf_counter()
            result = speculator.generate(TokenRequest(prompt, max_tokens, end_id=end_id, num_draft_tokens=k))
            total = totals[k]
            total["seconds"] += time.perf_counter() - started
            total["tokens"] += len(result.tokens)
            total["drafted"] += result.stats.drafted_tokens
            total["accepted"] += result.stats.accepted_tokens
            total["outputs"].append(result.tokens)
    baseline = totals[0]["tokens"] / totals[0]["seconds"]
    return {f"K={k}": {"tokens_per_second": round(t["tokens"] / t["seconds"], 1),
                       "speedup": round(t["tokens"] / t["seconds"] / baseline, 3),
                       "acceptance": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
                       "identical_to_k0": sum(a == b for a, b in zip(t["outputs"], totals[0]["outputs"])),
                       "prompts": len(prompts)} for k, t in totals.items()}


def run(device: str, cache: Path, prompts: int = 12, max_tokens: int = 48, sized: bool = True) -> dict[str, Any]:
    import torch

    from specbuild.bench.estimate import COST_CONTEXT, measure_step_costs
    from specbuild.speculation.cost import expected_speedup, leviathan_tokens_per_step
    from specbuild.drafts.tiny_models import build_tiny_pair
    from specbuild.runtimes.torch.engine import TorchEngine

    started = time.perf_counter()
    report: dict[str, Any] = {"device": device, "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None}
    pair = build_tiny_pair(cache / "tiny-pair")
    tokenizer_prompts = [list(range(3 + i, 3 + i + 5 + i % 7)) for i in range(prompts)]
    report["tiny_pair"] = speculation(pair.target_dir, pair.draft_dir, device, tokenizer_prompts, max_tokens, None)
    identical = all(row["identical_to_k0"] == row["prompts"] for row in report["tiny_pair"].values())
    engines = [TorchEngine(path, device=device) for path in (pair.target_dir, pair.draft_dir)]
    pairs = {"tiny_pair": (engines[0].model, engines[1].model)}
    if sized:
        pairs["sized_random_pair"] = tuple(_sized_model(SIZED[role], 32000, device) for role in ("target", "draft"))
    costs = {}
    for name, (target, draft) in pairs.items():
        measured = measure_step_costs(target, draft, max(KS))
        costs[name] = {"target_step_ms": round(measured.target_step_ms, 3), "c": round(measured.cost_ratio, 4),
                       **{f"V({k})": round(measured.verify_cost[k], 4) for k in KS[1:]},
                       # what the analytic model expects from these costs at a per-token acceptance of 0.6
                       "expected_speedup_at_a=0.6": {
                           f"K={k}": round(expected_speedup(leviathan_tokens_per_step(0.6, k), k, measured.cost_ratio,
                                                            measured.verify_cost[k]), 3) for k in KS[1:]}}
    report["step_costs"] = {**costs, "sized_shapes": SIZED if sized else None, "context_tokens": COST_CONTEXT}
    report["greedy_identical"] = identical
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--cache", type=Path, default=Path(".cache"), help="where the tiny pair is made or found")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--no-sized", dest="sized", action="store_false",
                        help="skip the ~1B random pair (its costs are what the check is for on a GPU)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA GPU is visible to PyTorch (pass --device cpu to run the check on the CPU)",
              file=sys.stderr)
        return 2
    report = run(args.device, args.cache, args.prompts, args.max_tokens, args.sized)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_path:
        args.json_path.write_text(text + "\n", encoding="utf-8")
    return 0 if report["greedy_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
