"""Speculative settings side by side on one served release, interleaved prompt by prompt.

`specbuild bench` measures one cell after another; on a shared machine, load that changes between cells
moves their ratios (a cell can even show verification cheaper than one target step). Here every prompt
runs under every setting in turn (the order rotating), so drift falls on all settings alike, and each
setting's tokens/s is the sum of its tokens over the sum of its request times. Greedy, streamed.

    python benchmarks/interleaved.py --repository triton_repo --setting 0 --setting 2 --setting 2+lookup
"""

from __future__ import annotations

import argparse
import json

from specbuild.bench.runner import chat_prompts
from specbuild.serve.client import GenerationRequest, SpecbuildClient
from specbuild.bench.prompts import load_prompts
from specbuild.serve.server import TritonServer


def parse_setting(text: str) -> tuple[int, bool]:
    """"2" -> K=2 without prompt lookup, "2+lookup" -> K=2 with it."""
    k, _, extra = text.partition("+")
    if extra not in ("", "lookup"):
        raise argparse.ArgumentTypeError(f"setting {text!r}: use K or K+lookup, e.g. 2+lookup")
    return int(k), extra == "lookup"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", required=True)
    parser.add_argument("--setting", action="append", type=parse_setting, required=True)
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    settings = list(dict.fromkeys([(0, False), *args.setting]))
    with TritonServer(args.repository) as server:
        texts = chat_prompts(server.repository / "preprocessing" / "1" / "tokenizer", load_prompts(limit=args.prompts))
        client = SpecbuildClient(server.grpc_url)
        client.generate(texts[0], 8, num_draft_tokens=0, stream=True)  # warm-up
        totals = {s: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "texts": []} for s in settings}
        for index, text in enumerate(texts):
            shift = index % len(settings)
            for k, lookup in settings[shift:] + settings[:shift]:
                result = client.run(GenerationRequest(text, args.max_tokens, stream=True, num_draft_tokens=k,
                                                      prompt_lookup=lookup if k else None))
                total = totals[(k, lookup)]
                total["tokens"] += result.output_token_count or 0
                total["seconds"] += result.total_time
                total["drafted"] += result.total_draft_tokens or 0
                total["accepted"] += result.total_accepted_draft_tokens or 0
                total["texts"].append(result.text)
    baseline = totals[(0, False)]
    rows = []
    for (k, lookup), total in totals.items():
        rate = total["tokens"] / total["seconds"]
        rows.append({"setting": f"{k}{'+lookup' if lookup else ''}", "tokens": total["tokens"],
                     "tokens_per_second": round(rate, 2),
                     "speedup": round(rate / (baseline["tokens"] / baseline["seconds"]), 3),
                     "acceptance": round(total["accepted"] / total["drafted"], 3) if total["drafted"] else None,
                     "identical_to_k0": sum(a == b for a, b in zip(total["texts"], baseline["texts"]))})
    print(json.dumps({"prompts": len(texts), "max_tokens": args.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
