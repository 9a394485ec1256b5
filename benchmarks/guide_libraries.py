"""xgrammar (what specbuild uses) against llguidance on one tokenizer: tokenizer set-up, a JSON schema's compile,
and the per-token mask cost along a real answer (median, mean and worst token), with and without a string
``maxLength`` (which xgrammar 0.1.25 pays for inside strings).

    python benchmarks/guide_libraries.py TOKENIZER_DIR [--llguidance-path DIR]

llguidance is not a specbuild dependency: install it anywhere (``pip install --target DIR --no-deps llguidance``)
and pass that folder. Figures: docs/benchmarks.md, "Structured output".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib import metadata

ANSWER = {"name": "parse the configuration file", "count": 42, "tags": ["io", "config", "yaml"], "kind": "def"}


def schema(max_length: int | None) -> dict:
    name = {"type": "string", **({"maxLength": max_length} if max_length else {})}
    return {"type": "object", "properties": {"name": name, "count": {"type": "integer"},
                                             "tags": {"type": "array", "items": {"type": "string"}},
                                             "kind": {"enum": ["def", "class", "import"]}},
            "required": ["name", "count", "tags", "kind"], "additionalProperties": False}


def report(label: str, setup: float, compile_: float, costs: list[float]) -> None:
    print(f"{label}: tokenizer {setup * 1e3:.0f} ms, compile {compile_ * 1e3:.1f} ms, mask per token median "
          f"{statistics.median(costs) * 1e6:.0f} us, mean {statistics.mean(costs) * 1e6:.0f} us, worst "
          f"{max(costs) * 1e3:.2f} ms ({len(costs)} tokens)")


def xgrammar_costs(tokenizer, max_length: int | None) -> None:
    import xgrammar as xgr

    started = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    setup = time.perf_counter() - started
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    started = time.perf_counter()
    grammar = compiler.compile_json_schema(json.dumps(schema(max_length)), any_whitespace=False)
    compile_ = time.perf_counter() - started
    matcher, bitmask, costs = xgr.GrammarMatcher(grammar), xgr.allocate_token_bitmask(1, len(tokenizer)), []
    for token in tokenizer.encode(json.dumps(ANSWER), add_special_tokens=False):
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        costs.append(time.perf_counter() - started)
        assert matcher.accept_token(token)
    report(f"xgrammar {metadata.version('xgrammar')}, maxLength {max_length}", setup, compile_, costs)


def llguidance_costs(tokenizer, max_length: int | None) -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    started = time.perf_counter()
    lexicon = llguidance.hf.from_tokenizer(tokenizer)
    setup = time.perf_counter() - started
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema(max_length)),
                                                           defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(lexicon, grammar)
    compile_ = time.perf_counter() - started
    bitmask, costs = llguidance.torch.allocate_token_bitmask(1, lexicon.vocab_size), []
    compact = json.dumps(ANSWER, separators=(",", ":"))  # its compact JSON has no blank after , and :
    for token in tokenizer.encode(compact, add_special_tokens=False):
        started = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        costs.append(time.perf_counter() - started)
        assert matcher.consume_token(token), matcher.get_error()
    report(f"llguidance {metadata.version('llguidance')}, maxLength {max_length}", setup, compile_, costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer")
    parser.add_argument("--llguidance-path", help="a folder llguidance is installed in")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    for max_length in (None, 40):
        xgrammar_costs(tokenizer, max_length)
    if args.llguidance_path:
        sys.path.append(args.llguidance_path)
        for max_length in (None, 40):
            llguidance_costs(tokenizer, max_length)


if __name__ == "__main__":
    main()
