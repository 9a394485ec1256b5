"""The ``tensorrt-llm-llmapi`` runtime: engine-free TensorRT-LLM, through its LLM API.

TensorRT-LLM removed the TensorRT engine flow on main in July 2026 (PRs #15763, #15767, #15907, #15918): the
``tensorrtllm`` Triton backend and ``trtllm-build`` are gone, and what remains on Triton is the LLM-API model
(``triton_backend/all_models/llmapi``), a Python model around ``LLM()`` of the PyTorch backend, configured by
a ``model.yaml``. Draft-target speculation runs inside TensorRT-LLM's scheduler, with in-flight batching
(``speculative_config: {decoding_type, max_draft_len, speculative_model, max_concurrency or draft_len_schedule}``,
spelled as each line's
parser wants it: :mod:`specbuild.runtimes.tensorrt_llm_llmapi.lines`); K=0 renders none, the target alone.

So this runtime converts and builds nothing (its steps are check and package): the release
is a repository whose ``ensemble`` keeps specbuild's public interface, in front of an adapter model that maps it
onto the LLM-API model (:mod:`specbuild.runtimes.tensorrt_llm_llmapi.repository`), and the container mounts the two
checkpoints at ``triton.checkpoint_mount``. Its name says what it serves through (TensorRT-LLM's LLM API, the
``llmapi`` Triton model) rather than a backend flag (``backend: pytorch`` is deprecated on main), beside
``tensorrt-llm``, the engine runtime of the same images.

What the LLM API fixes at load and cannot change per request (the draft length, draft-logits acceptance,
adaptive K, prompt lookup, the draft's layout and dtype) is refused in the spec by :meth:`spec_findings` and in
requests by the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.package.build_record import BuildRecord, Engine
from specbuild.runtimes.interface import ModelPlan, PackageContext, ReleaseContents, SpecFinding
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, LaunchPlan
from specbuild.runtimes.names import TENSORRT_LLM_LLMAPI
from specbuild.runtimes.tensorrt_llm_llmapi.contract import ADAPTER_MODEL
from specbuild.runtimes.tensorrt_llm_llmapi.launch import check_compiled_config, container_checkpoint, launch_plan
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES, load_keys
from specbuild.runtimes.tensorrt_llm_llmapi.settings import TENSORRT_LLM_LLMAPI_SETTINGS
from specbuild.runtimes.trtllm_image import ImageRuntime, installed_package_dir, resolve_dtype
from specbuild.speculation.request_settings import TEXT_ONLY
from specbuild.spec import BuildSpec, Role

if TYPE_CHECKING:
    from specbuild.checkpoint.info import CheckpointInfo
    from specbuild.package.manifest import Release

# Causal LMs the PyTorch backend runs natively in TensorRT-LLM 1.2.x and on main: listed in
# docs/source/models/supported-models.md (newest main) without the AutoDeploy-only footnote, and exported by the
# late-2025 tensorrt_llm/_torch/models/__init__.py (the 1.2 line). The draft goes through the same loader.
PYTORCH_ARCHITECTURES = frozenset({
    "DeepseekV3ForCausalLM", "Exaone4ForCausalLM", "Gemma3ForCausalLM", "Glm4MoeForCausalLM", "GptOssForCausalLM",
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "NemotronForCausalLM", "NemotronHForCausalLM",
    "NemotronNASForCausalLM", "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
})


# What a capture record holds, the ids the target generated (specbuild.capture.records), the adapter never sees.
# TensorRT-LLM's LLM API has them (RequestOutput's prompt_token_ids, each CompletionOutput's token_ids), but its
# Triton model answers with the text alone, and with return_perf_metrics one request's acceptance totals, no rounds
# (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, _create_response, on release/1.2.1 as
# contract.LLMAPI_OUTPUTS records it, and at commit 044a90d209e380c95e23e8ae42f3583fa05ada78).
CAPTURE_REFUSAL = f"capture.enabled: {TEXT_ONLY}, and no per-round acceptance (one total per request)"


class TensorRTLLMLLMAPIRuntime(ImageRuntime):
    """TensorRT-LLM's LLM-API Triton model (PyTorch backend) on the NGC image: no engines, a CUDA GPU."""

    name = TENSORRT_LLM_LLMAPI
    steps = ("check", "package")  # nothing to convert or build: TensorRT-LLM loads the checkpoints
    acceptances = ("token-match",)  # the target verifies the draft's tokens inside TensorRT-LLM
    settings = TENSORRT_LLM_LLMAPI_SETTINGS
    serving_model = ADAPTER_MODEL  # the LLM-API model exports no metrics; the adapter in front of it does
    reads = {"check": ("launch", "capture.enabled", "speculation.adaptive", "speculation.num_draft_tokens",
                       "speculation.prompt_lookup.enabled", "speculation.busy_in_flight",
                       "speculation.draft_len_schedule", "speculation.draft_context", "limits.max_batch_size",
                       "triton.tensorrt_llm"),
             "plan": ("target.dtype", "draft.dtype", "speculation.num_draft_tokens"),
             "package": ("name", "target", "draft.dtype", "speculation.num_draft_tokens", "triton.checkpoint_mount",
                         "triton.repository_mount",
                         "triton.kv_cache_free_gpu_mem_fraction", "triton.orchestrator_instances",
                         "triton.tensorrt_llm", "triton.max_request_seconds", "speculation.busy_in_flight",
                         "speculation.draft_len_schedule")}

    def available(self) -> bool:
        package = installed_package_dir()
        return package is not None and (package / "llmapi").is_dir()

    def unsupported(self, architecture: str) -> str | None:
        if architecture in PYTORCH_ARCHITECTURES:
            return None
        return (f"TensorRT-LLM's PyTorch backend has no native model for {architecture} "
                f"(supported: {', '.join(sorted(PYTORCH_ARCHITECTURES))})")

    def engine_dtype(self, requested: str, role: Role, checkpoint_dtype: str | None) -> str:
        return resolve_dtype(requested, role, checkpoint_dtype, runtime=self.name)

    def plan(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, converted: Path,
             engine: Path) -> ModelPlan:
        model = getattr(spec, role)
        data = {"checkpoint": model.checkpoint, "mounted_at": container_checkpoint(spec, role),
                "dtype": self.engine_dtype(model.dtype, role, checkpoint.torch_dtype),
                "tensor_parallel_size": spec.target.tp_size, "pipeline_parallel_size": spec.target.pp_size,
                "convert": None, "build": None}
        k, line = spec.speculation.num_draft_tokens, LINES[spec.triton.tensorrt_llm]
        what = ("LLM(model=...)" if role == "target" else
                f"speculative_config {line.decoding_type}, max_draft_len {k}" if k else
                "not loaded: K=0 renders no speculative_config, the target serves alone")
        text = (f"{role}: {checkpoint.architecture}, {data['dtype']}, tp {data['tensor_parallel_size']} x pp "
                f"{data['pipeline_parallel_size']}: no conversion or engine build; TensorRT-LLM loads "
                f"{model.checkpoint} (mounted at {data['mounted_at']}) when the server starts ({what})")
        return ModelPlan(role, data, text)

    def planned_record(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo) -> BuildRecord:
        """The model's limits, recorded as an engine's (there is none to build)."""
        return BuildRecord(runtime=self.name, role=role,
                           dtype=self.engine_dtype(getattr(spec, role).dtype, role, checkpoint.torch_dtype),
                           vocab_size=checkpoint.vocab_size, architecture=checkpoint.architecture,
                           limits=self.record_limits(spec, role))

    def draft_positions(self, spec: BuildSpec, role: Role) -> int:
        """The draft length fixed at load (``speculative_config.max_draft_len``): requests cannot choose another."""
        return spec.speculation.num_draft_tokens if role == "target" else 0

    def _load_policy_findings(self, spec: BuildSpec) -> list[SpecFinding]:
        """What the line cannot take of the load policy: a cutoff below its least max_concurrency, or a schedule
        whose K at one request in flight is not the draft length fixed at load (its max_draft_len)."""
        k, line, schedule = spec.speculation.num_draft_tokens, LINES[spec.triton.tensorrt_llm], self.load_policy(spec)
        if not k:
            return []
        cutoff = load_keys(schedule, k, spec.limits.max_batch_size, line).get("max_concurrency")
        if cutoff is not None and cutoff < line.min_max_concurrency:
            return [SpecFinding("load-policy", f"speculation.busy_in_flight {cutoff + 1} would render "
                                f"max_concurrency {cutoff}, which TensorRT-LLM {line.tensorrt_llm} refuses "
                                f"(at least {line.min_max_concurrency})", "set speculation.busy_in_flight to "
                                f"{line.min_max_concurrency + 1} or more, 0 (draft at any load), or "
                                "speculation.num_draft_tokens to 0 (the target alone)")]
        alone = schedule.draft_len(k, 1)
        if cutoff is None and alone != k:
            return [SpecFinding("load-policy", f"speculation.draft_len_schedule gives K={alone} at one request in "
                                f"flight, below num_draft_tokens ({k}): TensorRT-LLM {line.tensorrt_llm}'s "
                                "draft_len_schedule must start at max_draft_len, which is num_draft_tokens here",
                                f"set speculation.num_draft_tokens to {alone}, or the schedule's K at 1 to {k}")]
        return []

    def spec_findings(self, spec: BuildSpec) -> list[SpecFinding]:
        s, findings = spec.speculation, []
        k_fix = "or use --runtime torch (or tensorrt-llm), whose orchestrator runs it"
        findings.extend(self._load_policy_findings(spec))
        if s.adaptive:
            findings.append(SpecFinding("adaptive", "speculation.adaptive: the LLM API fixes the draft length at "
                                        "load (no per-request K)", f"set speculation.adaptive: false, {k_fix}"))
        if s.prompt_lookup.enabled:
            findings.append(SpecFinding("prompt-lookup", "speculation.prompt_lookup: the LLM API drafts with one "
                                        "method (Draft/Target here); it does not combine n-gram lookup with a draft "
                                        "model", f"set speculation.prompt_lookup.enabled: false, {k_fix}"))
        if s.draft_context is not None:
            findings.append(SpecFinding("draft-context", "speculation.draft_context: the LLM API's drafter reads each "
                                        "request's whole context", f"leave speculation.draft_context unset, {k_fix}"))
        if s.acceptance not in self.acceptances:
            findings.append(SpecFinding("acceptance", f"speculation.acceptance is {s.acceptance}, but TensorRT-LLM "
                                        "verifies the draft's tokens itself (token matching, exact); requests "
                                        "asking for use_draft_logits are refused", blocking=False))
        target, draft = spec.target, spec.draft
        if (draft.tp_size, draft.pp_size) != (target.tp_size, target.pp_size):
            findings.append(SpecFinding("draft-layout", f"the draft is laid out tp {draft.tp_size} x pp {draft.pp_size}"
                                        f", but the LLM API runs it with the target's tp {target.tp_size} x pp "
                                        f"{target.pp_size}", "set draft.tp_size and draft.pp_size to the target's"))
        if draft.dtype != target.dtype:
            findings.append(SpecFinding("draft-dtype", f"draft.dtype is {draft.dtype} and target.dtype "
                                        f"{target.dtype}, but the LLM API runs both models in one dtype",
                                        "set draft.dtype to target.dtype"))
        if spec.capture.enabled:
            findings.append(SpecFinding("capture", CAPTURE_REFUSAL, "set capture.enabled: false, or use --runtime "
                                        "torch (or tensorrt-llm), whose orchestrator sees every token and round"))
        launch = spec.launch
        if launch.mode == "orchestrator" or launch.fast_logits or launch.placement == "separate":
            findings.append(SpecFinding("launch", "launch.mode orchestrator, fast_logits and placement separate "
                                        "lay out TensorRT-LLM engines; the LLM API places both models itself",
                                        "set launch.mode to auto, single or leader, fast_logits: false and "
                                        "placement: shared"))
        return findings

    def render_repository(self, spec: BuildSpec, engines: Mapping[str, Engine], tokenizer_dir: Path,
                          output_dir: Path, context: PackageContext) -> None:
        from specbuild.runtimes.tensorrt_llm_llmapi.repository import render_repository

        render_repository(spec, engines, tokenizer_dir, output_dir, context, self.load_policy(spec))

    def packaged_engines(self, spec: BuildSpec, checkpoints: Mapping[Role, CheckpointInfo], *,
                         package_only: bool) -> dict[Role, Engine]:
        """The models' limits, recorded as planned engines': there are none to build."""
        return self.planned_engines(spec, checkpoints)

    def release_contents(self, spec: BuildSpec, checkpoints: Mapping[Role, CheckpointInfo]) -> ReleaseContents:
        """The checkpoints TensorRT-LLM loads, with the limits this runtime records for them."""
        return ReleaseContents(engines=None, checkpoints={role: getattr(spec, role).checkpoint for role in checkpoints},
                               build_info={role: self.planned_record(spec, role, checkpoint)
                                           for role, checkpoint in checkpoints.items()})

    def check_compiled_layout(self, repository: Path, spec: BuildSpec) -> None:
        check_compiled_config(repository, spec)

    def launch_plan(self, spec: BuildSpec, repository: Path, engines: Path, checkpoints: Mapping[str, Path], *,
                    gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
        return launch_plan(spec, repository, checkpoints, gpus=gpus, shm_gib=shm_gib)

    def rehearsal_repository(self, release: Release, destination: Path) -> Path:
        """The release with a torch stand-in in place of TensorRT-LLM's LLM-API model
        (:mod:`specbuild.runtimes.tensorrt_llm_llmapi.rehearsal`)."""
        from specbuild.runtimes.tensorrt_llm_llmapi.rehearsal import rehearsal_repository

        return rehearsal_repository(release, destination)
