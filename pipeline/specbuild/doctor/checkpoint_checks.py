"""The doctor's checks of the checkpoints as this environment reads them: each config.json as the installed
transformers reads it (RoPE, vocabulary, head_dim, tied embeddings), the tokenizer with its eos/bos ids, and a few
next-token logits against the build's. Standard library only at import; shipped beside ``doctor.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__:  # specbuild.doctor.checkpoint_checks
    from specbuild.doctor.checked_release import (FAIL, LOGITS_PARAMETER_CAP, MANIFEST, PASS, RECOMPILE, UNCHECKABLE,
                                                  Check, FoundRelease, importable, release_number)
    from specbuild.doctor.runtime_checks import model_yaml
else:  # beside doctor.py in a release, which put its folder on sys.path
    from checked_release import (FAIL, LOGITS_PARAMETER_CAP, MANIFEST, PASS, RECOMPILE, UNCHECKABLE, Check, FoundRelease,
                                 importable, release_number)
    from runtime_checks import model_yaml


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


def check_checkpoint_config(release: FoundRelease, role: str) -> Iterator[Check]:
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
    if not importable("transformers"):
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


def _tokenizer_dirs(release: FoundRelease) -> list[Path]:
    """The tokenizer copy the release ships, and for the LLM-API the tokenizer TensorRT-LLM's ``LLM()`` loads:
    model.yaml's ``tokenizer`` (a path in the container) where it names one, else its target checkpoint."""
    shipped = sorted(release.repository.glob("*/1/tokenizer/tokenizer_config.json"))
    folders = [shipped[0].parent] if shipped else []  # every model ships the same copy
    if release.runtime == "tensorrt-llm-llmapi":
        named = (model_yaml(release) or {}).get("tokenizer")
        mount = release.spec.get("triton", {}).get("repository_mount", "/triton_repo").rstrip("/")
        if named and not Path(named).is_dir() and named.startswith(mount + "/"):
            named = str(release.repository / named[len(mount) + 1:])  # the container's path, here
        folder = Path(named) if named else release.checkpoint("target")[0]
        folders += [folder] if folder is not None else []
    return folders


def check_tokenizer(release: FoundRelease) -> Iterator[Check]:
    """The release's tokenizer loads with the installed transformers, with the eos/bos ids specbuild built with."""
    built = (release.compatibility.get("target") or {}).get("tokenizer") or {}
    folders = _tokenizer_dirs(release)
    if not folders:
        yield Check("tokenizer", UNCHECKABLE, "the release ships no tokenizer copy and its target is not here")
        return
    if not importable("transformers"):
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


def check_logits(release: FoundRelease, role: str) -> Iterator[Check]:
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
    missing = [module for module in ("torch", "transformers") if not importable(module)]
    if missing:
        yield Check(name, UNCHECKABLE, f"{' and '.join(missing)} not installed here")
        return
    import torch
    import transformers

    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype
    dtype = {"dtype" if release_number(transformers.__version__) >= (4, 56) else "torch_dtype": torch.float32}
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
