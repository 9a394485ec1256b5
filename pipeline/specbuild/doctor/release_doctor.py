"""The doctor a specbuild release ships (as ``doctor.py`` in its repository folder): does this environment build or
serve the release as specbuild built it? Run it where the release runs, the NGC ``tritonserver:<yy.mm>-trtllm-python-
py3`` image above all (``specbuild doctor RELEASE --image IMAGE`` starts it there, mounted as ``serve`` mounts it).

Standard library only at import, and no specbuild import: the image has no specbuild. Each check uses what it finds
(transformers, torch, xgrammar, tensorrt_llm, ``nvidia-smi``, the image's Triton version) and says "not checkable
here", with why, where something is missing. The rules it checks come from files beside it: ``image_rules.py`` (the
packages specbuild depends on in the image), ``manifest.json`` (the release's files, the checkpoints' facts as
specbuild read them, the build records, the memory plan) and ``doctor_facts.json`` (next-token logits and the python
backend's known bugs, recorded at build time).

Usage: python doctor.py [--json] [--engines DIR] [--checkpoint ROLE=DIR ...]
Exit 0: no check failed; 1: a check failed (each names its fix); 2: the release cannot be read.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MANIFEST = "manifest.json"
FACTS = "doctor_facts.json"
RULES = "image_rules.py"
PASS, FAIL, UNCHECKABLE = "pass", "fail", "not checkable here"
ROLES = ("target", "draft")
# The NGC Triton image's release, e.g. "26.04" (triton-inference-server/server's qa scripts read it as such:
# REPO_VERSION=${NVIDIA_TRITON_SERVER_VERSION}): where it is unset, this is not the image.
TRITON_VERSION_ENV = "NVIDIA_TRITON_SERVER_VERSION"
LOGITS_PARAMETER_CAP = 2_000_000_000  # larger checkpoints have no logits recorded (fp32 on a CPU)
RECOMPILE = "recompile the release with specbuild (`specbuild compile`) and copy it whole"


@dataclass(frozen=True)
class Check:
    """One check's verdict (pass, fail, not checkable here), what it saw, and what to do about a fail."""

    name: str
    verdict: str
    evidence: str
    fix: str | None = None


class Unreadable(Exception):
    """The release itself cannot be read (no manifest, no facts): nothing can be checked."""


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Unreadable(f"{path} is missing or unreadable ({exc})") from None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _image_rules() -> Any:
    """image_rules.py beside this file, loaded by path."""
    spec = importlib.util.spec_from_file_location("specbuild_image_rules", HERE / RULES)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _release_number(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


class Release:
    """The release beside this file, and where its parts are in this environment."""

    def __init__(self, repository: Path, engines: Path | None, checkpoints: Mapping[str, Path]) -> None:
        self.repository = repository
        self.manifest = _load_json(repository / MANIFEST)
        self.facts = _load_json(repository / FACTS)
        self.spec = self.manifest.get("spec", {})
        self.runtime: str = self.spec.get("runtime", "?")
        self.compatibility = self.manifest.get("compatibility") or {}
        trees = self.manifest.get("trees", {})
        self.engines = engines or (repository / trees["engines"] if "engines" in trees else None)
        self._checkpoints = dict(checkpoints)
        self.triton_version = os.environ.get(TRITON_VERSION_ENV)

    @property
    def gpu(self) -> bool:
        """Served in the NGC image (TensorRT-LLM), not on the Triton bundled with specbuild."""
        return self.runtime != "torch"

    @property
    def guided(self) -> bool:
        """Serves guided decoding in the backend (its xgrammar tokenizer-info file)."""
        return bool(self.facts.get("tokenizer_info"))

    def checkpoint(self, role: str) -> tuple[Path | None, list[str]]:
        """Where ``role``'s Hugging Face checkpoint is here (None: nowhere), and the places looked at."""
        candidates = [self._checkpoints.get(role)]
        if self.runtime == "torch" and self.engines is not None:
            candidates.append(self.engines / role)  # the torch runtime's engine is the checkpoint, copied
        candidates.append(self.manifest.get("checkpoints", {}).get(role))
        candidates.append(self.spec.get(role, {}).get("checkpoint"))
        looked = [str(path) for path in candidates if path]
        for path in looked:
            if (Path(path) / "config.json").is_file():
                return Path(path), looked
        return None, looked


# --- the checks ----------------------------------------------------------------------------------------
def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _recorded(path: Path) -> str:
    """A file as specbuild's manifest records it: a symlink as ``symlink:<target>``, else its sha256."""
    return f"symlink:{os.readlink(path)}" if path.is_symlink() else _hash(path)


def check_files(release: Release) -> Iterator[Check]:
    """Every file the manifest lists, here and unchanged; no file in the repository it does not list."""
    files: dict[str, str] = release.manifest.get("files", {})
    engines_tree = release.manifest.get("trees", {}).get("engines")
    if not files:
        yield Check("files", UNCHECKABLE, f"{MANIFEST} lists no files (format {release.manifest.get('format')})")
        return

    def located(relative: str) -> Path:
        if engines_tree and release.engines is not None and relative.startswith(engines_tree + "/"):
            return release.engines / relative[len(engines_tree) + 1:]
        return release.repository / relative

    changed, missing = [], []
    for relative, digest in files.items():
        path = located(relative)
        if not (path.is_file() or path.is_symlink()):
            missing.append(relative)
        elif _recorded(path) != digest:
            changed.append(relative)
    extra = []
    for path in release.repository.rglob("*"):
        relative = path.relative_to(release.repository).as_posix()
        if (path.is_file() or path.is_symlink()) and relative != MANIFEST and "__pycache__" not in path.parts \
                and relative not in files:
            extra.append(relative)  # (a running server's python models write bytecode caches: never the release's)
    for role, identity in (release.manifest.get("inputs") or {}).items():
        if role not in release.manifest.get("checkpoints", {}):
            continue  # only checkpoints the release serves in place of engines count as its files
        folder, _ = release.checkpoint(role)
        if folder is None:
            missing.append(f"the {role} checkpoint")
            continue
        for relative, digest in identity.get("files", {}).items():
            path = folder / relative
            if not path.is_file():
                missing.append(f"{role} checkpoint: {relative}")
            elif _hash(path) != digest:
                changed.append(f"{role} checkpoint: {relative}")
    problems = [f"{kind}: {', '.join(paths)}" for kind, paths in
                (("changed", changed), ("missing", missing), ("not in the manifest", sorted(extra))) if paths]
    if problems:
        yield Check("files", FAIL, "; ".join(problems),
                    "the release differs from what specbuild built: copy it again from its source, or "
                    + RECOMPILE + " (`specbuild verify` lists the same differences)")
    else:
        yield Check("files", PASS, f"{len(files)} files match {MANIFEST}")


def check_packages(release: Release) -> Iterator[Check]:
    """Python and the packages specbuild depends on in the image (image_rules.py), and TensorRT-LLM's line."""
    if not _importable("packaging"):
        yield Check("packages", UNCHECKABLE, f"the packaging module ({RULES} reads versions with it) is not "
                    "installed here (the image has it)")
        return
    rules = _image_rules()
    names = [rule.name for rule in rules.RULES] + list(rules.ABSENT_OK)
    installed = {name: _version(name) for name in names}
    python = ".".join(str(part) for part in sys.version_info[:3])
    found = ", ".join(f"{name} {version or 'absent'}" for name, version in installed.items())
    evidence = f"Python {python}; {found}"
    if not release.gpu:
        yield Check("packages", UNCHECKABLE, f"{evidence}; a torch release runs on the Triton bundled with "
                    "specbuild, in specbuild's own environment, not in the NGC image whose rules these are")
        return
    problems = rules.breaches(installed, guided=release.guided, python=python)
    line = release.facts.get("tensorrt_llm")
    installed_trtllm = _version("tensorrt_llm") or _version("tensorrt-llm")
    if line and installed_trtllm and not installed_trtllm.startswith(line):
        problems.append(f"tensorrt_llm is {installed_trtllm}; the release was made for TensorRT-LLM {line}")
    if release.triton_version is None:
        yield Check("packages", UNCHECKABLE,
                    f"{evidence}; this is not the NGC image ({TRITON_VERSION_ENV} is unset), whose packages the "
                    "release needs" + (f" (here: {'; '.join(problems)})" if problems else ""))
    elif problems:
        yield Check("packages", FAIL, "; ".join(problems),
                    f"serve the release with the image its launch names ({release.spec.get('triton', {}).get('image')})"
                    " or an image whose packages keep these rules (docker/ngc-26.04-python.txt)")
    else:
        yield Check("packages", PASS, f"{evidence}; every rule of {RULES} holds"
                    + (f"; TensorRT-LLM {installed_trtllm}" if installed_trtllm else ""))


def _rope_as_read(config: Any) -> tuple[float | None, dict[str, Any] | None]:
    """RoPE theta and scaling as a consumer of the loaded config reads them: the top-level attribute where the
    installed transformers has one (4.x; what TensorRT-LLM's converter reads: ``LLaMAConfig.from_hugging_face``'s
    ``getattr(hf_config, "rope_theta", 10000.0)`` and ``getattr(hf_config, "rope_scaling", None)``, NVIDIA/TensorRT-LLM
    tensorrt_llm/models/llama/config.py @ 04100fd0a70976e86e0ac117f34942d06c21545d), else transformers 5's
    ``rope_parameters``."""
    parameters = getattr(config, "rope_parameters", None)
    parameters = parameters if isinstance(parameters, dict) else {}
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = parameters.get("rope_theta")
    scaling = getattr(config, "rope_scaling", None)
    if not isinstance(scaling, dict) and getattr(config, "rope_theta", None) is None:
        scaling = parameters  # transformers 5: the scaling lives in rope_parameters
    return (None if theta is None else float(theta)), _scaling(scaling)


def _scaling(value: Any) -> dict[str, Any] | None:
    """A RoPE scaling without its theta, ``type`` named ``rope_type``; None for the default rope."""
    if not isinstance(value, dict):
        return None
    scaling = {("rope_type" if key == "type" else key): item for key, item in value.items() if key != "rope_theta"}
    return None if scaling.get("rope_type", "default") == "default" else scaling


def _config_facts(config: Any) -> dict[str, Any]:
    theta, scaling = _rope_as_read(config)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    return {"rope_theta": theta, "rope_scaling": scaling, "vocab_size": getattr(config, "vocab_size", None),
            "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)), "head_dim": head_dim,
            "num_attention_heads": heads,
            "num_kv_heads": getattr(config, "num_key_value_heads", None) or heads}


def check_checkpoint_config(release: Release, role: str) -> Iterator[Check]:
    """The checkpoint's config.json as the installed transformers reads it, against what specbuild built with."""
    name = f"config:{role}"
    built = release.compatibility.get(role)
    folder, looked = release.checkpoint(role)
    if not built:
        yield Check(name, UNCHECKABLE, f"{MANIFEST} records no facts of the {role} checkpoint")
        return
    if folder is None:
        yield Check(name, UNCHECKABLE, f"the {role} checkpoint is not here (looked in {', '.join(looked)}); "
                    + ("the engines were built from it" if release.runtime == "tensorrt-llm" else "mount it"))
        return
    if not _importable("transformers"):
        yield Check(name, UNCHECKABLE, "transformers is not installed here")
        return
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises is the finding
        yield Check(name, FAIL, f"transformers {transformers.__version__} cannot read {folder}/config.json: {exc}",
                    "use a checkpoint this transformers reads, or an image with the transformers the rules name")
        return
    seen = _config_facts(config)
    differences = []
    for key, value in seen.items():
        expected = built.get(key)
        if key == "rope_scaling":
            expected = _scaling(expected)
        if key == "rope_theta" and expected is not None and value is not None:
            same = abs(float(expected) - value) <= 1e-6 * abs(float(expected))
        else:
            same = expected == value
        if not same:
            differences.append(f"{key} {value!r} (built with {expected!r})")
    version = f"transformers {transformers.__version__}"
    if differences:
        rope = any(item.startswith("rope_") for item in differences)
        fix = ("write the legacy top-level rope_theta (and rope_scaling where not default) beside rope_parameters in "
               f"{folder}/config.json, as transformers 4.x reads it, then {RECOMPILE}" if rope else
               f"{RECOMPILE} from the checkpoint this environment reads")
        yield Check(name, FAIL, f"{version} reads {folder}/config.json as " + "; ".join(differences), fix)
    else:
        yield Check(name, PASS, f"{version} reads rope_theta {seen['rope_theta']}, rope_scaling "
                    f"{seen['rope_scaling']}, vocab {seen['vocab_size']}, head_dim {seen['head_dim']}, tied "
                    f"embeddings {seen['tie_word_embeddings']}, as built")


def _tokenizer_dirs(release: Release) -> list[Path]:
    """The tokenizer copy the release ships, and for the LLM-API the tokenizer TensorRT-LLM's ``LLM()`` loads:
    model.yaml's ``tokenizer`` (a path in the container) where it names one, else its target checkpoint."""
    shipped = sorted(release.repository.glob("*/1/tokenizer/tokenizer_config.json"))
    folders = [shipped[0].parent] if shipped else []  # every model ships the same copy
    if release.runtime == "tensorrt-llm-llmapi":
        named = (_model_yaml(release) or {}).get("tokenizer")
        mount = release.spec.get("triton", {}).get("repository_mount", "/triton_repo").rstrip("/")
        if named and not Path(named).is_dir() and named.startswith(mount + "/"):
            named = str(release.repository / named[len(mount) + 1:])  # the container's path, here
        folder = Path(named) if named else release.checkpoint("target")[0]
        folders += [folder] if folder is not None else []
    return folders


def check_tokenizer(release: Release) -> Iterator[Check]:
    """The release's tokenizer loads with the installed transformers, with the eos/bos ids specbuild built with."""
    built = (release.compatibility.get("target") or {}).get("tokenizer") or {}
    folders = _tokenizer_dirs(release)
    if not folders:
        yield Check("tokenizer", UNCHECKABLE, "the release ships no tokenizer copy and its target is not here")
        return
    if not _importable("transformers"):
        yield Check("tokenizer", UNCHECKABLE, "transformers is not installed here")
        return
    import transformers

    problems, seen = [], []
    for folder in folders:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - whatever transformers raises is the finding
            problems.append(f"{folder} does not load: {exc}")
            continue
        for key in ("eos_token_id", "bos_token_id"):
            if key in built and getattr(tokenizer, key) != built[key]:
                problems.append(f"{folder}: {key} {getattr(tokenizer, key)!r} (built with {built[key]!r})")
        seen.append(f"{folder} ({type(tokenizer).__name__}, eos {tokenizer.eos_token_id})")
    version = f"transformers {transformers.__version__}"
    if problems:
        yield Check("tokenizer", FAIL, f"{version}: " + "; ".join(problems),
                    "name a tokenizer class this transformers knows in tokenizer_config.json (PreTrainedTokenizerFast "
                    f"for TokenizersBackend) and set the eos/bos tokens the release was built with, then {RECOMPILE}")
    else:
        yield Check("tokenizer", PASS, f"{version} loads " + "; ".join(seen))


def check_logits(release: Release, role: str) -> Iterator[Check]:
    """A few next-token logits of the checkpoint, computed here in fp32 on the CPU, against the build's."""
    name = f"logits:{role}"
    recorded = (release.facts.get("logits") or {}).get(role)
    if not recorded:
        yield Check(name, UNCHECKABLE, "the release recorded no logits for it (it was packaged without torch, its "
                    f"weights are not safetensors, or it has over {LOGITS_PARAMETER_CAP:,} parameters, too many to run "
                    "on a CPU)")
        return
    folder, looked = release.checkpoint(role)
    if folder is None:
        yield Check(name, UNCHECKABLE, f"the {role} checkpoint is not here (looked in {', '.join(looked)})")
        return
    missing = [module for module in ("torch", "transformers") if not _importable(module)]
    if missing:
        yield Check(name, UNCHECKABLE, f"{' and '.join(missing)} not installed here")
        return
    import torch
    import transformers

    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype
    dtype = {"dtype" if _release_number(transformers.__version__) >= (4, 56) else "torch_dtype": torch.float32}
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=False, **dtype)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises is the finding
        yield Check(name, FAIL, f"transformers {transformers.__version__} cannot load {folder}: {exc}",
                    f"use a checkpoint this transformers loads, then {RECOMPILE}")
        return
    model.eval()
    tolerance = recorded["tolerance"]
    worst: tuple[float, str] | None = None  # the largest error beyond the tolerance, and where
    with torch.no_grad():
        for ids, top in zip(recorded["prompt_ids"], recorded["top"]):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            for token, value in top:
                error = abs(float(logits[token]) - value)
                if error > tolerance["absolute"] + tolerance["relative"] * abs(value) and \
                        (worst is None or error > worst[0]):
                    worst = (error, f"prompt {ids}: token {token} logit {float(logits[token]):.5f}, built {value:.5f}")
    versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
    if worst:
        yield Check(name, FAIL, f"{versions}: next-token logits differ from the build's by up to {worst[0]:.5f} "
                    f"({worst[1]}); tolerance {tolerance['absolute']} + {tolerance['relative']} x |logit|",
                    "this environment computes other numbers from the checkpoint: compare the config check's "
                    f"findings (RoPE, head_dim, tied embeddings), or {RECOMPILE} with the transformers this image has")
    else:
        yield Check(name, PASS, f"{versions}: {sum(len(top) for top in recorded['top'])} next-token logits of "
                    f"{len(recorded['prompt_ids'])} prompts within {tolerance['absolute']} + "
                    f"{tolerance['relative']} x |logit| of the build's")


def _model_yaml(release: Release) -> dict[str, Any] | None:
    path = release.repository / "tensorrt_llm" / "1" / "model.yaml"
    if not path.is_file():
        return None
    if not _importable("yaml"):
        raise Unreadable("PyYAML is not installed here; the LLM-API model reads model.yaml with it")
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _line_rules(release: Release) -> Any:
    """The TensorRT-LLM line table the release's adapter ships (specbuild's lines.py, vendored beside it)."""
    vendored = release.repository / "llmapi_adapter" / "1"
    sys.path.insert(0, str(vendored))
    try:
        from specbuild.runtimes.tensorrt_llm_llmapi import lines
    finally:
        sys.path.remove(str(vendored))
    return lines


def check_model_yaml(release: Release) -> Iterator[Check]:
    """The LLM-API release's model.yaml against its TensorRT-LLM line's parsers: the line table always, TensorRT-LLM's
    own ``DecodingBaseConfig`` where tensorrt_llm is importable."""
    config = _model_yaml(release)
    speculative = (config or {}).get("speculative_config") or {}
    line_name = release.facts.get("line")
    lines = _line_rules(release)
    line = lines.LINES.get(line_name)
    refusals = line.refusals(speculative) if line else [f"no rules for TensorRT-LLM line {line_name!r}"]
    where = "tensorrt_llm/1/model.yaml speculative_config"
    if refusals:
        yield Check("model.yaml:line-rules", FAIL, f"{where}: " + "; ".join(refusals),
                    f"TensorRT-LLM {line.tensorrt_llm if line else line_name} refuses it: package the release again "
                    "(`specbuild package --runtime tensorrt-llm-llmapi`) rather than edit model.yaml")
    else:
        yield Check("model.yaml:line-rules", PASS,
                    f"{where} keeps every rule of TensorRT-LLM {line.tensorrt_llm} (decoding_type "
                    f"{speculative.get('decoding_type')!r})")
    if not _importable("tensorrt_llm"):
        yield Check("model.yaml:tensorrt-llm", UNCHECKABLE, "tensorrt_llm is not importable here (it is in the image)")
        return
    try:
        from tensorrt_llm.llmapi.llm_args import DecodingBaseConfig
    except Exception as exc:  # noqa: BLE001 - an import that fails is the finding
        yield Check("model.yaml:tensorrt-llm", UNCHECKABLE, f"tensorrt_llm.llmapi.llm_args does not import: {exc}")
        return
    if not hasattr(DecodingBaseConfig, "from_dict"):
        yield Check("model.yaml:tensorrt-llm", UNCHECKABLE, "this TensorRT-LLM's DecodingBaseConfig has no from_dict "
                    "(the 1.2 line's dispatch, tensorrt_llm/llmapi/llm_args.py)")
        return
    try:
        parsed = DecodingBaseConfig.from_dict(dict(speculative))
    except Exception as exc:  # noqa: BLE001 - TensorRT-LLM's own refusal is the finding
        yield Check("model.yaml:tensorrt-llm", FAIL, f"TensorRT-LLM {_version('tensorrt_llm')} refuses {where}: {exc}",
                    "package the release for this image's TensorRT-LLM line (`specbuild package --runtime "
                    "tensorrt-llm-llmapi`) rather than edit model.yaml")
        return
    yield Check("model.yaml:tensorrt-llm", PASS,
                f"TensorRT-LLM {_version('tensorrt_llm')} parses {where} as {type(parsed).__name__}")


def check_engines(release: Release) -> Iterator[Check]:
    """Each built engine's config.json (TensorRT-LLM's) against the build record specbuild wrote for it."""
    records = (release.manifest.get("extra") or {}).get("build_info") or {}
    if not release.manifest.get("engines_built", True) or not records:
        yield Check("engines", UNCHECKABLE, "the release was packaged without engines (engines_built false): "
                    "build them on the GPU host (`specbuild compile`), then run the doctor again")
        return
    if release.engines is None or not release.engines.is_dir():
        yield Check("engines", UNCHECKABLE, f"the engines folder is not here ({release.engines}); mount it")
        return
    problems, seen = [], []
    for role, record in records.items():
        path = release.engines / role / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
            build, pretrained = config["build_config"], config["pretrained_config"]
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"{path} is not a TensorRT-LLM engine config ({exc})")
            continue
        limits = record["limits"]
        expected = {"pretrained_config.dtype": record["dtype"], "pretrained_config.vocab_size": record["vocab_size"],
                    "pretrained_config.architecture": record["architecture"],
                    "build_config.max_batch_size": limits["max_batch_size"],
                    "build_config.max_input_len": limits["max_input_len"],
                    # trtllm-build counts the drafted positions in max_seq_len (build_record.BuildLimits)
                    "build_config.max_seq_len": limits["max_seq_len"] + limits.get("max_draft_len", 0),
                    "build_config.max_draft_len": limits.get("max_draft_len", 0)}
        found = {"pretrained_config." + key: pretrained.get(key) for key in ("dtype", "vocab_size", "architecture")}
        found.update({"build_config." + key: build.get(key) or (0 if key == "max_draft_len" else None)
                      for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_draft_len")})
        problems += [f"{role}: {key} {found[key]!r}, the build record says {value!r}"
                     for key, value in expected.items() if found[key] != value]
        seen.append(role)
    if problems:
        yield Check("engines", FAIL, "; ".join(problems), "rebuild the engines with this release's spec "
                    "(`specbuild compile`): the repository's configs were packaged for the recorded ones")
    else:
        yield Check("engines", PASS, f"the {' and '.join(seen)} engines' config.json match their build records")


def check_python_backend(release: Release) -> Iterator[Check]:
    """The python backend's known bugs (by the image's Triton release) that the release's python models would hit."""
    bugs = release.facts.get("python_backend_bugs", [])
    hit = [bug for bug in bugs if bug["files"]]
    if not hit:
        yield Check("python-backend", PASS, "the release's python models use none of the python backend's known "
                    f"bugs ({', '.join(bug['name'] for bug in bugs) or 'none recorded'})")
        return
    if release.triton_version is None:
        yield Check("python-backend", UNCHECKABLE,
                    f"the Triton release is unknown here ({TRITON_VERSION_ENV} is unset); the release's python models "
                    + "; ".join(f"use {bug['name']} ({', '.join(bug['files'])}), fixed in r{bug['fixed_in']}"
                                for bug in hit))
        return
    broken = [bug for bug in hit if _release_number(release.triton_version) < _release_number(bug["fixed_in"])]
    if broken:
        yield Check("python-backend", FAIL, f"Triton {release.triton_version}: " + "; ".join(
            f"{bug['summary']} ({bug['source']}), which {', '.join(bug['files'])} would hit" for bug in broken),
            f"serve from an image of r{max(bug['fixed_in'] for bug in broken)} or later, or package the release with "
            "a specbuild whose models avoid it")
    else:
        yield Check("python-backend", PASS, f"Triton {release.triton_version} has the fixes of "
                    + ", ".join(f"{bug['name']} (r{bug['fixed_in']})" for bug in hit))


def check_gpus(release: Release) -> Iterator[Check]:
    """The GPUs visible here against the launch's count and the memory plan's least memory per GPU."""
    plan = release.compatibility.get("memory_plan") or {}
    needed, need_bytes = plan.get("gpus", 1), plan.get("min_gpu_bytes")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        yield Check("gpus", UNCHECKABLE, f"no nvidia-smi here; the release needs {needed} GPU(s) of at least "
                    f"{need_bytes / 2**30:.2f} GiB" if need_bytes else "no nvidia-smi here")
        return
    try:
        output = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        yield Check("gpus", UNCHECKABLE, f"nvidia-smi failed: {exc}")
        return
    gpus = [(name.strip(), int(float(mib)) * 2**20) for name, mib in
            (line.rsplit(",", 1) for line in output.strip().splitlines() if "," in line)]
    seen = ", ".join(f"{name} ({size / 2**30:.1f} GiB)" for name, size in gpus) or "none"
    small = [name for name, size in gpus if need_bytes and size < need_bytes]
    if len(gpus) < needed or small:
        yield Check("gpus", FAIL, f"visible: {seen}; the release needs {needed} GPU(s) of at least "
                    f"{(need_bytes or 0) / 2**30:.2f} GiB (its memory plan)",
                    "run on a host (or with `--gpus`) that gives the container enough GPUs, or compile for this one "
                    "(tp/pp, limits)")
    else:
        yield Check("gpus", PASS, f"visible: {seen}; the release needs {needed} of at least "
                    f"{(need_bytes or 0) / 2**30:.2f} GiB")


def check_tokenizer_info(release: Release) -> Iterator[Check]:
    """A guided release's xgrammar tokenizer-info file, read by the installed xgrammar as the backend reads it."""
    recorded = release.facts["tokenizer_info"]
    path = release.repository / recorded["path"]
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        keys = [key for key in recorded["keys"] if key not in info]
    except (OSError, ValueError) as exc:
        info, keys = {}, [f"the file does not read ({exc})"]
    if keys:
        yield Check("tokenizer-info", FAIL, f"{path} lacks {', '.join(keys)}",
                    f"{RECOMPILE} (it writes generate_xgrammar_tokenizer_info.py's format)")
        return
    if not _importable("xgrammar"):
        yield Check("tokenizer-info", UNCHECKABLE, "xgrammar is not installed here (the packages check names the "
                    "rule)")
        return
    import xgrammar

    vocab_size = (release.compatibility.get("target") or {}).get("vocab_size") or len(info["encoded_vocab"])
    try:
        # the Python face of the C++ TokenizerInfo::FromHuggingFace the backend calls (guidedDecoder.cpp, v1.2.1)
        metadata_ = xgrammar.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
        xgrammar.TokenizerInfo(info["encoded_vocab"], metadata_["vocab_type"], vocab_size=vocab_size,
                               stop_token_ids=info["stop_token_ids"], add_prefix_space=metadata_["add_prefix_space"])
    except Exception as exc:  # noqa: BLE001 - whatever xgrammar raises is the finding
        yield Check("tokenizer-info", FAIL, f"xgrammar {_version('xgrammar')} cannot read {path}: {exc}",
                    f"{RECOMPILE} with the xgrammar this image has")
        return
    yield Check("tokenizer-info", PASS, f"xgrammar {_version('xgrammar')} reads {path.name} "
                f"({len(info['encoded_vocab'])} tokens, vocabulary {vocab_size})")


def checks(release: Release) -> list[tuple[str, Callable[[], Iterator[Check]]]]:
    """The checks that apply to the release, in order, each by the name its verdicts carry."""
    found: list[tuple[str, Callable[[], Iterator[Check]]]] = [("files", lambda: check_files(release)),
                                                              ("packages", lambda: check_packages(release))]
    for role in ROLES:
        found += [(f"config:{role}", lambda role=role: check_checkpoint_config(release, role)),
                  (f"logits:{role}", lambda role=role: check_logits(release, role))]
    found.append(("tokenizer", lambda: check_tokenizer(release)))
    if release.runtime == "tensorrt-llm-llmapi":
        found.append(("model.yaml", lambda: check_model_yaml(release)))
    if release.runtime == "tensorrt-llm":
        found.append(("engines", lambda: check_engines(release)))
    if release.guided:
        found.append(("tokenizer-info", lambda: check_tokenizer_info(release)))
    found.append(("python-backend", lambda: check_python_backend(release)))
    if release.gpu:
        found.append(("gpus", lambda: check_gpus(release)))
    return found


def run(release: Release) -> list[Check]:
    results = []
    for name, check in checks(release):
        try:
            results += list(check())
        except Unreadable as exc:
            results.append(Check(name, UNCHECKABLE, str(exc)))
        except Exception as exc:  # noqa: BLE001 - one check's surprise must not hide the others' verdicts
            results.append(Check(name, FAIL, f"the check itself raised {type(exc).__name__}: {exc}",
                                 "report it as a specbuild bug with this output; `specbuild serve --no-doctor` "
                                 "starts the release meanwhile"))
    return results


def _role_path(text: str) -> tuple[str, Path]:
    role, _, path = text.partition("=")
    if role not in ROLES or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: want ROLE=DIR, ROLE one of {', '.join(ROLES)}")
    return role, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--engines", type=Path, help="the release's engines folder here")
    parser.add_argument("--checkpoint", type=_role_path, action="append", default=[], metavar="ROLE=DIR",
                        help="where a checkpoint is here")
    args = parser.parse_args(argv)
    try:
        release = Release(HERE, args.engines, dict(args.checkpoint))
    except Unreadable as exc:
        print(f"error: {exc}\n  fix: run the doctor inside a release folder that specbuild compiled",
              file=sys.stderr)
        return 2
    results = run(release)
    failed = any(check.verdict == FAIL for check in results)
    if args.json:
        print(json.dumps({"release": release.spec.get("name"), "runtime": release.runtime,
                          "python": sys.version.split()[0], "triton": release.triton_version, "ok": not failed,
                          "checks": [asdict(check) for check in results]}))
    else:
        for check in results:
            print(f"{check.verdict:>18}  {check.name}: {check.evidence}")
            if check.fix:
                print(f"{'':>18}  fix: {check.fix}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
