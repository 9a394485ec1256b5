"""The ``long`` bench workload: prompts of 1k-2k tokens of every kind, built the same on every run from text that
ships with Python, each holding what its question asks about."""

from __future__ import annotations

import ast
import re

from click.testing import CliRunner

from specbuild.bench.long_prompts import CHARS_PER_TOKEN, CHAT_TOKENS, CODE_TOKENS, KINDS, PER_KIND, QA_TOKENS
from specbuild.bench.prompts import load_prompts
from specbuild.cli import main


def test_every_kind_is_there_at_its_size_and_the_same_each_time() -> None:
    prompts = load_prompts(workload="long")
    assert [p.category for p in prompts[:len(KINDS)]] == list(KINDS)  # interleaved by kind
    assert sorted(p.category for p in prompts) == sorted(KINDS * PER_KIND)
    sizes = {**QA_TOKENS, "chat-long": CHAT_TOKENS}
    for prompt in prompts:
        tokens = len(prompt.prompt) / CHARS_PER_TOKEN
        low, high = CODE_TOKENS if prompt.category == "code-edit" else (sizes[prompt.category],
                                                                         sizes[prompt.category] * 1.5)
        assert low <= tokens <= high + 100, (prompt.category, tokens)  # the instructions around a module
    assert load_prompts(workload="long") == prompts
    assert len({p.prompt for p in prompts}) == len(prompts)


def test_each_question_is_answered_by_its_own_prompt() -> None:
    prompts = load_prompts(workload="long")
    for prompt in prompts:
        if prompt.category.startswith("qa-"):
            opening = re.search(r'begins with "([^"]+)"', prompt.prompt).group(1)
            assert re.search(r"\[\d+\] " + re.escape(opening), prompt.prompt)  # the passage it names is there
        elif prompt.category == "chat-long":
            assert "Here is note 1:" in prompt.prompt and "Here is note 2:" in prompt.prompt
        else:
            source = prompt.prompt.split("```python\n")[1].split("```")[0]
            ast.parse(source)  # a whole module, as it ships


def test_the_cli_offers_the_workload() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "long" in result.output and "whole-file code edits" in result.output
