"""The typed build spec: ``specbuild.yaml`` plus command-line overrides.

Every field has a default that works for the demo pair; unknown keys and bad values are rejected with the
field's dotted path and the allowed values (see :func:`load_spec`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specbuild.errors import SpecError

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
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) is larger than max_ngram ({self.max_ngram}); "
                             "lower min_ngram or raise max_ngram")
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


DEFAULT_MAX_SEQ_LEN = 2048  # the most a default max_seq_len takes from a checkpoint's max_position_embeddings


class LimitsSpec(_Strict):
    """What engines are built for. Limits left null are taken from the checkpoints when they are read
    (:meth:`resolve`), as trtllm-build does; only values the user set can be refused as too large."""

    max_batch_size: int = Field(8, ge=1, le=1024, description="most requests an engine runs at once")
    max_input_len: int | None = Field(None, ge=1, description="most prompt tokens; null = half of max_seq_len")
    max_seq_len: int | None = Field(
        None, ge=2, description="most prompt + generated tokens; null = the checkpoints' max_position_embeddings, "
        f"at most {DEFAULT_MAX_SEQ_LEN} (set it to build for longer sequences)")

    @model_validator(mode="after")
    def _seq_holds_input(self) -> LimitsSpec:
        if self.max_seq_len is not None and self.max_input_len is not None \
                and self.max_seq_len <= self.max_input_len:
            raise ValueError(
                f"max_seq_len ({self.max_seq_len}) must be larger than max_input_len ({self.max_input_len}) "
                "so that at least one token can be generated"
            )
        return self

    def resolve(self, max_positions: int | None) -> LimitsSpec:
        """These limits with the null ones filled in for checkpoints that hold ``max_positions`` tokens
        (None: unknown): max_seq_len = min(max_positions, DEFAULT_MAX_SEQ_LEN) but above a max_input_len the
        user set; max_input_len = half of max_seq_len."""
        seq_len = self.max_seq_len
        if seq_len is None:
            seq_len = max(2, min(max_positions or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN))
            if self.max_input_len is not None:
                seq_len = max(seq_len, self.max_input_len + 1)
        input_len = self.max_input_len if self.max_input_len is not None else seq_len // 2
        return LimitsSpec(max_batch_size=self.max_batch_size, max_input_len=input_len, max_seq_len=seq_len)


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
    outputs: OutputsSpec = OutputsSpec()
    security: SecuritySpec = SecuritySpec()

    def resolved_runtime(self) -> Literal["torch", "tensorrt-llm"]:
        """``auto`` means tensorrt-llm where TensorRT-LLM imports, else the embedded torch runtime."""
        if self.runtime != "auto":
            return self.runtime
        import importlib.util

        return "tensorrt-llm" if importlib.util.find_spec("tensorrt_llm") else "torch"

    def resolved(self) -> BuildSpec:
        """A copy with ``runtime: auto`` replaced by the runtime that will really be used."""
        return self.model_copy(update={"runtime": self.resolved_runtime()})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _describe_errors(error: ValidationError, origin: Callable[[tuple[Any, ...]], str | None]) -> str:
    """One line per bad value: its dotted path, the problem, and where the value came from."""
    lines = ["invalid build spec:"]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `specbuild init` writes every key with a comment)"
        elif item["type"] == "missing":
            message = "required field is missing"
        where = origin(tuple(item["loc"]))
        lines.append(f"  {path}: {message}" + (f" (from {where})" if where else ""))
    return "\n".join(lines)


def _value_origin(loc: tuple[Any, ...], file_name: str | None, file_data: dict[str, Any],
                  override_sources: Mapping[str, str]) -> str | None:
    """Where the value(s) at ``loc`` came from: the spec file, the overrides that touch it, both, or None
    (a default)."""
    dotted = ".".join(str(part) for part in loc)
    touching = [source for key, source in override_sources.items()
                if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + ".")]
    replaced = any(key == dotted or dotted.startswith(key + ".") for key in override_sources)
    node: Any = file_data
    for part in loc:
        node = node.get(part) if isinstance(node, dict) else None
    from_file = [file_name] if file_name and node is not None and not replaced else []
    return " and ".join(from_file + touching) or None


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
    overrides: Mapping[str, Any] | None = None,
    *,
    base_dir: str | Path | None = None,
    override_sources: Mapping[str, str] | None = None,
) -> BuildSpec:
    """Read a spec file (optional), apply dotted-key ``overrides`` and validate.

    Relative checkpoint and output paths in a file are resolved against the file's folder, so a spec means
    the same wherever it is run from; override values are taken relative to ``base_dir`` (the cwd). A bad
    value is reported with where it came from: the file, or the override's entry in ``override_sources``
    (how the user gave it, e.g. ``--set limits.max_seq_len=9``; default ``override <key>``).
    """
    data: dict[str, Any] = read_spec_file(path) if path else {}
    file_data = copy.deepcopy(data)
    file_dir = Path(path).resolve().parent if path else None
    if file_dir is not None:
        _resolve_relative_paths(data, file_dir)
    given = {dotted: value for dotted, value in (overrides or {}).items() if value is not None}
    for dotted, value in given.items():
        _apply_override(data, dotted, value)
    cwd = Path(base_dir).resolve() if base_dir else Path.cwd()
    _resolve_relative_paths(data, cwd)
    try:
        return BuildSpec.model_validate(data)
    except ValidationError as exc:
        sources = {dotted: (override_sources or {}).get(dotted, f"override {dotted}") for dotted in given}
        file_name = str(path) if path else None
        message = _describe_errors(exc, lambda loc: _value_origin(loc, file_name, file_data, sources))
        raise SpecError(message, "correct the values named above where they were given") from None


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
