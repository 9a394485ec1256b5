"""The doctor's checks of what a release's runtime serves with: the LLM-API release's model.yaml against its
TensorRT-LLM line, the tensorrt-llm release's engines against their build records, and a guided release's xgrammar
tokenizer-info file. Standard library only at import; shipped beside ``doctor.py``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

if __package__:  # specbuild.doctor.runtime_checks
    from specbuild.doctor.checked_release import (FAIL, PASS, RECOMPILE, UNCHECKABLE, Check, FoundRelease, Unreadable,
                                                  importable, installed_version)
else:  # beside doctor.py in a release, which put its folder on sys.path
    from checked_release import (FAIL, PASS, RECOMPILE, UNCHECKABLE, Check, FoundRelease, Unreadable, importable,
                                 installed_version)


def model_yaml(release: FoundRelease) -> dict[str, Any] | None:
    path = release.repository / "tensorrt_llm" / "1" / "model.yaml"
    if not path.is_file():
        return None
    if not importable("yaml"):
        raise Unreadable("PyYAML is not installed here; the LLM-API model reads model.yaml with it")
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _line_rules(release: FoundRelease) -> Any:
    """The TensorRT-LLM line table the release's adapter ships (specbuild's lines.py, vendored beside it)."""
    vendored = release.repository / "llmapi_adapter" / "1"
    sys.path.insert(0, str(vendored))
    try:
        from specbuild.runtimes.tensorrt_llm_llmapi import lines
    finally:
        sys.path.remove(str(vendored))
    return lines


def check_model_yaml(release: FoundRelease) -> Iterator[Check]:
    """The LLM-API release's model.yaml against its TensorRT-LLM line's parsers: the line table always, TensorRT-LLM's
    own ``DecodingBaseConfig`` where tensorrt_llm is importable."""
    config = model_yaml(release)
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
    if not importable("tensorrt_llm"):
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
        yield Check("model.yaml:tensorrt-llm", FAIL, f"TensorRT-LLM {installed_version('tensorrt_llm')} refuses {where}: {exc}",
                    "package the release for this image's TensorRT-LLM line (`specbuild package --runtime "
                    "tensorrt-llm-llmapi`) rather than edit model.yaml")
        return
    yield Check("model.yaml:tensorrt-llm", PASS,
                f"TensorRT-LLM {installed_version('tensorrt_llm')} parses {where} as {type(parsed).__name__}")


def check_engines(release: FoundRelease) -> Iterator[Check]:
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


def check_tokenizer_info(release: FoundRelease) -> Iterator[Check]:
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
    if not importable("xgrammar"):
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
        yield Check("tokenizer-info", FAIL, f"xgrammar {installed_version('xgrammar')} cannot read {path}: {exc}",
                    f"{RECOMPILE} with the xgrammar this image has")
        return
    yield Check("tokenizer-info", PASS, f"xgrammar {installed_version('xgrammar')} reads {path.name} "
                f"({len(info['encoded_vocab'])} tokens, vocabulary {vocab_size})")
