"""The distillation prompts (specbuild.drafts.distill_prompts), the benchmark prompts they hold out (.held_out) and the local
passages they are made from (specbuild.bench.passages)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from specbuild.bench import passages as passage_module
from specbuild.bench.passages import DEBIAN_DOC, MAX_CHARS, MIN_CHARS, local_passages, near_duplicates, prose
from specbuild.drafts.held_out import HELDOUT_FILE, benchmark_prompts, too_similar
from specbuild.drafts.distill_prompts import KINDS, distillation_prompts, prompt_pool

SEED = 3  # one seed throughout: the pool is built (a few seconds) once per seed and kept
DOC = """Summary line of a helper.

This helper reads the whole configuration file, checks every section against the schema and returns the
settings it found, so that callers never see a half-read file. It raises an error naming the section when a
value has the wrong type, and it leaves the file untouched.

>>> read_settings("app.cfg")
{'debug': False}

Parameters
----------
path : str
    The file.
"""


def all_benchmark_prompts() -> list[str]:
    bench = Path(__file__).parents[2] / "pipeline" / "specbuild" / "bench"
    files = [bench / "bundled_prompts.jsonl", bench / "structured_prompts.jsonl", HELDOUT_FILE]
    return [json.loads(line)["prompt"] for file in files for line in file.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def test_prompts_are_seeded_distinct_and_deterministic():
    prompts = distillation_prompts(3000, seed=SEED)
    assert prompts == distillation_prompts(3000, seed=SEED) != distillation_prompts(3000, seed=4)
    assert len(set(prompts)) == 3000
    assert distillation_prompts(10, seed=SEED) == prompts[:10]
    excluded = distillation_prompts(3000, seed=SEED, exclude=frozenset({prompts[0]}))
    assert prompts[0] not in excluded and len(excluded) == 3000


def test_a_short_run_sees_every_kind_and_many_instructions():
    pool = prompt_pool(SEED)
    assert set(pool) == set(KINDS) and all(len(prompts) >= 100 for prompts in pool.values())
    kind_of = {prompt: kind for kind, prompts in pool.items() for prompt in prompts}
    assert {kind_of[prompt] for prompt in distillation_prompts(len(KINDS), SEED)} == set(KINDS)
    instructions = {prompt.split("\n")[0][:40] for prompts in pool.values() for prompt in prompts}
    assert len(instructions) > 1000


def test_no_benchmark_prompt_nor_a_near_copy_of_one_is_in_the_pool():
    assert HELDOUT_FILE.is_file(), "the held-out set moved: held_out.HELDOUT_FILE must follow it"
    benchmark = all_benchmark_prompts()
    assert len(benchmark_prompts().trigrams) == len(benchmark) > 100
    pool = {prompt for prompts in prompt_pool(SEED).values() for prompt in prompts}
    assert not pool & set(benchmark)
    held_out = benchmark_prompts()
    assert all(too_similar(prompt, held_out) for prompt in benchmark)
    assert too_similar("Tell me a fun fact about bees.", held_out)  # a bundled prompt, one word changed
    assert too_similar("Please answer this:\n\n" + benchmark[-1], held_out)  # one held-out prompt, inside another
    assert not too_similar("Tell me about the history of the bicycle.", held_out)


def test_the_pool_is_deduplicated_and_passages_are_bounded_prose():
    pool = [prompt for prompts in prompt_pool(SEED).values() for prompt in prompts]
    assert len(pool) == len({" ".join(prompt.lower().split()) for prompt in pool}) > 15_000
    passages = local_passages(DEBIAN_DOC)
    assert all(MIN_CHARS <= len(p.text) <= MAX_CHARS for p in passages)
    assert {"stdlib", "package"} <= {p.source for p in passages}
    (paragraph,) = prose(DOC)  # a short title, the doctest and the parameter list are not prose
    assert paragraph.startswith("This helper reads") and paragraph.endswith("untouched.")


def test_near_duplicates_are_found_and_distinct_texts_kept():
    text = ("The scheduler runs every queued job in the order it was submitted, retries a failed job three "
            "times and then reports it to the owner by e-mail with the last error it saw.")
    texts = [text, text.replace("three", "four"), "A completely different sentence about gardens, bees, "
             "flowers and the summer that comes after a long and quiet winter in the hills."]
    assert near_duplicates(texts) == {1}


def test_without_debian_docs_the_pool_is_still_large(tmp_path, monkeypatch):
    absent = tmp_path / "absent"
    pool = prompt_pool(0, absent)
    assert set(pool) == set(KINDS) and sum(map(len, pool.values())) > 10_000
    assert "debian" not in {p.source for p in local_passages(absent)}


def test_debian_readmes_are_read_and_licences_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(passage_module, "_stdlib_docstrings", lambda: iter(()))
    monkeypatch.setattr(passage_module, "_package_texts", lambda: iter(()))
    local_passages.cache_clear()
    try:
        readme = ("This package installs a small daemon that watches the spool folder and prints every file that "
                  "appears there on the default printer. It keeps a log of what it printed and never deletes a file "
                  "it could not print, so nothing is lost.")
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "README.Debian.gz").write_bytes(gzip.compress(readme.encode()))
        (tmp_path / "pkg" / "copyright").write_text(readme.replace("daemon", "licence"))
        (tmp_path / "pkg" / "changelog.Debian.gz").write_bytes(gzip.compress(readme.replace("daemon", "x").encode()))
        assert [p.text for p in local_passages(tmp_path)] == [readme]
    finally:
        local_passages.cache_clear()
