"""Capture stores for the tests: records as a capturing release writes them (``specbuild-capture/1``), made up or
made from a real server's answers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from specbuild.capture.records import CaptureRecord

TOKENIZER = "ab" * 32


def captured_record(prompt_ids: tuple[int, ...], output_ids: tuple[int, ...],
                    tokenizer: str = TOKENIZER) -> CaptureRecord:
    return CaptureRecord(prompt_ids=prompt_ids, output_ids=output_ids, sampling={"top_k": 1}, rounds=((2, 1),),
                         finish_reason="length", release="cd" * 32, tokenizer=tokenizer, finished_at=time.time(),
                         instance="orchestrator_0")


def write_store(folder: Path, *files: list[CaptureRecord]) -> Path:
    """A store of one capture file per list of records (named by creation time and instance, as a release names
    them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, records in enumerate(files):
        (folder / f"2026120{number}T000000-orchestrator_0.jsonl").write_bytes(b"".join(r.to_line() for r in records))
    return folder


def served_records(repository: Path, url: str, texts: list[str], max_tokens: int) -> list[tuple[CaptureRecord, str]]:
    """The release's real greedy answers to ``texts``, each as the record its orchestrator would capture (prompt ids
    as its preprocessing encodes them, every output id) beside the text the ensemble served for it."""
    from specbuild.bench.captured import release_tokenizer_hash
    from specbuild.serve.client import SpecbuildClient
    from specbuild.serve.orchestrator_client import IdsClient, orchestrator_arrays, response_text

    ids_client = IdsClient.for_release(url, repository, timeout=300)
    tokenizer, checksum = ids_client.preprocessor.tokenizer, release_tokenizer_hash(repository)
    served = []
    for text in texts:
        prompt_ids = tuple(ids_client.preprocessor.prompt_ids(text))
        output_ids: list[int] = []

        def keep(result: Any, final: bool) -> str:
            if result is None:
                return ""
            length = int(result.as_numpy("output_length").reshape(-1)[0])
            output_ids[:] = result.as_numpy("output_ids").reshape(-1)[:length].tolist()  # every id so far
            return response_text(tokenizer, result)[0]

        arrays = orchestrator_arrays(ids_client.preprocessor, ids_client.settings, prompt_ids, max_tokens,
                                     stream=True, num_draft_tokens=0)
        list(ids_client.stream_arrays(arrays, keep))
        answer = SpecbuildClient(url, timeout=300).generate(text, len(output_ids)).text
        served.append((captured_record(prompt_ids, tuple(output_ids), tokenizer=checksum), answer))
    return served
