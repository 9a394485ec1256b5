"""The typed build spec: ``specbuild.yaml`` plus command-line overrides.

Every field has a default that works for the demo pair; unknown keys and bad values are rejected with the
field's dotted path and the allowed values (see :func:`load_spec`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from specbuild.errors import SpecError
from specbuild.runtimes.names import RUNTIME_NAMES
from specbuild.runtimes.settings import PREFERRED, RUNTIME_SECTIONS, RUNTIME_SETTINGS, RUNTIME_TRITON_KEYS
from specbuild.speculation.cost import CostModel
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.modes import VerificationMode
from specbuild.speculation.schedule import DraftLenSchedule
from specbuild.speculation.traffic import GREEDY, checked_mix, describe_profiles
from specbuild.spec_section import ContainerPath, SpecSection
from specbuild.spec_sources import (apply_override, describe_errors, read_spec_file, resolve_relative_paths,
                                    value_origin)

RUNTIME_CHOICES: tuple[str, ...] = (*RUNTIME_NAMES, "auto")
RuntimeChoice = Literal[RUNTIME_CHOICES]  # type: ignore[valid-type]  # the registry's names, and auto
Role = Literal["target", "draft"]
ROLES: tuple[Role, ...] = ("target", "draft")
Dtype = Literal["auto", "float16", "bfloat16", "float32"]
Acceptance = Literal["token-match", "draft-logits"]

DEFAULT_SPEC_FILE = "specbuild.yaml"
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
RUNTIMES_PROSE = "; ".join(f"{name}: {RUNTIME_SETTINGS[name].summary}" for name in RUNTIME_NAMES) \
    + f"; auto: the best runtime installed here ({', then '.join(settings.auto_label for settings in PREFERRED)})"
"""What the ``runtime`` key offers, from each runtime's settings."""
LOAD_DEFAULTS_PROSE = "; ".join(dict.fromkeys(RUNTIME_SETTINGS[name].load_default.prose() for name in RUNTIME_NAMES))
"""The runtimes' defaults of ``speculation.busy_in_flight``, each told once."""


class ModelSpec(SpecSection):
    """One checkpoint (target or draft) and how to shard it."""

    checkpoint: str = Field(description="Hugging Face checkpoint folder: config.json, tokenizer files, *.safetensors")
    dtype: Dtype = Field("auto", description="engine dtype; auto: bfloat16/float16 on a GPU, float32 on a CPU "
                         "(float32: torch runtime only)")
    tp_size: int = Field(1, ge=1, le=64, description="tensor-parallel ranks (GPUs the model is split across)")
    pp_size: int = Field(1, ge=1, le=64, description="pipeline-parallel ranks (GPUs its layers are spread over)")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


class PromptLookupSpec(SpecSection):
    """Prompt lookup drafting: each round, propose what followed the last earlier occurrence of the context's
    final n-gram (no model call); the draft model drafts when lookup finds nothing (``draft_fallback``)."""

    enabled: bool = Field(False, description="requests look up their own tokens first (each may turn it off with "
                          "its prompt_lookup input)")
    max_ngram: int = Field(4, ge=1, le=32, description="longest suffix n-gram looked up (then shorter ones)")
    min_ngram: int = Field(2, ge=1, le=32, description="shortest suffix n-gram looked up")
    draft_fallback: bool = Field(True, description="the draft model drafts when lookup finds nothing; false: the "
                                 "target alone then (for a draft whose cost exceeds what it brings)")

    @model_validator(mode="after")
    def _ngram_order(self) -> PromptLookupSpec:
        PromptLookup(max_ngram=self.max_ngram, min_ngram=self.min_ngram)  # the one check of the range
        return self


class SpeculationSpec(SpecSection):
    """How drafts are made and checked; requests may override K, adaptive K and prompt lookup."""

    max_draft_len: int = Field(8, ge=1, le=64, description="most draft tokens a request may ask for (the target "
                               "engine is built for it)")
    num_draft_tokens: int = Field(4, ge=0, description="default K: draft tokens per round (0 = the target alone); "
                                  "requests may ask for 0..max_draft_len")
    acceptance: Acceptance = Field(
        "draft-logits",
        description="draft-logits: rejection sampling on p/q (exact, higher acceptance); "
        "token-match: target samples and accepts equal tokens (exact, no draft logits)",
    )
    verification: VerificationMode = Field(
        "token", description="how draft-logits acceptance judges a sampled round's drafts: token (rejection "
        "sampling, token by token) or block (Sun et al. 2024: the drafted block as a whole; the same output "
        "distribution, at least as many tokens accepted); torch runtime only (TensorRT-LLM's engine verifies draft "
        "logits itself, token by token); greedy requests and token matching are unaffected")
    adaptive: bool = Field(False, description="adapt K per request: longer after full acceptance, shorter after "
                           "rejections")
    busy_in_flight: int | None = Field(
        None, ge=0, description="load policy: from this many requests in flight at an orchestrator instance (its "
        "specbuild_requests_in_flight gauge), rounds run without drafts, as K=0 (speculation spends compute a busy "
        "server lacks; seeded sampled requests keep their K, so their text does not depend on the load); 0: draft "
        f"at any load; unset: the runtime's default ({LOAD_DEFAULTS_PROSE}); the simplest draft_len_schedule, {{N: 0}} "
        "(set one of the two)")
    draft_len_schedule: dict[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=0)]] | None = Field(
        None, description="K per load: {in_flight: K}, from that many requests in flight at an orchestrator instance "
        "rounds draft at most K tokens (until the next key; a request's own K caps it; seeded sampled requests keep "
        "theirs); K must not rise with load; written by `specbuild tune --concurrency-schedule`; unset: "
        "busy_in_flight")
    prompt_lookup: PromptLookupSpec = Field(PromptLookupSpec(), description="prompt lookup drafting: propose what "
                                            "followed the context's last n-gram earlier in the request (no model call)")
    draft_context: int | None = Field(
        None, ge=2, description="the most recent tokens of a request's context the draft model reads: between half "
        "of this and this many, the window moving on by half of it at a time (each move re-reads half a window, in "
        "the draft model's time the break-even prices), at positions from 0; the target always reads the whole "
        "context; past the draft's own window the draft keeps drafting; unset: the whole context, up to the draft's "
        "window (as TensorRT-LLM's drafter); torch and tensorrt-llm runtimes (their orchestrator calls the draft)")
    verify_cost: dict[Annotated[int, Field(ge=1, le=64)], Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        {}, description="measured: what the target's verification of K drafted tokens costs, in target steps, per K "
        "(written by specbuild init and tune on the machine they ran on; check's break-even uses it; empty: one "
        "target step, as on a GPU)")
    draft_cost: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="measured: what one draft step costs, in target steps (c; written "
        "by specbuild init and tune on the machine they ran on); null: the models' parameter ratio, not measured")
    measured_acceptance: float | None = Field(
        None, ge=0, le=1, description="measured: the draft's per-token acceptance on the build host (written by "
        "specbuild init and tune): the prior of each request's break-even; null: not measured")
    traffic: dict[str, float] = Field(
        {GREEDY: 1.0}, description="the sampling mix the release expects, {profile: share} (shares summing to 1) over "
        + describe_profiles() + ": `specbuild tune` measures each "
        "profile's cells and chooses K, adaptive K and the break-even's prior (measured_acceptance) for this mix; "
        "`tune --traffic` writes it")
    break_even: bool = Field(True, description="per-request break-even: a request whose own acceptance says drafting "
                             "does not pay (the release's cost model: draft_cost, verify_cost) drafts nothing for a "
                             "growing stretch, then probes again; exact either way (each request may turn it off "
                             "with its break_even input)")

    def cost_model(self, parameter_ratio: float | None) -> CostModel:
        """The release's cost model: what was measured, else c from ``parameter_ratio`` (check's per-token
        multiply-adds ratio; unknown: 0) and V(K) = 1."""
        return CostModel(draft_cost=self.draft_cost if self.draft_cost is not None else parameter_ratio or 0.0,
                         verify_cost=dict(self.verify_cost), acceptance=self.measured_acceptance,
                         measured=self.draft_cost is not None)

    def load_schedule(self, default_busy_in_flight: int) -> DraftLenSchedule:
        """The load policy: draft_len_schedule, else busy_in_flight (unset: ``default_busy_in_flight``, the
        runtime's) as its simplest schedule."""
        if self.draft_len_schedule is not None:
            return DraftLenSchedule.from_mapping(self.draft_len_schedule)
        busy = self.busy_in_flight
        return DraftLenSchedule.from_threshold(default_busy_in_flight if busy is None else busy)

    @field_validator("traffic")
    @classmethod
    def _known_mix(cls, mix: dict[str, float]) -> dict[str, float]:
        return checked_mix(mix)

    @model_validator(mode="after")
    def _block_needs_draft_logits(self) -> SpeculationSpec:
        if self.verification == "block" and self.acceptance != "draft-logits":
            raise ValueError(f"verification: block judges drafts on the draft's logits, but acceptance is "
                             f"{self.acceptance!r}, which never sends them; set acceptance: draft-logits or "
                             "verification: token")
        return self

    @model_validator(mode="after")
    def _k_within_engine(self) -> SpeculationSpec:
        if self.num_draft_tokens > self.max_draft_len:
            raise ValueError(
                f"num_draft_tokens ({self.num_draft_tokens}) is larger than max_draft_len ({self.max_draft_len}); "
                "raise max_draft_len or lower num_draft_tokens"
            )
        return self

    @model_validator(mode="after")
    def _one_load_policy(self) -> SpeculationSpec:
        schedule = self.draft_len_schedule
        if schedule is None:
            return self
        if self.busy_in_flight is not None:
            raise ValueError("busy_in_flight and draft_len_schedule are both set; busy_in_flight N is the schedule "
                             "{N: 0}: keep one of them")
        too_long = {count: k for count, k in schedule.items() if k > self.max_draft_len}
        if too_long:
            raise ValueError(f"draft_len_schedule {too_long} asks for more than max_draft_len ({self.max_draft_len}) "
                             "draft tokens; lower those K or raise max_draft_len")
        try:
            DraftLenSchedule.from_mapping(schedule)
        except ValueError as exc:
            raise ValueError(f"draft_len_schedule: {exc}; make K fall (or stay) as the in-flight count rises") from None
        return self


DEFAULT_MAX_SEQ_LEN = 2048  # the most a default max_seq_len takes from a checkpoint's max_position_embeddings


class LimitsSpec(SpecSection):
    """What engines are built for. Limits left null are taken from the checkpoints when they are read
    (:meth:`resolve`), as trtllm-build does; only values the user set can be refused as too large. The release serves
    the target's window; the draft engine is built for its own (:meth:`of`), and a request past it drafts by prompt
    lookup only, or runs on the target alone."""

    max_batch_size: int = Field(8, ge=1, le=1024, description="most requests an engine runs at once")
    max_input_len: int | None = Field(None, ge=1, description="most prompt tokens; null = half of max_seq_len")
    max_seq_len: int | None = Field(
        None, ge=2, description="most prompt + generated tokens; null = the target's max_position_embeddings, "
        f"at most {DEFAULT_MAX_SEQ_LEN} (set it to build for longer sequences)")
    draft_max_seq_len: int | None = Field(
        None, ge=2, description="most context + drafted tokens the draft engine holds; null = the draft's "
        "max_position_embeddings, at most max_seq_len. A request past it drafts by prompt lookup only, or runs on "
        "the target alone (specbuild_draft_window_requests_total counts it)")

    @model_validator(mode="after")
    def _seq_holds_input(self) -> LimitsSpec:
        if self.max_seq_len is not None and self.max_input_len is not None \
                and self.max_seq_len <= self.max_input_len:
            raise ValueError(
                f"max_seq_len ({self.max_seq_len}) must be larger than max_input_len ({self.max_input_len}) "
                "so that at least one token can be generated"
            )
        if self.max_seq_len is not None and self.draft_max_seq_len is not None \
                and self.draft_max_seq_len > self.max_seq_len:
            raise ValueError(f"draft_max_seq_len ({self.draft_max_seq_len}) must not be larger than max_seq_len "
                             f"({self.max_seq_len}): the draft never sees more than a request holds")
        return self

    def resolve(self, max_positions: int | None, draft_positions: int | None = None) -> LimitsSpec:
        """These limits with the null ones filled in for a target that holds ``max_positions`` tokens and a draft
        that holds ``draft_positions`` (None: unknown): max_seq_len = min(max_positions, DEFAULT_MAX_SEQ_LEN) but
        above a max_input_len the user set; max_input_len = half of max_seq_len; draft_max_seq_len =
        min(draft_positions, max_seq_len)."""
        seq_len = self.max_seq_len
        if seq_len is None:
            seq_len = max(2, min(max_positions or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN))
            if self.max_input_len is not None:
                seq_len = max(seq_len, self.max_input_len + 1)
        input_len = self.max_input_len if self.max_input_len is not None else seq_len // 2
        draft_len = self.draft_max_seq_len
        if draft_len is None:
            draft_len = max(2, min(draft_positions or seq_len, seq_len))
        return LimitsSpec(max_batch_size=self.max_batch_size, max_input_len=input_len, max_seq_len=seq_len,
                          draft_max_seq_len=min(draft_len, seq_len))

    def of(self, role: Role) -> LimitsSpec:
        """The limits of ``role``'s engine (resolved limits in, :meth:`resolve`): the target's are the release's;
        the draft's sequence is its own window and its input one token shorter, at most the release's input."""
        if role == "target" or self.draft_max_seq_len is None or self.max_seq_len is None \
                or self.max_input_len is None:
            return self
        window = self.draft_max_seq_len
        return LimitsSpec(max_batch_size=self.max_batch_size, max_input_len=min(self.max_input_len, window - 1),
                          max_seq_len=window, draft_max_seq_len=window)


class _SharedTritonSpec(SpecSection):  # the keys every runtime reads: TritonSpec adds each runtime's own
    """The Triton server and its model repository."""

    host: str = Field("127.0.0.1", description="address the server binds to (loopback unless you mean to expose it)")
    http_port: int = Field(8000, ge=0, le=65535, description="HTTP port (0 = pick a free port)")
    grpc_port: int = Field(8001, ge=0, le=65535, description="gRPC port (0 = pick a free port)")
    metrics_port: int = Field(8002, ge=0, le=65535, description="Prometheus metrics port (0 = pick a free port)")
    openai_port: int = Field(9000, ge=0, le=65535, description="specbuild's OpenAI-compatible API next to Triton "
                             "(0 = pick a free port)")
    max_request_seconds: float = Field(600.0, ge=0, allow_inf_nan=False,
                                       description="a request stops after the round that passes this many seconds, "
                                       "abandoned ones too (0 = no limit); requests may ask for less (max_time)")
    image: str = Field(DEFAULT_TRITON_IMAGE, description="NGC image for the tensorrt-llm runtimes (TensorRT-LLM 1.2.x)")
    tensorrt_llm: Literal["1.2", "main"] = Field(
        "1.2", description="the TensorRT-LLM in the image: 1.2 (NGC 26.04-26.07) or main (engine-free, built from "
        "source after July 2026: tensorrt-llm-llmapi only)")
    repository_mount: ContainerPath = Field("/triton_repo", description="where the repository is mounted inside the "
                                            "container")
    gpu_memory_gib: float | None = Field(None, gt=0, description="GPU memory to check the memory plan against "
                                         "(e.g. 80); null = not checked")
    kv_cache_free_gpu_mem_fraction: float | None = Field(
        None, gt=0, lt=1, description="target+draft share of free GPU memory for KV cache; null = split from the "
        "memory plan"
    )
    orchestrator_instances: int = Field(1, ge=1, le=64, description="instances of the orchestrator (the speculative "
                                        "loop)")


def _with_runtime_keys(shared: type[SpecSection]) -> type[SpecSection]:
    """``shared`` (the keys every runtime reads) with each runtime's own (RUNTIME_TRITON_KEYS), each before the key
    it names."""
    unknown = {key.before for key in RUNTIME_TRITON_KEYS.values()} - {None, *shared.model_fields}
    if unknown:
        raise RuntimeError(f"a runtime's triton key is placed before {sorted(unknown)}, which the triton section lacks")

    def runtime_keys(before: str | None) -> dict[str, Any]:
        return {key: (runtime_key.annotation, runtime_key.field)
                for key, runtime_key in RUNTIME_TRITON_KEYS.items() if runtime_key.before == before}

    fields: dict[str, Any] = {}
    for name, info in shared.model_fields.items():
        fields |= runtime_keys(name)
        fields[name] = (info.annotation, info)
    fields |= runtime_keys(None)
    return create_model("TritonSpec", __base__=SpecSection, __doc__=shared.__doc__, __module__=__name__, **fields)


TritonSpec = _with_runtime_keys(_SharedTritonSpec)


TRITON_DEFAULTS = TritonSpec()
"""The server settings a release gets unless told otherwise: the one place its default address and ports are."""
LOCAL_GRPC_URL = f"{TRITON_DEFAULTS.host}:{TRITON_DEFAULTS.grpc_port}"
"""Where a Triton server with the default settings answers gRPC on this machine."""


class OutputsSpec(SpecSection):
    """Where compile writes; each folder is replaced whole (relative paths: from the spec file's folder)."""

    build_dir: str = Field("build", description="the check report and converted checkpoints")
    engines_dir: str = Field("engines", description="built engines, one folder per model")
    repository_dir: str = Field("triton_repo", description="the Triton model repository and its manifest.json")


class SecuritySpec(SpecSection):
    """What specbuild refuses unless told otherwise."""

    allow_pickle: bool = Field(False, description="load pickle (.bin/.pt) weights; only for checkpoints you trust")
    trust_remote_code: bool = Field(False, description="run code shipped with a checkpoint; only if you trust it")


CLAIM_SIZE = r"^[1-9][0-9]*(Ki|Mi|Gi|Ti|Pi)$"  # a Kubernetes quantity in binary units


class CaptureSpec(SpecSection):
    """Opt-in capture of served traffic (issue 41): each finished request row appended to a local store that
    ``specbuild draft --from-capture`` trains on. Off unless enabled; each request may opt out (its store input)."""

    enabled: bool = Field(False, description="append each finished request's prompt and generated token ids, sampling "
                          "settings and per-round acceptance to the capture store (SPECBUILD_CAPTURE_DIR; `specbuild "
                          "serve --capture-dir`); token ids are the text (the tokenizer decodes them): the store is as "
                          "private as the traffic; requests opt out with store: false")
    max_file_mib: float = Field(64.0, gt=0, le=1024 * 1024, allow_inf_nan=False,
                                description="a capture file is closed and a new one begun past this size (MiB)")
    max_file_hours: float = Field(24.0, gt=0, allow_inf_nan=False,
                                  description="a capture file is closed and a new one begun after this many hours")
    retention_days: float = Field(30.0, gt=0, allow_inf_nan=False,
                                  description="capture files older than this are deleted by the server that wrote "
                                  "them (`specbuild capture purge` deletes them sooner)")
    claim_size: str = Field("10Gi", description="the writable claim each pod of a capturing release gets in "
                            "Kubernetes (`specbuild deploy`; read by no compile step), a quantity such as 10Gi")

    @field_validator("claim_size")
    @classmethod
    def _kubernetes_quantity(cls, size: str) -> str:
        if not re.fullmatch(CLAIM_SIZE, size):
            raise ValueError(f"{size!r} is not a Kubernetes quantity in binary units; write a whole number and Ki, "
                             "Mi, Gi, Ti or Pi, such as 10Gi")
        return size


class _ReleaseSpec(SpecSection):
    """The build spec's sections that every runtime reads, before the runtimes' own."""

    name: str = Field("specbuild", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                      description="release name (letters, digits, _ . -)")
    runtime: RuntimeChoice = Field("auto", description=RUNTIMES_PROSE)
    target: ModelSpec = Field(description="the model whose output is served")
    draft: ModelSpec = Field(description="the small model that proposes tokens; it must share the target's tokenizer")
    speculation: SpeculationSpec = Field(SpeculationSpec(), description="speculative decoding")
    limits: LimitsSpec = Field(LimitsSpec(), description="what engines are built for")
    triton: TritonSpec = Field(TritonSpec(), description="the Triton server")
    capture: CaptureSpec = Field(CaptureSpec(), description="opt-in capture of served traffic (token ids are the text)")


_RuntimeSections = create_model(  # each runtime's own sections (specbuild.runtimes.settings)
    "_RuntimeSections", __base__=SpecSection,
    **{key: (section.model, Field(section.model(), description=section.description))
       for key, section in RUNTIME_SECTIONS.items()})


class _CompileSpec(SpecSection):
    """The build spec's sections after the runtimes' own: where compile writes, and what it refuses to load."""

    outputs: OutputsSpec = Field(OutputsSpec(), description="where compile writes (folders replaced whole)")
    security: SecuritySpec = Field(SecuritySpec(), description="what is refused unless you trust the checkpoints")


class BuildSpec(_CompileSpec, _RuntimeSections, _ReleaseSpec):  # type: ignore[misc,valid-type]
    """Everything ``specbuild compile`` needs; see ``specbuild init`` for a commented example."""

    # Its keys are its bases' in reverse: the release's sections, the runtimes' (pydantic collects fields along the
    # reversed MRO), then where compile writes.

    @model_validator(mode="after")
    def _runtime_sections_agree(self) -> BuildSpec:
        for key in RUNTIME_SECTIONS:
            getattr(self, key).check_spec(self)
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def load_spec(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    base_dir: str | Path | None = None,
    override_sources: Mapping[str, str] | None = None,
) -> BuildSpec:
    """Read a spec file (optional), apply dotted-key ``overrides`` (a None value sets the key to null) and validate.

    Relative checkpoint and output paths in a file are resolved against the file's folder, so a spec means
    the same wherever it is run from; override values are taken relative to ``base_dir`` (the cwd). A bad
    value is reported with where it came from: the file, or the override's entry in ``override_sources``
    (how the user gave it, e.g. ``--set limits.max_seq_len=9``; default ``override <key>``).
    """
    data: dict[str, Any] = read_spec_file(path) if path else {}
    file_data = copy.deepcopy(data)
    file_dir = Path(path).resolve().parent if path else None
    if file_dir is not None:
        resolve_relative_paths(data, file_dir)
    given = dict(overrides or {})  # None included: an explicit null (``--set limits.max_seq_len=null``)
    for dotted, value in given.items():
        apply_override(data, dotted, value)
    cwd = Path(base_dir).resolve() if base_dir else Path.cwd()
    resolve_relative_paths(data, cwd)
    try:
        return BuildSpec.model_validate(data)
    except ValidationError as exc:
        sources = {dotted: (override_sources or {}).get(dotted, f"override {dotted}") for dotted in given}
        file_name = str(path) if path else None
        message = describe_errors(exc, lambda loc: value_origin(loc, file_name, file_data, sources))
        raise SpecError(message, "correct the values named above where they were given") from None
