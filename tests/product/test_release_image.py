"""A release serves in the stock NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` image as it is: each python model
imports only what it ships beside itself and what that image has. Checked in a Python environment shaped like the
image's (transformers 4.57, as TensorRT-LLM 1.2.x pins it; numpy < 2; torch; a stand-in for the python backend's
utils) with specbuild not installed: every model loads from its config and answers. At both readings of the
image's transformers (4.57.1 and 4.57.3, :data:`IMAGE_READINGS`).

And it computes the same numbers: every checkpoint a release ships (a fixture transformers 5 saved with what 4.57
may read otherwise, the tiny pair, the demo pair where built) is read by the image's transformers with the same
config, the same token ids and the same next-token logits as the torch runtime's (:func:`assert_same_numbers`).

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

# The rehearsal's own exact versions, one set per reading of what TensorRT-LLM 1.2.1 installs (both readings and
# their sources: docker/ngc-26.04-python.txt), with what that transformers needs in its own range
# (tokenizers>=0.22,<=0.23, huggingface-hub>=0.34,<1.0 in both wheels' metadata). Not the image rules
# (pipeline/specbuild/runtimes/image_rules.py), which any 4.57.x meets: the rehearsal runs at each reading.
IMAGE_READINGS = {
    "4.57.1": ("transformers==4.57.1", "tokenizers==0.22.1", "huggingface-hub==0.36.2"),
    "4.57.3": ("transformers==4.57.3", "tokenizers==0.22.1", "huggingface-hub==0.36.2"),
}
STAND_INS = IMAGE_PYTHON
ROOT = REPO_ROOT
IMAGE_LIST = ROOT / "docker" / "ngc-26.04-python.txt"
CHECKER = ROOT / "docker" / "check_image_python.py"
DOCKERFILE = ROOT / "docker" / "Dockerfile.trtllm"


def install_reading(reading: str) -> Path:
    """The packages of one reading of the image's Python that differ from this environment's, installed once into
    the cache."""
    packages = IMAGE_READINGS[reading]
    site = CACHE_DIR / ("image-python-" + "-".join(p.replace("==", "") for p in packages))
    if not (site / "transformers").is_dir():
        partial = site.with_name(site.name + ".partial")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial),
                        *packages], check=True)
        partial.rename(site)
    return site


@pytest.fixture(scope="session", params=sorted(IMAGE_READINGS))
def image_reading(request: pytest.FixtureRequest) -> str:
    """Each reading of the image's transformers: every test that uses the image's Python runs at both."""
    return request.param


@pytest.fixture(scope="session")
def image_site(image_reading: str) -> Path:
    return install_reading(image_reading)


def run_in_image_python(image_site: Path, script: str, cwd: Path, *args: str) -> dict:
    """Run ``script`` of tests/image_python in the image's Python (specbuild not importable there); its JSON
    report (the last line it prints)."""
    # this environment's packages after the image's, but not its .pth files: specbuild is not importable
    path = [str(STAND_INS), str(image_site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    code = ("import sys; sys.path[:0] = " + repr(path) + "; sys.argv = sys.argv[1:]; "
            f"exec(compile(open({str(STAND_INS / script)!r}).read(), {script!r}, 'exec'))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, script, *args],
                            capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def load_in_image_python(image_site: Path, repository: Path, cwd: Path) -> dict:
    """Run load_release.py on ``repository`` in the image's Python (its configs read with specbuild's own
    ModelConfig schema, by path: specbuild itself is not importable there); its JSON report."""
    schema = ROOT / "pipeline" / "specbuild" / "package" / "model_config.py"
    return run_in_image_python(image_site, "load_release.py", cwd, str(repository), str(schema))


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


# --- the numbers: what the image computes with each checkpoint a release ships -------------------------------
NUMBERS_PROMPTS = ("def add(a, b):\n    return a + b\n\n\ndef", "import json\nfrom pathlib import Path\n\n\nclass",
                   "values = [value * value for value in range(10)]\nprint(")
NUMBERS_CHATS = ([{"role": "user", "content": "Write a function that adds two numbers."}],
                 [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is JSON?"}])
# Both sides run float32 on this machine's torch; only the transformers line differs (its modeling code may sum
# in another order): logits must agree within this, absolute and relative, on every id the runtime scores.
LOGITS_TOLERANCE = 1e-4
CHAT_TEMPLATE = ("{% for message in messages %}<|bos|>{{ message['role'] }}\n{{ message['content'] }}<|eos|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")
# What transformers 4.57 may read otherwise from a config transformers 5 saved: RoPE (theta not 10000, a scaling),
# tied embeddings, a head_dim that is not hidden_size / num_attention_heads (64 / 4).
ROPE_FIXTURE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 24, "tie_word_embeddings": True,
                "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
                "initializer_range": 0.5}  # random weights this large make attention, and RoPE with it, matter
ROPE_FIXTURE_DRAFT = {**ROPE_FIXTURE, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1}


@pytest.fixture(scope="session")
def rope_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A target and draft saved by transformers 5 with specbuild's own ``save_checkpoint`` (:data:`ROPE_FIXTURE`):
    tiny and random, made in a second (no training), so the rehearsal runs on every fresh clone."""
    import torch
    from checkpoint_factory import TEXT_MAIN, train_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from specbuild.drafts.model_pairs import save_checkpoint

    root = tmp_path_factory.mktemp("rope-pair")
    tokenizer = train_tokenizer(TEXT_MAIN, 400)
    tokenizer.chat_template = CHAT_TEMPLATE
    folders = []
    for seed, (name, sizes) in enumerate((("target", ROPE_FIXTURE), ("draft", ROPE_FIXTURE_DRAFT))):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, max_position_embeddings=512, **sizes))
        save_checkpoint(model, tokenizer, root / name)
        folders.append(root / name)
    return folders[0], folders[1]


def _numbers_script():  # noqa: ANN202 - a module
    import importlib.util

    spec = importlib.util.spec_from_file_location("next_token_logits", STAND_INS / "next_token_logits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same_numbers(image_site: Path, folders: list[Path], cwd: Path) -> None:
    """Each folder as the image's transformers reads it against this environment's (transformers 5, what the torch
    runtime runs here): the same config (a field read otherwise is named), the same token ids from its tokenizer
    (chat template included), and the same float32 next-token logits as the torch runtime's engine."""
    import torch

    from specbuild.runtimes.torch.engine import TorchEngine

    job = cwd / "numbers-job.json"
    job.write_text(json.dumps({"folders": [str(f) for f in folders], "prompts": NUMBERS_PROMPTS,
                               "chats": NUMBERS_CHATS}), encoding="utf-8")
    image = run_in_image_python(image_site, "next_token_logits.py", cwd, str(job))
    script = _numbers_script()
    for folder in folders:
        got, want = image["folders"][str(folder)], script.read(str(folder), list(NUMBERS_PROMPTS), list(NUMBERS_CHATS))
        differ = [f"{name}: image {got['config'][name]!r}, here {want['config'][name]!r}"
                  for name in want["config"] if got["config"][name] != want["config"][name]]
        assert not differ, (f"{folder}: transformers {image['transformers']} (the image's) reads the config "
                            f"otherwise: {'; '.join(differ)}")
        assert got["ids"] == want["ids"], f"{folder}: the image's tokenizer gives other ids"
        assert got["chat_ids"] == want["chat_ids"], f"{folder}: the image's chat template gives other ids"
        engine = TorchEngine(folder, dtype="float32")
        for prompt_ids, logits in zip(want["ids"], got["logits"]):
            reference = engine.sequence_logits(torch.tensor(prompt_ids))[-1]
            scored = torch.isfinite(reference)  # a draft's sub-vocabulary head scores only its ids
            torch.testing.assert_close(torch.tensor(logits)[scored], reference[scored], atol=LOGITS_TOLERANCE,
                                       rtol=LOGITS_TOLERANCE, msg=lambda m: f"{folder}, {len(prompt_ids)} "
                                       f"tokens: the image's next-token logits differ from the torch runtime's: {m}")


def shipped_checkpoints(target: Path, draft: Path, root: Path) -> list[Path]:
    """The checkpoints releases of the pair ship: the folders themselves (a tensorrt-llm-llmapi or tensorrt-llm
    release has the image read them as they are) and the torch runtime's converted copies."""
    from specbuild import compiler

    release = compiler.run(pair_spec(root, target, draft), json_mode=True)
    return [target, draft, release.engines / "target", release.engines / "draft"]


@pytest.mark.slow
def test_the_image_computes_what_the_torch_runtime_computes(image_site, rope_pair, tmp_path) -> None:
    assert_same_numbers(image_site, shipped_checkpoints(*rope_pair, tmp_path), tmp_path)


@pytest.mark.slow
def test_the_image_computes_what_the_torch_runtime_computes_on_the_trained_pairs(image_site, tiny_pair,
                                                                                 tmp_path) -> None:
    """The tiny pair, and the demo pair where this machine has built it (``specbuild demo``, or the tests)."""
    from specbuild.drafts import demo_models
    from specbuild.drafts.model_pairs import STAMP_FILE, pair_dir

    pairs = [(tiny_pair.target_dir, tiny_pair.draft_dir)]
    demo = pair_dir("demo", ROOT)
    stamp = demo / STAMP_FILE
    if stamp.is_file() and json.loads(stamp.read_text())["recipe"]["version"] == demo_models.RECIPE_VERSION:
        pairs.append((demo / "target", demo / "draft"))
    folders = [folder for index, (target, draft) in enumerate(pairs)
               for folder in shipped_checkpoints(target, draft, tmp_path / str(index))]
    assert_same_numbers(image_site, folders, tmp_path)


# --- specbuild in the specbuild TensorRT-LLM image ----------------------------------------------------------
def _installable(reading: str) -> list[str]:
    """The list's entries this machine's Python can install (those not marked [image only]), with the reading's own
    exact versions in place of the list's entries for the same packages."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = {canonicalize_name(Requirement(package).name) for package in IMAGE_READINGS[reading]}
    found = list(IMAGE_READINGS[reading])
    for line in IMAGE_LIST.read_text(encoding="utf-8").splitlines():
        rule, _, comment = line.partition("#")
        if rule.strip() and "[image only]" not in comment \
                and canonicalize_name(Requirement(rule.strip()).name) not in pinned:
            found.append(rule.strip())
    return found


# What `pip list --format=freeze` in a 26.04 image holding transformers 4.57.3 would report: versions no primary
# source gives (xgrammar, tokenizers, huggingface-hub and the rest) differ from no rule.
IMAGE_4_57_3 = {"tensorrt_llm": "1.2.1", "torch": "2.10.0a0+b4e4ee81d3.nv25.12", "transformers": "4.57.3",
                "tokenizers": "0.22.2", "huggingface-hub": "0.36.0", "xgrammar": "0.1.32", "numpy": "1.26.4",
                "polygraphy": "0.49.26", "safetensors": "0.7.0", "PyYAML": "6.0.3", "pydantic": "2.12.5",
                "click": "8.3.1", "fastapi": "0.121.3", "uvicorn": "0.38.0", "openai": "2.8.1",
                "prometheus_client": "0.23.1"}


def check_image(tmp_path: Path, packages: dict[str, str], python: str = "3.12.3") -> subprocess.CompletedProcess:
    """docker/check_image_python.py, as the Dockerfile runs it, on an image reporting ``packages``."""
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("".join(f"{name}=={version}\n" for name, version in packages.items()), encoding="utf-8")
    return subprocess.run([sys.executable, str(CHECKER), str(IMAGE_LIST), "--installed", str(freeze), "--python",
                           python], capture_output=True, text=True)


def test_an_image_at_either_reading_passes_the_build_s_check(tmp_path: Path) -> None:
    for transformers in ("4.57.3", "4.57.1"):
        result = check_image(tmp_path, {**IMAGE_4_57_3, "transformers": transformers})
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_an_image_differing_from_the_list_only_in_information_passes_naming_the_differences(tmp_path: Path) -> None:
    result = check_image(tmp_path, {**IMAGE_4_57_3, "transformers": "4.57.6", "polygraphy": "0.49.20",
                                    "tritonclient": "2.64.0"})
    assert result.returncode == 0 and result.stderr == ""
    assert "transformers is 4.57.6; the list reads transformers==4.57.1 ([req-1.2]); transformers==4.57.3" \
        in result.stdout
    assert "polygraphy is 0.49.20" in result.stdout and "tritonclient 2.64.0 is installed" in result.stdout


def test_the_build_s_check_fails_on_each_rule_a_release_depends_on(tmp_path: Path) -> None:
    broken = {**IMAGE_4_57_3, "numpy": "2.1.0", "transformers": "5.0.0"}
    del broken["xgrammar"]
    result = check_image(tmp_path, broken, python="3.11.9")
    assert result.returncode == 1
    problems = result.stderr.splitlines()
    assert len(problems) == 4, result.stderr
    for named in ("numpy is 2.1.0", "transformers is 5.0.0", "xgrammar is not installed", "Python is 3.11.9"):
        assert any(named in problem for problem in problems), (named, result.stderr)


def test_the_rehearsal_s_readings_are_the_list_s() -> None:
    """Each exact version the rehearsal installs for transformers is one the list reads from a source."""
    listed = IMAGE_LIST.read_text(encoding="utf-8")
    for packages in IMAGE_READINGS.values():
        assert f"\n{packages[0]} " in listed, packages[0]


def dockerfile_install() -> list[str]:
    """The Dockerfile's own commands that install specbuild (constraints from the image's pip list, then
    ``pip install --constraint ... .``), as argument lists."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    [run] = [line for line in text.splitlines() if "pip list --format=freeze" in line]
    commands = [shlex.split(part) for part in run.removeprefix("RUN").split("&&")]
    return [command for command in commands if command[:3] == ["python3", "-m", "pip"]]


@pytest.fixture(scope="session")
def image_venv(image_reading: str) -> Path:
    """A venv of this machine's Python holding the image's packages at ``image_reading`` (cached), specbuild
    installed into it as docker/Dockerfile.trtllm installs it (every session: this checkout's specbuild)."""
    packages = _installable(image_reading)
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
    assert result.stdout == "", result.stdout  # the reading's versions are among the list's: nothing differs
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
