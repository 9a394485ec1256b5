"""scripts/gpu-distill.sh (specbuild.drafts.gpu_distill): the GPU distillation recipe, run on the CPU on the tiny pair.

The device machine has torch, transformers and a few more only (tests/device_machine.py), so the script runs here
with every other installed package unimportable.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from device_machine import device_env
from locations import REPO_ROOT
from specbuild.drafts.distill_options import DraftOptions
from specbuild.drafts.gpu_distill import LAYERS, RECIPE, draft_options, main, resolve_target

SCRIPTS = ("specbuild.drafts.gpu_distill", "specbuild.gpu_check")  # scripts/gpu-distill.sh, gpu-check.sh


def reached_modules(names: tuple[str, ...]) -> set[str]:
    """The specbuild modules that ``names`` import anywhere in their files (functions too), and the modules those
    import at their top level, and so on (what other modules import inside functions is the slow tests' part)."""
    import ast
    import importlib.util

    reached, pending = set(), list(names)
    while pending:
        name = pending.pop()
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # a name imported from a module, not a module
            continue
        if name in reached or spec is None or spec.origin is None:
            continue
        reached.add(name)
        tree = ast.parse(open(spec.origin, encoding="utf-8").read())
        for node in ast.walk(tree) if name in names else tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specbuild"):
                pending += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                pending += [alias.name for alias in node.names if alias.name.startswith("specbuild")]
    return reached


def test_every_module_the_scripts_reach_imports_on_the_device_machines_packages_alone(tmp_path):
    modules = sorted(reached_modules(SCRIPTS))
    assert "specbuild.runtimes.torch.engine" in modules and "specbuild.checkpoint.head_vocabulary" in modules
    code = f"import importlib; [importlib.import_module(name) for name in {modules!r}]"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=device_env(tmp_path / "site"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_recipe_is_the_demo_drafts_at_four_layers_and_valid():
    options = draft_options("cuda", 4.0, tiny=False)
    options.validate()
    assert (options.layers, options.device, options.answers, options.teacher) == (LAYERS, "cuda", "greedy+sampled",
                                                                                  "joint")
    assert options.minutes == 4.0 and options.prompts > 10_000 and options.steps == RECIPE["steps"]
    has_head_option = "head_vocabulary" in DraftOptions.__dataclass_fields__
    assert (getattr(options, "head_vocabulary", None) is not None) == has_head_option
    longer = draft_options("cuda", 6.5, tiny=False, steps=1600, data_share=0.45, unset=None)  # the demo draft's
    assert (longer.minutes, longer.steps, longer.data_share) == (6.5, 1600, 0.45)


def test_a_target_given_as_parts_is_joined_and_checked(tmp_path):
    from specbuild.errors import UsageError
    from specbuild.stages.hashing import sha256_file
    from specbuild.stages.parts import split

    target = tmp_path / "target"
    target.mkdir()
    config = target / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "padding": "x" * 300}), encoding="utf-8")
    (target / "SHA256SUMS").write_text(f"{sha256_file(config)}  config.json\n", encoding="utf-8")
    assert len(split(config, 100)) == 4 and not config.exists()
    assert resolve_target(target, None, False, tmp_path / "work") == target
    assert json.loads(config.read_text(encoding="utf-8"))["model_type"] == "llama"
    split(config, 100)
    (target / "config.json.part-01").write_bytes(b"damaged")
    with pytest.raises(UsageError, match="sha256"):
        resolve_target(target, None, False, tmp_path / "work")


def test_a_missing_target_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "--device", "cpu", "--target", str(tmp_path / "nothing")]) == 2
    error = capsys.readouterr().err
    assert "not a Hugging Face checkpoint folder" in error and "--target DIR" in error and "--gguf FILE" in error


@pytest.mark.slow
def test_the_tiny_run_writes_a_layers_file_its_checksum_and_figures(tiny_pair, tmp_path):
    """The script as it is, with only the device machine's packages, its results in parts of 20 KiB."""
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu-distill.sh"), str(out), "--device", "cpu",
                           "--tiny", "--target", str(tiny_pair.target_dir), "--work", str(tmp_path / "work"),
                           "--part-size", "20K"],
                          capture_output=True, text=True, env=device_env(tmp_path / "site"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    from specbuild.drafts.demo_models import AssetFile, assemble_draft

    figures = json.loads((out / "figures.json").read_text(encoding="utf-8"))
    layers, sha256 = out / figures["layers_file"], figures["sha256"]
    assert (out / "SHA256SUMS").read_text(encoding="utf-8") == f"{sha256}  {layers.name}\n"
    parts = sorted(out.glob(f"{layers.name}.part-*"))
    assert not layers.exists() and len(parts) > 1 and all(part.stat().st_size <= 20 * 2**10 for part in parts)
    joining = subprocess.run(["sh", "reassemble.sh"], cwd=out, capture_output=True, text=True, timeout=60)
    assert joining.returncode == 0 and f"{layers.name}: OK" in joining.stdout, joining.stderr
    target = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir)
    draft = assemble_draft(target, AssetFile(layers, sha256).verified())  # the demo's format: the target adds embeddings and head
    assert draft.config.num_hidden_layers == 2
    assert set(figures["agreement"]) == {"general", "heldout"}
    assert all(0 <= row["agreement"] <= 1 and row["positions"] > 0 for row in figures["agreement"].values())
    assert figures["draft_summary"]["options"]["teacher"] == "joint" and sum(figures["prompt_pool"].values()) > 10_000


@pytest.mark.slow
def test_a_gguf_target_in_parts_converts_with_the_device_packages_and_gguf(tmp_path):
    """The demo target's GGUF as two parts (over what one device call carries), joined, checked and converted with
    nothing but the device machine's packages, gguf and accelerate."""
    import shutil

    from device_machine import DEVICE_PACKAGES, GGUF_PACKAGES
    from specbuild.drafts.demo_models import locate_smollm2_gguf
    from specbuild.errors import CheckpointError
    from specbuild.stages.hashing import sha256_file
    from specbuild.stages.parts import split

    try:
        wheel_gguf = locate_smollm2_gguf()
    except CheckpointError as exc:
        pytest.skip(exc.message)
    gguf = tmp_path / "carried" / "target.gguf"
    gguf.parent.mkdir()
    shutil.copyfile(wheel_gguf, gguf)
    (gguf.parent / "SHA256SUMS").write_text(f"{sha256_file(wheel_gguf)}  {gguf.name}\n", encoding="utf-8")
    assert len(split(gguf, 60 * 2**20)) == 2
    code = ("from pathlib import Path; from specbuild.drafts.gpu_distill import resolve_target; "
            f"print(resolve_target(None, Path({str(gguf)!r}), False, Path({str(tmp_path / 'work')!r})))")
    env = device_env(tmp_path / "site", DEVICE_PACKAGES + GGUF_PACKAGES)
    env["PYTHONPATH"] += f":{REPO_ROOT / 'pipeline'}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("target") and sha256_file(gguf) == sha256_file(wheel_gguf)
    config = json.loads((tmp_path / "work" / "target" / "config.json").read_text(encoding="utf-8"))
    assert config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
