"""``model.yaml`` of the LLM-API Triton model and the ``trtllm-serve --config`` YAML, as typed values.

Both files hold TensorRT-LLM ``LLM()`` arguments (the Triton model passes every key but ``triton_config`` to
``update_llm_args_with_extra_dict`` and then ``LLM(**args)``; ``trtllm-serve --config`` does the same with its
file). Each is a pydantic model with ``extra="forbid"``: a key specbuild does not know cannot be written or
read back, and :data:`UPSTREAM_FIELDS` names, for every key, the upstream class that declares it (a test checks
the models against that table). What differs between TensorRT-LLM lines (the ``decoding_type`` spelling, the
``speculative_config`` fields and values each accepts) is in the line's rule table
(:mod:`specbuild.runtimes.tensorrt_llm_llmapi.lines`), which :func:`parse` applies before the typed model, as the
stand-in's reading of a release must fail where the line's parser fails. Packaging fills them from the spec and
the check's memory plan (:mod:`specbuild.runtimes.tensorrt_llm_llmapi.repository`).

Upstream (read, not copied): TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py`` (``BaseLlmArgs``/``TorchLlmArgs``,
``KvCacheConfig``, ``DecodingBaseConfig``/``DraftTargetDecodingConfig``), ``triton_backend/all_models/llmapi/
tensorrt_llm/1/model.py`` (``triton_config``: ``max_batch_size`` and ``decoupled`` are both read).
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbuild.errors import SpecbuildError
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LineRules

# Every key below and the upstream class that declares it (tensorrt_llm/llmapi/llm_args.py, TensorRT-LLM 1.2.x
# and newest main alike), or the Triton model that reads it.
UPSTREAM_FIELDS: dict[str, dict[str, str]] = {
    "LLMArgs": {
        "model": "BaseLlmArgs", "backend": "BaseLlmArgs", "trust_remote_code": "BaseLlmArgs",
        "dtype": "BaseLlmArgs", "tensor_parallel_size": "BaseLlmArgs", "pipeline_parallel_size": "BaseLlmArgs",
        "max_batch_size": "BaseLlmArgs", "max_input_len": "BaseLlmArgs", "max_seq_len": "BaseLlmArgs",
        "max_num_tokens": "BaseLlmArgs", "kv_cache_config": "BaseLlmArgs", "speculative_config": "BaseLlmArgs",
        "disable_overlap_scheduler": "TorchLlmArgs", "tokenizer": "BaseLlmArgs",
    },
    "KvCacheConfig": {"free_gpu_memory_fraction": "KvCacheConfig", "max_tokens": "KvCacheConfig",
                      "enable_block_reuse": "KvCacheConfig"},
    "DraftTargetConfig": {"decoding_type": "DraftTargetDecodingConfig", "max_draft_len": "DecodingBaseConfig",
                          "speculative_model": "DecodingBaseConfig", "max_concurrency": "DecodingBaseConfig",
                          "draft_len_schedule": "DecodingBaseConfig"},
    "TritonConfig": {"max_batch_size": "all_models/llmapi/tensorrt_llm/1/model.py",
                     "decoupled": "all_models/llmapi/tensorrt_llm/1/model.py"},
}


class _Typed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KvCacheConfig(_Typed):
    """One KV-cache configuration for both models: TensorRT-LLM sizes the draft's cache with the target's
    (``KvCacheCreator._get_kv_size_per_token`` in ``tensorrt_llm/_torch/pyexecutor/_util.py`` adds the draft's
    bytes per token), so the fraction is the two models' share and ``max_tokens`` each one's token count."""

    free_gpu_memory_fraction: float = Field(gt=0, lt=1)
    max_tokens: int = Field(ge=1)
    enable_block_reuse: bool = True


class DraftTargetConfig(_Typed):
    """Draft/Target speculation; its spelling and value rules are the line's (:mod:`.lines`)."""

    decoding_type: str
    max_draft_len: int = Field(ge=1)  # fixed at load: requests cannot choose another
    speculative_model: str  # the draft checkpoint as the container sees it
    # the load policy: speculation off above this batch size (TensorRT-LLM counts its batch, not requests in flight)
    max_concurrency: int | None = Field(None, ge=0)
    # or K per batch size (the load policy as a schedule; keys read as the line's LineRules.schedule_keys says)
    draft_len_schedule: dict[int, int] | None = None


class LLMArgs(_Typed):
    """The ``LLM()`` arguments of a release (``model`` absent for ``trtllm-serve``, which takes it as an argument)."""

    model: str | None = None
    # A tokenizer folder other than the model's: the adapter's portable copy where the target's tokenizer_config names
    # a class the image's transformers 4.57 does not know (TokenizersBackend), which LLM() would fail to load.
    # BaseLlmArgs.tokenizer on both lines; LLM.__init__'s committed argument ``tokenizer: Union[str, Path,
    # PreTrainedTokenizerBase, TokenizerBase, None]`` (tests/unittest/api_stability/references_committed/llm.yaml).
    tokenizer: str | None = None
    backend: Literal["pytorch"] = "pytorch"
    trust_remote_code: bool = False
    dtype: Literal["float16", "bfloat16"]
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(ge=1)
    max_batch_size: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_seq_len: int = Field(ge=2)
    max_num_tokens: int = Field(ge=1)
    kv_cache_config: KvCacheConfig
    # Two-model speculation runs with the overlap scheduler off, as every upstream Draft/Target example does
    # (TensorRT-LLM docs/source/features/speculative-decoding.md).
    disable_overlap_scheduler: bool = True
    speculative_config: DraftTargetConfig | None = None  # None: the target alone (specbuild's K=0)


class TritonConfig(_Typed):
    """Both keys required: upstream ``model.py`` indexes ``triton_config["decoupled"]`` and ``["max_batch_size"]``."""

    max_batch_size: Literal[0]  # one prompt per request (upstream "JIRA-4496")
    decoupled: bool


class ModelYaml(LLMArgs):
    """``tensorrt_llm/1/model.yaml``: the LLM arguments plus the Triton model's own ``triton_config``."""

    model: str  # type: ignore[assignment]  # required here
    triton_config: TritonConfig


class ServeConfig(LLMArgs):
    """``trtllm-serve <model> --config trtllm-serve.yaml``: the same arguments, the model given on the command line."""

    model: None = None


def to_yaml(config: LLMArgs, header: str = "") -> str:
    """``config`` as YAML (unset optional keys left out), after ``header`` comment lines."""
    body = yaml.safe_dump(config.model_dump(exclude_none=True), sort_keys=False)  # python mode: int keys stay ints
    return "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + body


def parse(kind: type[LLMArgs], text: str, source: str, line: LineRules) -> LLMArgs:
    """Read a ``model.yaml`` or ``trtllm-serve`` YAML back into its typed model, as TensorRT-LLM ``line`` would:
    what its rules refuse, and keys specbuild does not know, are errors."""
    fix = "package the release again (specbuild package) rather than editing it"
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecbuildError(f"{source} is not YAML: {exc}", fix) from None
    speculative = data.get("speculative_config") if isinstance(data, dict) else None
    if isinstance(speculative, dict) and (refused := line.refusals(speculative)):
        raise SpecbuildError(f"{source}: TensorRT-LLM {line.tensorrt_llm} refuses its speculative_config:\n  "
                             + "\n  ".join(refused), fix)
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise SpecbuildError(f"{source} is not a valid {kind.__name__}: {exc}", fix) from None
