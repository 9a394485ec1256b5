"""scripts/gpu-distill.sh (specbuild.drafts.gpu_distill): the GPU distillation recipe, run on the CPU on the tiny pair.

The device machine has PyTorch, transformers and numpy only, so the run is checked for what it imports too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from locations import REPO_ROOT
from specbuild.drafts.distill_options import DraftOptions
from specbuild.drafts.gpu_distill import LAYERS, draft_options, main

# Not installed with torch and transformers (transformers 5 brings typer, hence click and rich). pydantic is the one
# still imported: make_draft measures step costs through the torch engine, whose head_vocabulary.json reader uses it.
ABSENT_ON_THE_GPU_MACHINE = ("pydantic", "tritonclient", "fastapi", "gguf", "aiohttp", "jsonschema")
KNOWN_IMPORTED = "['pydantic']"


def test_the_recipe_is_the_demo_drafts_at_four_layers_and_valid():
    options = draft_options("cuda", 4.0, tiny=False)
    options.validate()
    assert (options.layers, options.device, options.answers, options.teacher) == (LAYERS, "cuda", "greedy+sampled",
                                                                                  "joint")
    assert options.minutes == 4.0 and options.prompts > 10_000
    has_head_option = "head_vocabulary" in DraftOptions.__dataclass_fields__
    assert (getattr(options, "head_vocabulary", None) is not None) == has_head_option


def test_a_missing_target_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "--device", "cpu", "--target", str(tmp_path / "nothing")]) == 2
    error = capsys.readouterr().err
    assert "not a Hugging Face checkpoint folder" in error and "--target DIR" in error and "--gguf FILE" in error


@pytest.mark.slow
def test_the_tiny_run_writes_a_layers_file_its_checksum_and_figures(tiny_pair, tmp_path):
    out = tmp_path / "out"
    code = ("import sys; from specbuild.drafts.gpu_distill import main; "
            f"code = main([{str(out)!r}, '--device', 'cpu', '--tiny', '--target', {str(tiny_pair.target_dir)!r}, "
            f"'--work', {str(tmp_path / 'work')!r}]); "
            f"print('IMPORTED', sorted({{m.split('.')[0] for m in sys.modules}} & {set(ABSENT_ON_THE_GPU_MACHINE)!r})); "
            "sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "pipeline")}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"IMPORTED {KNOWN_IMPORTED}" in done.stdout
    from transformers import AutoModelForCausalLM

    from specbuild.drafts.demo_models import AssetFile, assemble_draft

    figures = json.loads((out / "figures.json").read_text(encoding="utf-8"))
    layers, sha256 = out / figures["layers_file"], figures["sha256"]
    assert (out / "SHA256SUMS").read_text(encoding="utf-8") == f"{sha256}  {layers.name}\n"
    target = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir)
    draft = assemble_draft(target, AssetFile(layers, sha256).verified())  # the demo's format: the target adds embeddings and head
    assert draft.config.num_hidden_layers == 2
    assert set(figures["agreement"]) == {"general", "heldout"}
    assert all(0 <= row["agreement"] <= 1 and row["positions"] > 0 for row in figures["agreement"].values())
    assert figures["draft_summary"]["options"]["teacher"] == "joint" and sum(figures["prompt_pool"].values()) > 10_000
