"""The typed build spec: ``specbuild.yaml`` plus command-line overrides.

Every field has a default that works for the demo pair; unknown keys and bad values are rejected with the
field's dotted path and the allowed values (see :func:`load_spec`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specbuild.errors import SpecError
from specbuild.speculation.lookup import PromptLookup

Runtime = Literal["torch", "tensorrt-llm", "auto"]
Dtype = Literal["auto", "float16", "bfloat16", "float32"]
Acceptance = Literal["token-match", "draft-logits"]

DEFAULT_SPEC_FILE = "specbuild.yaml"
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Strict):
    """One checkpoint (target or draft) and how to shard it."""

    checkpoint: str = Field(description="HF checkpoint folder (config.json, tokenizer, safetensors)")
    dtype: Dtype = Field("auto", description="engine dtype; auto: bfloat16/float16 on GPU, float32 on CPU")
    tp_size: int = Field(1, ge=1, le=64, description="tensor-parallel ranks")
    pp_size: int = Field(1, ge=1, le=64, description="pipeline-parallel ranks")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


class PromptLookupSpec(_Strict):
    """Prompt lookup drafting: each round, propose what followed the last earlier occurrence of the context's
    final n-gram (no model call); the draft model drafts when lookup finds nothing (``draft_fallback``)."""

    enabled: bool = Field(False, description="requests look up their own tokens first (each may turn it off)")
    max_ngram: int = Field(4, ge=1, le=32, description="longest suffix n-gram looked up")
    min_ngram: int = Field(2, ge=1, le=32, description="shortest suffix n-gram looked up")
    draft_fallback: bool = Field(True, description="the draft model drafts when lookup finds nothing; false: the "
                                 "target alone then (for a draft whose cost exceeds what it brings)")

    @model_validator(mode="after")
    def _ngram_order(self) -> PromptLookupSpec:
        PromptLookup(max_ngram=self.max_ngram, min_ngram=self.min_ngram)  # the one check of the range
        return self


class SpeculationSpec(_Strict):
    max_draft_len: int = Field(8, ge=1, le=64, description="most draft tokens a request may ask for (engine limit)")
    num_draft_tokens: int = Field(4, ge=0, description="default draft tokens per round (0 = target alone)")
    acceptance: Acceptance = Field(
        "draft-logits",
        description="draft-logits: rejection sampling on p/q (exact, higher acceptance); "
        "token-match: target samples and accepts equal tokens (exact, no draft logits)",
    )
    adaptive: bool = Field(False, description="adapt K per request: longer after full acceptance, shorter after rejections")
    prompt_lookup: PromptLookupSpec = PromptLookupSpec()

    @model_validator(mode="after")
    def _k_within_engine(self) -> SpeculationSpec:
        if self.num_draft_tokens > self.max_draft_len:
            raise ValueError(
                f"num_draft_tokens ({self.num_draft_tokens}) is larger than max_draft_len ({self.max_draft_len}); "
                "raise max_draft_len or lower num_draft_tokens"
            )
        return self


class LimitsSpec(_Strict):
    max_batch_size: int = Field(8, ge=1, le=1024)
    max_input_len: int = Field(1024, ge=1)
    max_seq_len: int = Field(2048, ge=2, description="prompt + generated tokens")

    @model_validator(mode="after")
    def _seq_holds_input(self) -> LimitsSpec:
        if self.max_seq_len <= self.max_input_len:
            raise ValueError(
                f"max_seq_len ({self.max_seq_len}) must be larger than max_input_len ({self.max_input_len}) "
                "so that at least one token can be generated"
            )
        return self


class TritonSpec(_Strict):
    host: str = Field("127.0.0.1", description="address the server binds to (loopback unless told otherwise)")
    http_port: int = Field(8000, ge=0, le=65535, description="0 = pick a free port")
    grpc_port: int = Field(8001, ge=0, le=65535)
    metrics_port: int = Field(8002, ge=0, le=65535)
    image: str = Field(DEFAULT_TRITON_IMAGE, description="NGC image for the tensorrt-llm runtime (TensorRT-LLM 1.2.x)")
    engine_mount: str = Field("/engines", description="where engines are mounted inside the container")
    repository_mount: str = Field("/triton_repo", description="where the repository is mounted inside the container")
    gpu_memory_gib: float | None = Field(None, gt=0, description="GPU memory for the memory plan; None = not checked")
    kv_cache_free_gpu_mem_fraction: float | None = Field(
        None, gt=0, lt=1, description="target+draft share of free GPU memory for KV cache; None = from the memory plan"
    )
    orchestrator_instances: int = Field(1, ge=1, le=64)
    engine_instances: int = Field(1, ge=1, le=64, description="torch runtime: instances per engine model")

    @field_validator("engine_mount", "repository_mount")
    @classmethod
    def _absolute_mount(cls, value: str) -> str:
        if not value.startswith("/") or ".." in Path(value).parts:
            raise ValueError(f"must be an absolute path inside the container without '..', got {value!r}")
        return value


class LaunchSpec(_Strict):
    """How the TensorRT-LLM engines are laid out over processes and GPUs (tensorrt-llm runtime). Compiled into
    the engine configs (``gpu_device_ids``, ``participant_ids``, ``speculative_decoding_fast_logits``); ``serve``
    and ``deploy`` launch what the release was compiled for."""

    mode: Literal["auto", "single", "leader", "orchestrator"] = Field(
        "auto", description="auto: single when both models have one rank, else TensorRT-LLM's orchestrator mode "
        "(required with tensor parallelism for two models)")
    placement: Literal["shared", "separate"] = Field(
        "shared", description="shared: the draft on the target's first GPU(s); separate: GPUs of its own")
    fast_logits: bool = Field(False, description="pass draft logits GPU to GPU (orchestrator mode, no spawning; "
                              "draft-logits acceptance)")


class TorchSpec(_Strict):
    """The torch runtime's engine models."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when the server has a GPU")
    target_threads: int = Field(0, ge=0, le=1024, description="intra-op threads of the target's process; 0: "
                                "every core of the host (the models take turns and do not spin-wait)")
    draft_threads: int = Field(0, ge=0, le=1024, description="the same for the draft's process")


class OutputsSpec(_Strict):
    build_dir: str = "build"
    engines_dir: str = "engines"
    repository_dir: str = "triton_repo"


class SecuritySpec(_Strict):
    allow_pickle: bool = Field(False, description="load pickle (.bin/.pt) weights; only for checkpoints you trust")
    trust_remote_code: bool = Field(False, description="run code shipped with a checkpoint; only if you trust it")


class BuildSpec(_Strict):
    """Everything ``specbuild compile`` needs; see ``specbuild init`` for a commented example."""

    name: str = Field("specbuild", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    runtime: Runtime = "auto"
    target: ModelSpec
    draft: ModelSpec
    speculation: SpeculationSpec = SpeculationSpec()
    limits: LimitsSpec = LimitsSpec()
    triton: TritonSpec = TritonSpec()
    launch: LaunchSpec = LaunchSpec()
    torch: TorchSpec = TorchSpec()
    outputs: OutputsSpec = OutputsSpec()
    security: SecuritySpec = SecuritySpec()

    @model_validator(mode="after")
    def _fast_logits_need_draft_logits(self) -> BuildSpec:
        if self.launch.fast_logits and self.speculation.acceptance != "draft-logits":
            raise ValueError("launch.fast_logits passes the draft's logits to the target, but speculation.acceptance "
                             f"is {self.speculation.acceptance!r}, which never sends them; set acceptance: "
                             "draft-logits or turn fast logits off")
        return self

    def resolved_runtime(self) -> str:
        """``auto`` means the best runtime this machine can build with (see build.runtimes.best_available)."""
        if self.runtime != "auto":
            return self.runtime
        from specbuild.build.runtimes import best_available

        return best_available()

    def resolved(self) -> BuildSpec:
        """A copy with ``runtime: auto`` replaced by the runtime that will really be used."""
        return self.model_copy(update={"runtime": self.resolved_runtime()})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _describe_errors(error: ValidationError, source: str) -> str:
    lines = [f"invalid build spec ({source}):"]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `specbuild init` writes every key with a comment)"
        elif item["type"] == "missing":
            message = "required field is missing"
        lines.append(f"  {path}: {message}")
    return "\n".join(lines)


def parse_override(assignment: str) -> tuple[str, Any]:
    """``"speculation.max_draft_len=8"`` -> ``("speculation.max_draft_len", 8)`` (value parsed as YAML)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"override {assignment!r} is not KEY=VALUE", "write it as e.g. --set limits.max_seq_len=4096")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError):  # deeply nested brackets exhaust the YAML composer's recursion
        value = raw
    return key.strip(), value


def _apply_override(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"cannot set {dotted!r}: {part!r} is not a section", "check the key's path")
        node = child
    node[parts[-1]] = value


def read_spec_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist", "run `specbuild init` to write a starter spec")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecError(f"spec file {str(path)!r} is not valid YAML: {exc}", "fix the file's syntax") from None
    except RecursionError:
        raise SpecError(f"spec file {str(path)!r} nests too deeply to be a build spec",
                        "write the spec as `specbuild init` does (a few levels of keys)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"spec file {str(path)!r} must hold a mapping at the top level", "see `specbuild init`")
    return data


def load_spec(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    base_dir: str | Path | None = None,
) -> BuildSpec:
    """Read a spec file (optional), apply dotted-key ``overrides`` and validate.

    Relative checkpoint and output paths in a file are resolved against the file's folder, so a spec means
    the same wherever it is run from; override values are taken relative to ``base_dir`` (the cwd).
    """
    data: dict[str, Any] = read_spec_file(path) if path else {}
    source = str(path) if path else "command line"
    file_dir = Path(path).resolve().parent if path else None
    if file_dir is not None:
        _resolve_relative_paths(data, file_dir)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        _apply_override(data, dotted, value)
    cwd = Path(base_dir).resolve() if base_dir else Path.cwd()
    _resolve_relative_paths(data, cwd)
    try:
        return BuildSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_describe_errors(exc, source), "correct the fields named above") from None


def _resolve_relative_paths(data: dict[str, Any], root: Path) -> None:
    for role in ("target", "draft"):
        model = data.get(role)
        if isinstance(model, dict) and isinstance(model.get("checkpoint"), str):
            model["checkpoint"] = str((root / model["checkpoint"]).resolve()) if model["checkpoint"] else ""
    outputs = data.get("outputs")
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            if isinstance(value, str) and value:
                outputs[key] = str((root / value).resolve())


STARTER_SPEC = """\
# specbuild build spec. Every key is optional except target/draft checkpoints.
# CLI flags override these values (e.g. --set speculation.num_draft_tokens=3).
name: {name}
# torch: HF checkpoints run with PyTorch inside Triton python models (CPU or CUDA);
# tensorrt-llm: TensorRT-LLM 1.2.x engines on Triton's tensorrtllm backend (CUDA GPU, NGC image);
# auto: tensorrt-llm where it is installed, else torch.
runtime: {runtime}
target:
  checkpoint: {target}   # HF folder: config.json, tokenizer files, *.safetensors
  dtype: auto            # auto | float16 | bfloat16 | float32 (float32: torch runtime only)
  tp_size: 1             # tensor-parallel GPUs
  pp_size: 1             # pipeline-parallel GPUs
draft:
  checkpoint: {draft}    # must share the target's tokenizer; ideally 10-100x smaller
  dtype: auto
  tp_size: 1
  pp_size: 1
speculation:
  max_draft_len: 8         # the target engine is built for at most this many draft tokens
  num_draft_tokens: 4      # default K per request (requests may ask for 0..max_draft_len)
  acceptance: draft-logits # draft-logits (rejection sampling) | token-match
  adaptive: false          # adapt K per request from its acceptance
  prompt_lookup:           # draft from the request's own tokens first (free), the draft model when none match
    enabled: false         # requests may turn it on or off (input prompt_lookup)
    max_ngram: 4           # look up the context's last 4 tokens, then 3, ... down to min_ngram
    min_ngram: 2
    draft_fallback: true   # false: no draft-model call when lookup finds nothing (a weak draft costs more than it brings)
limits:
  max_batch_size: 8
  max_input_len: 1024      # prompt tokens
  max_seq_len: 2048        # prompt + generated tokens
triton:
  host: 127.0.0.1          # bind address; loopback unless you mean to expose it
  http_port: 8000
  grpc_port: 8001
  metrics_port: 8002
  image: {image}
  engine_mount: /engines
  repository_mount: /triton_repo
  gpu_memory_gib: null     # set to check the memory plan against your GPU (e.g. 80)
  kv_cache_free_gpu_mem_fraction: null  # null = split from the memory plan
outputs:
  build_dir: build
  engines_dir: engines
  repository_dir: triton_repo
security:
  allow_pickle: false        # refuse .bin/.pt pickles unless you trust the checkpoint
  trust_remote_code: false   # refuse checkpoints that need their own Python code
"""


def starter_spec(target: str = "models/demo/target", draft: str = "models/demo/draft", *, name: str = "demo",
                 runtime: str = "auto") -> str:
    """The commented spec ``specbuild init`` writes; it parses back to a valid :class:`BuildSpec`."""
    return STARTER_SPEC.format(name=name, runtime=runtime, target=target, draft=draft, image=DEFAULT_TRITON_IMAGE)
