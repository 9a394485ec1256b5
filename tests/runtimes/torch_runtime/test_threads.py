"""The engine models' threads on a busy host: each model process runs torch with the threads its spec asks for
(``torch.target_threads`` / ``torch.draft_threads``; 0: one or every core, step by step, by the thread governor),
its waiting threads spinning briefly (``GOMP_SPINCOUNT``), and keeps serving exact output while CPU-bound jobs
compete for the cores."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from served_tiny import compile_release

from specbuild.serve.client import SpecbuildClient
from specbuild.serve.server import TritonServer
from specbuild.runtimes.torch.threads import SPIN_COUNT

PROMPT = "count the ways"


@contextmanager
def busy_cores(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` processes spinning on the CPU until the block ends."""
    jobs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield jobs
    finally:
        for job in jobs:
            job.kill()
            job.wait()


@pytest.mark.slow
@pytest.mark.e2e
def test_engine_models_serve_with_their_threads_beside_busy_jobs(checkpoints, tmp_path):
    release = compile_release(checkpoints, tmp_path, **{"torch.target_threads": 0, "torch.draft_threads": 2})
    cores = len(os.sched_getaffinity(0))
    with busy_cores(cores) as jobs, TritonServer(release.repository, startup_timeout=300) as server:
        client = SpecbuildClient(server.grpc_url, timeout=300)
        alone = client.generate(PROMPT, 24, num_draft_tokens=0)
        speculative = client.generate(PROMPT, 24, num_draft_tokens=3)
        log = server.read_log()
        assert all(job.poll() is None for job in jobs)  # the competition lasted the whole test
    assert speculative.text == alone.text and speculative.total_draft_tokens > 0
    chosen = f"1 or {cores} (by measured steps)" if cores > 1 else "1"
    assert f"target: torch on cpu with {chosen} intra-op threads, GOMP_SPINCOUNT={SPIN_COUNT}" in log
    assert f"draft: torch on cpu with 2 intra-op threads, GOMP_SPINCOUNT={SPIN_COUNT}" in log
