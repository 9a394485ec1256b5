"""Adding a request setting is its row and its consumer, nothing else: a copy of the package gets a dummy setting
(``most_tokens``, a cap on a request's tokens: a row of ``speculation/request_settings.py`` and two lines of the
orchestrator's request parsing), and that copy, compiled and served, takes it through Triton's HTTP generate
endpoint, the gRPC client's keyword, the OpenAI API's extra field and ``specbuild generate``'s option, while the
engine-free adapter refuses it with the row's reason (``dummy_setting_run.py`` runs on the copy)."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from locations import REPO_ROOT

PACKAGE = REPO_ROOT / "pipeline"
ROW = '''    RequestSetting("most_tokens", int, "at most this many tokens (0: max_tokens)",
                   Fixed("the LLM API takes max_tokens only"), flag=True, minimum=0, default=0),
'''
CONSUMER = '''        if chosen["most_tokens"]:
            public = dataclasses.replace(public, max_tokens=min(public.max_tokens, chosen["most_tokens"]))
'''


def _insert(path: Path, anchor: str, text: str, *, before: bool = False) -> None:
    source = path.read_text(encoding="utf-8")
    assert source.count(anchor) == 1, f"{anchor!r} is not once in {path}"
    path.write_text(source.replace(anchor, text + anchor if before else anchor + text), encoding="utf-8")


def _changed(left: Path, right: Path) -> list[str]:
    """Files that differ between two trees (either side only, or another content), relative to them."""
    compared = filecmp.dircmp(left, right, ignore=["__pycache__"])
    changed = [*compared.left_only, *compared.right_only, *compared.diff_files]
    for name, sub in compared.subdirs.items():
        changed.extend(f"{name}/{path}" for path in _changed(left / name, right / name))
    return sorted(changed)


def _with_dummy_setting(copy: Path) -> None:
    package = copy / "specbuild"
    _insert(package / "speculation" / "request_settings.py", ")\n\nSent = ", ROW, before=True)
    orchestration = package / "triton_models" / "orchestrator_requests.py"
    _insert(orchestration, "from __future__ import annotations\n", "\nimport dataclasses\n")
    _insert(orchestration, "        chosen = resolve(public.settings, settings)\n", CONSUMER)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_dummy_row_and_its_consumer_work_on_every_surface(checkpoints, tmp_path):
    copy = tmp_path / "pipeline"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _with_dummy_setting(copy)
    assert _changed(PACKAGE, copy) == ["specbuild/speculation/request_settings.py",
                                       "specbuild/triton_models/orchestrator_requests.py"]
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("dummy_setting_run.py")),
                          str(checkpoints.target), str(checkpoints.draft), str(tmp_path / "release")],
                         env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    observed = json.loads(run.stdout.splitlines()[-1])
    assert observed.pop("package") == str(copy / "specbuild" / "__init__.py")
    assert observed.pop("adapter") == "most_tokens=3: the LLM API takes max_tokens only"
    for surface, (without, capped) in observed.items():
        assert capped == 3 < without, f"{surface}: {without} tokens without most_tokens, {capped} with most_tokens=3"
