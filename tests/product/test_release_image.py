"""A release serves in the stock NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` image as it is: each python model
imports only what it ships beside itself and what that image has. Checked in a Python environment shaped like the
image's (transformers 4.57, as TensorRT-LLM 1.2.x pins it; numpy < 2; torch; a stand-in for the python backend's
utils) with specbuild not installed: every model loads from its config and answers.

And specbuild itself works in the specbuild TensorRT-LLM image: a venv holding the image's Python packages that
matter (docker/ngc-26.04-python.txt, less what this machine cannot install: the image's torch build, TensorRT-LLM,
Python 3.12), specbuild installed by docker/Dockerfile.trtllm's own command; there the GPU runtimes' commands
that need no GPU run, and the python models of what they package load."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import yaml

from checkpoint_factory import pair_spec
from conftest import CACHE_DIR
from locations import IMAGE_PYTHON, REPO_ROOT

# What TensorRT-LLM 1.2.x pins (its requirements.txt) and what that transformers needs in its own range.
IMAGE_PACKAGES = ("transformers==4.57.1", "tokenizers==0.22.1", "huggingface-hub==0.36.2")
STAND_INS = IMAGE_PYTHON
ROOT = REPO_ROOT
IMAGE_LIST = ROOT / "docker" / "ngc-26.04-python.txt"
CHECKER = ROOT / "docker" / "check_image_python.py"
DOCKERFILE = ROOT / "docker" / "Dockerfile.trtllm"


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
    """Run load_release.py on ``repository`` in the image's Python (its configs read with specbuild's own
    ModelConfig schema, by path: specbuild itself is not importable there); its JSON report."""
    # this environment's packages after the image's, but not its .pth files: specbuild is not importable
    path = [str(STAND_INS), str(image_site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    script = ("import sys; sys.path[:0] = " + repr(path) + "; sys.argv = sys.argv[1:]; "
              f"exec(compile(open({str(STAND_INS / 'load_release.py')!r}).read(), 'load_release.py', 'exec'))")
    schema = ROOT / "pipeline" / "specbuild" / "package" / "model_config.py"
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, "load_release.py", str(repository),
                             str(schema)],
                            capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_llmapi_adapter_loads_in_the_image_s_python(image_site, checkpoints, tmp_path):
    from checkpoint_factory import package_llmapi_release

    report = load_in_image_python(image_site, package_llmapi_release(checkpoints, tmp_path).repository, tmp_path)
    assert report["specbuild_installed"] is False and report["transformers"].startswith("4.57")
    assert report["adapter_end_id"] == 1


@pytest.mark.slow
def test_every_python_model_loads_and_answers_in_the_image_s_python(image_site, checkpoints, tmp_path):
    from specbuild import compiler

    release = compiler.run(pair_spec(tmp_path, checkpoints.target, checkpoints.draft), json_mode=True)
    report = load_in_image_python(image_site, release.repository, tmp_path)
    assert report["specbuild_installed"] is False
    assert report["transformers"].startswith("4.57") and report["numpy"].startswith("1.")
    assert report["prompt_ids"] and len(report["target_tokens"]) == 4 and isinstance(report["text"], str)


# --- specbuild in the specbuild TensorRT-LLM image ----------------------------------------------------------
def _installable() -> list[str]:
    """The list's entries this machine's Python can install (those not marked [image only])."""
    found = []
    for line in IMAGE_LIST.read_text(encoding="utf-8").splitlines():
        rule, _, comment = line.partition("#")
        if rule.strip() and "[image only]" not in comment:
            found.append(rule.strip())
    return found


def dockerfile_install() -> list[str]:
    """The Dockerfile's own commands that install specbuild (constraints from the image's pip list, then
    ``pip install --constraint ... .``), as argument lists."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    [run] = [line for line in text.splitlines() if "pip list --format=freeze" in line]
    commands = [shlex.split(part) for part in run.removeprefix("RUN").split("&&")]
    return [command for command in commands if command[:3] == ["python3", "-m", "pip"]]


@pytest.fixture(scope="session")
def image_venv() -> Path:
    """A venv of this machine's Python holding the image's packages (cached), specbuild installed into it as
    docker/Dockerfile.trtllm installs it (every session: this checkout's specbuild)."""
    packages = _installable()
    key = re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(packages))[:120]
    home = CACHE_DIR / f"image-venv-{key}"
    python = home / "bin" / "python"
    if not python.exists():
        partial = home.with_name(home.name + ".partial")
        venv.create(partial, with_pip=True, clear=True)
        subprocess.run([str(partial / "bin" / "python"), "-m", "pip", "install", "--quiet", "--only-binary", ":all:",
                        *packages], check=True)
        partial.rename(home)  # (a venv's scripts name their folder: only python -m is used here)
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "specbuild"], check=False)
    constraints = home / "image-constraints.txt"
    for command in dockerfile_install():
        args = [str(python), *command[1:]]
        if ">" in args:  # the image's pip list, written as the constraints
            with constraints.open("w") as out:
                subprocess.run(args[:args.index(">")], check=True, stdout=out)
        else:
            args = [a.replace("/tmp/image-constraints.txt", str(constraints)) for a in args]
            subprocess.run([*args[:-1], str(ROOT)] if args[-1] == "." else args, check=True, cwd=ROOT)
    return python


def specbuild_in(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(python), "-m", "specbuild.cli", *args], capture_output=True, text=True, cwd=cwd,
                            timeout=600, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.mark.slow
def test_the_venv_is_the_image_s_python_less_what_cannot_be_had(image_venv: Path) -> None:
    result = subprocess.run([str(image_venv), str(CHECKER), str(IMAGE_LIST), "--rehearsal"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    missing = subprocess.run([str(image_venv), "-c", "import tritonclient"], capture_output=True)
    assert missing.returncode != 0  # as in the image: packaging must not need it


@pytest.mark.slow
def test_the_gpu_runtimes_package_in_the_image_s_python(image_venv: Path, image_site: Path, checkpoints,
                                                        tmp_path: Path) -> None:
    spec = {"name": "image", "target": {"checkpoint": str(checkpoints.target)},
            "draft": {"checkpoint": str(checkpoints.draft)}, "speculation": {"num_draft_tokens": 3},
            "limits": {"max_input_len": 64, "max_seq_len": 128}}
    (tmp_path / "specbuild.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert "0.1" in specbuild_in(image_venv, tmp_path, "--version").stdout
    plan = specbuild_in(image_venv, tmp_path, "compile", "--runtime", "tensorrt-llm", "--dry-run").stdout
    assert "trtllm-build" in plan and "convert_checkpoint.py" in plan
    specbuild_in(image_venv, tmp_path, "package", "--runtime", "tensorrt-llm", "--set",
                 "outputs.engines_dir=gpu_engines", "--set", "outputs.repository_dir=gpu_repo")
    specbuild_in(image_venv, tmp_path, "package", "--runtime", "tensorrt-llm-llmapi", "--set",
                 "outputs.repository_dir=llmapi_repo")
    model_yaml = yaml.safe_load((tmp_path / "llmapi_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["speculative_config"]["decoding_type"] == "DraftTarget"  # as TensorRT-LLM 1.2.1 dispatches
    # the engine-free release is servable as packaged (one packaged without engines is refused by design)
    specbuild_in(image_venv, tmp_path, "verify", "llmapi_repo")
    assert "docker" in specbuild_in(image_venv, tmp_path, "serve", "llmapi_repo", "--dry-run").stdout
    specbuild_in(image_venv, tmp_path, "deploy", "llmapi_repo", "--k8s", "k8s", "--pvc", "release")
    assert (tmp_path / "k8s").is_dir() and any((tmp_path / "k8s").iterdir())
    # what they packaged loads in the image's python (torch there is the image's; this machine's stands in)
    assert load_in_image_python(image_site, tmp_path / "llmapi_repo", tmp_path)["adapter_end_id"] == 1
    report = load_in_image_python(image_site, tmp_path / "gpu_repo", tmp_path)
    assert report["prompt_ids"] and isinstance(report["text"], str)


# --- the release's doctor in the image's python ---------------------------------------------------------------
def doctor_in_image_python(image_site: Path, repository: Path) -> dict:
    """The doctor a release ships (doctor.py), run in the image's Python as the image runs it (specbuild not
    importable; transformers 4.57): its JSON report."""
    path = [str(image_site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    script = (f"import runpy, sys; sys.path[:0] = {path!r}; sys.argv = sys.argv[1:]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    doctor = repository.resolve() / "doctor.py"
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, str(doctor), "--json"],
                            capture_output=True, text=True, timeout=600, cwd=repository)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (result.returncode == 1) == (not report["ok"])
    return report


def by_name(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


@pytest.fixture
def llmapi_release_of_a_rope_pair(tiny_pair, tmp_path: Path):
    """The tiny pair with a non-default RoPE theta (100000, in both layouts: top-level rope_theta and transformers 5's
    rope_parameters), packaged for the tensorrt-llm-llmapi runtime (the image loads its checkpoints as they are)."""
    from specbuild import compiler

    for role in ("target", "draft"):
        folder = shutil.copytree(getattr(tiny_pair, f"{role}_dir"), tmp_path / "pair" / role)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config["rope_theta"] = 100000.0
        config["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
        (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    spec = pair_spec(tmp_path / "release", tmp_path / "pair" / "target", tmp_path / "pair" / "draft",
                     runtime="tensorrt-llm-llmapi", name="rope")
    return compiler.run(spec, json_mode=True)


@pytest.mark.slow
def test_the_doctor_in_the_image_s_python_names_a_rope_misread_a_tampered_file_and_a_wrong_decoding_type(
        image_site, llmapi_release_of_a_rope_pair) -> None:
    release = llmapi_release_of_a_rope_pair
    checks = by_name(doctor_in_image_python(image_site, release.repository))
    for name in ("files", "config:target", "logits:target", "config:draft", "model.yaml:line-rules"):
        assert checks[name]["verdict"] == "pass", checks[name]
    assert "transformers 4.57" in checks["config:target"]["evidence"]
    # the checkpoint re-saved as transformers 5 saves it (RoPE only in rope_parameters), a file of the release edited,
    # model.yaml's decoding_type spelled as TensorRT-LLM main spells it (1.2.1's from_dict refuses it)
    config_file = Path(release.checkpoints["target"]) / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    del config["rope_theta"]
    config_file.write_text(json.dumps(config, indent=2), encoding="utf-8")
    with (release.repository / "llmapi_adapter" / "1" / "model.py").open("a", encoding="utf-8") as handle:
        handle.write("\n# edited by hand\n")
    model_yaml = release.repository / "tensorrt_llm" / "1" / "model.yaml"
    model_yaml.write_text(model_yaml.read_text(encoding="utf-8").replace("decoding_type: DraftTarget",
                                                                         "decoding_type: Draft_Target"),
                          encoding="utf-8")
    report = doctor_in_image_python(image_site, release.repository)
    checks = by_name(report)
    assert not report["ok"]
    rope = checks["config:target"]
    assert rope["verdict"] == "fail" and "rope_theta 10000.0 (built with 100000.0)" in rope["evidence"], rope
    assert "legacy top-level rope_theta" in rope["fix"]
    files = checks["files"]
    assert files["verdict"] == "fail" and "llmapi_adapter/1/model.py" in files["evidence"], files
    assert "target checkpoint: config.json" in files["evidence"] and "specbuild verify" in files["fix"]
    spelling = checks["model.yaml:line-rules"]
    assert spelling["verdict"] == "fail" and "'Draft_Target' is not 'DraftTarget'" in spelling["evidence"], spelling
    assert "package the release again" in spelling["fix"]
    assert checks["config:draft"]["verdict"] == "pass"  # only the edited checkpoint is named
