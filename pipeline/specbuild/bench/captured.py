"""Captured traffic as the bench's prompts (``bench --captured``): each record's prompt ids, sent to the orchestrator
as they are (a decode and re-encode can change ids, so the replayed prompt would not be the one served), asking for
as many tokens as its answer had. A record does not say what kind of request it was, so every captured prompt is of
the one kind ``captured``.

A record is only read against the tokenizer it was captured with: its ``tokenizer`` checksum must be the release's
(another tokenizer would read the same ids as other text).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specbuild.bench.sweep import SentPrompt, repository_tokenizer
from specbuild.capture.records import SUFFIX, capture_files, read_file
from specbuild.errors import UsageError

CAPTURED = "captured"


def release_tokenizer_hash(repository: str | Path) -> str:
    """The checksum a capture record carries of the release's tokenizer (its preprocessing model's)."""
    from specbuild.checkpoint.tokenizer_files import folder_tokenizer_hash

    folder = repository_tokenizer(repository)
    if folder is None:
        raise UsageError(f"{repository} has no tokenizer in its preprocessing model",
                         "pass the folder of a release made by `specbuild compile`")
    return folder_tokenizer_hash(folder)


def captured_prompts(paths: Sequence[str | Path], tokenizer: str, *, max_tokens: int | None = None,
                     limit: int | None = None) -> list[SentPrompt]:
    """The prompts of the capture files and stores ``paths`` (a store: its ``*.jsonl`` files, oldest first), in
    order, the first ``limit``; each asks for ``max_tokens``, or as many tokens as its captured answer had.
    ``tokenizer``: the release's checksum (:func:`release_tokenizer_hash`), which every record must carry."""
    prompts: list[SentPrompt] = []
    for path in map(Path, paths):
        if not path.exists():
            raise UsageError(f"no capture file or store at {path}",
                             f"pass a capture store (a folder of *{SUFFIX} files) or one of its files")
        for file in capture_files(path) if path.is_dir() else [path]:
            for number, record in enumerate(read_file(file), start=1):
                if limit is not None and len(prompts) >= limit:
                    return prompts
                if record.tokenizer != tokenizer:
                    raise UsageError(f"{file}: record {number} was captured with tokenizer {record.tokenizer[:12]}, "
                                     f"and the release's is {tokenizer[:12]}: its ids would be other text",
                                     "replay a capture of a release with this release's tokenizer")
                if not record.prompt_ids:
                    raise UsageError(f"{file}: record {number} has no prompt ids",
                                     "move the file out of the store: specbuild releases capture no empty prompt")
                prompts.append(SentPrompt("", CAPTURED, ids=record.prompt_ids,
                                          max_tokens=max_tokens or max(1, len(record.output_ids))))
    if not prompts:
        raise UsageError(f"no captured record in {', '.join(map(str, paths))}",
                         "capture traffic first (the release's capture section), or pass a store that has some")
    return prompts
