"""A release serves in the stock NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` image as it is: each python model
imports only what it ships beside itself and what that image has. Checked in a Python environment shaped like the
image's (transformers 4.57, as TensorRT-LLM 1.2.x pins it; numpy < 2; torch; a stand-in for the python backend's
utils) with specbuild not installed: every model loads from its config and answers."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from checkpoint_factory import checkpoints  # noqa: F401 - the fixture (redefined below as an argument)
from conftest import CACHE_DIR
from test_pipeline import make_spec

# What TensorRT-LLM 1.2.x pins (its requirements.txt) and what that transformers needs in its own range.
IMAGE_PACKAGES = ("transformers==4.57.1", "tokenizers==0.22.1", "huggingface-hub==0.36.2")
STAND_INS = Path(__file__).parent / "image_python"


@pytest.fixture(scope="session")
def image_site() -> Path:
    """The image's Python packages that differ from this environment's, installed once into the cache."""
    site = CACHE_DIR / ("image-python-" + "-".join(p.replace("==", "") for p in IMAGE_PACKAGES))
    if not (site / "transformers").is_dir():
        partial = site.with_name(site.name + ".partial")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial),
                        *IMAGE_PACKAGES], check=True)
        partial.rename(site)
    return site


def load_in_image_python(image_site: Path, repository: Path, cwd: Path) -> dict:
    """Run load_release.py on ``repository`` in the image's Python; its JSON report."""
    # this environment's packages after the image's, but not its .pth files: specbuild is not importable
    path = [str(STAND_INS), str(image_site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    script = ("import sys; sys.path[:0] = " + repr(path) + "; sys.argv = sys.argv[1:]; "
              f"exec(compile(open({str(STAND_INS / 'load_release.py')!r}).read(), 'load_release.py', 'exec'))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, "load_release.py", str(repository)],
                            capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_llmapi_adapter_loads_in_the_image_s_python(image_site, checkpoints, tmp_path):  # noqa: F811
    from checkpoint_factory import package_llmapi_release

    report = load_in_image_python(image_site, package_llmapi_release(checkpoints, tmp_path).repository, tmp_path)
    assert report["specbuild_installed"] is False and report["transformers"].startswith("4.57")
    assert report["adapter_end_id"] == 1


@pytest.mark.slow
def test_every_python_model_loads_and_answers_in_the_image_s_python(image_site, checkpoints, tmp_path):  # noqa: F811
    from specbuild import compiler

    release = compiler.run(make_spec(tmp_path, checkpoints.target, checkpoints.draft), json_mode=True)
    report = load_in_image_python(image_site, release.repository, tmp_path)
    assert report["specbuild_installed"] is False
    assert report["transformers"].startswith("4.57") and report["numpy"].startswith("1.")
    assert report["prompt_ids"] and len(report["target_tokens"]) == 4 and isinstance(report["text"], str)
