"""Can this draft speculate for this target? :func:`check_pair` answers with reasons and fixes.

A *reason* makes the pair incompatible (the build would fail or the output would be wrong); a *warning*
is something the user should know (a slow pairing, a padded vocabulary) that does not stop the build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from specbuild.checkpoint.info import CheckpointInfo
from specbuild.errors import SpecbuildError
from specbuild.runtimes.names import TORCH
from specbuild.runtimes.registry import RUNTIMES, runtime_for, runtime_of
from specbuild.spec import Acceptance, BuildSpec, LimitsSpec, SpeculationSpec

# A draft token's cost as a share of a target step (per-token multiply-adds, CheckpointInfo.macs_per_token).
# Speculation with verification at one target step pays when the share of accepted draft tokens exceeds it, so
# above half a step little can be gained; far below 1/200 a draft is usually too weak to agree with its target.
COST_RATIO_RANGE = (0.005, 0.5)


class Finding(BaseModel):
    """One reason (with its fix) or warning; ``code`` is stable for scripts, ``message`` is for people."""

    code: str
    message: str
    fix: str | None = None


class PairParams(BaseModel):
    """The parts of a build spec the pair check needs (so the check runs without a full spec)."""

    acceptance: Acceptance = "draft-logits"
    max_seq_len: int | None = None  # as the user set them (None: from the checkpoints, which always fits)
    max_input_len: int | None = None
    draft_max_seq_len: int | None = None
    runtime: str = TORCH
    target_dtype: str = "auto"
    draft_dtype: str = "auto"
    target_tp: int = 1
    draft_tp: int = 1

    @classmethod
    def from_spec(cls, spec: BuildSpec) -> PairParams:
        """The spec's settings as the release will run them (an acceptance rule the runtime does not have falls
        back to its own: :meth:`Runtime.spec_findings` says so)."""
        runtime = runtime_of(spec)
        acceptance = spec.speculation.acceptance
        return cls(acceptance=acceptance if acceptance in runtime.acceptances else runtime.acceptances[0],
                   max_seq_len=spec.limits.max_seq_len, max_input_len=spec.limits.max_input_len,
                   draft_max_seq_len=spec.limits.draft_max_seq_len, runtime=runtime.name, target_dtype=spec.target.dtype, draft_dtype=spec.draft.dtype,
                   target_tp=spec.target.tp_size, draft_tp=spec.draft.tp_size)


class CompatibilityReport(BaseModel):
    reasons: list[Finding] = Field(default_factory=list)
    warnings: list[Finding] = Field(default_factory=list)
    size_ratio: float | None = None  # target parameters / draft parameters
    cost_ratio: float | None = None  # a draft token's multiply-adds / a target token's

    @property
    def compatible(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {"compatible": self.compatible, **self.model_dump(mode="json")}


def check_pair(target: CheckpointInfo, draft: CheckpointInfo,
               spec_or_params: BuildSpec | PairParams | None = None) -> CompatibilityReport:
    """Every reason the pair cannot be built or served, with its fix, and what the user should know (given a
    spec, also the settings its runtime cannot honour)."""
    params = spec_or_params if isinstance(spec_or_params, PairParams) else (
        PairParams.from_spec(spec_or_params) if spec_or_params is not None else PairParams())
    served = draft if runtime_for(params.runtime).sub_vocabulary_heads else draft.model_copy(
        update={"head_vocabulary": None})  # a runtime that cannot cut the head serves the full one
    report = CompatibilityReport(
        size_ratio=target.num_parameters / draft.num_parameters if draft.num_parameters else None,
        cost_ratio=served.macs_per_token / target.macs_per_token,
    )
    for check in (_tokenizers, _special_ids, _vocab_widths, _head_vocabularies, _architectures, _dtypes, _sizes,
                  _positions, _rope, _legacy_rope):
        check(target, draft, params, report)
    if isinstance(spec_or_params, BuildSpec):
        runtime, verification = runtime_for(params.runtime), spec_or_params.speculation.verification
        if verification not in runtime.verifications:
            report.reasons.append(Finding(
                code="verification", message=f"speculation.verification is {verification}, but the {runtime.name} "
                "runtime's target verifies draft logits itself, token by token (TensorRT-LLM has no block "
                "verification)",
                fix="set speculation.verification: token, or use --runtime torch"))
        for finding in runtime.spec_findings(spec_or_params):
            (report.reasons if finding.blocking else report.warnings).append(
                Finding(code=finding.code, message=finding.message, fix=finding.fix))
    return report


def _tokenizers(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
                report: CompatibilityReport) -> None:
    t, d = target.tokenizer, draft.tokenizer
    if t.hash == d.hash:
        return
    if t.vocab_size != d.vocab_size:
        message = f"target vocab size {t.vocab_size} does not match draft vocab size {d.vocab_size}"
    else:
        message = (f"target and draft tokenizers differ (same vocab size {t.vocab_size}, but different tokens, merges "
                   f"or special tokens: hash {t.hash[:12]} vs {d.hash[:12]})")
    report.reasons.append(Finding(
        code="tokenizer", message=message + ": draft token ids would mean different text to the target",
        fix="use a draft that shares the target's tokenizer (e.g. a smaller model of the same family, or one "
            "trained with the target's tokenizer.json)"))


def _special_ids(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
                 report: CompatibilityReport) -> None:
    for role in ("bos", "eos", "pad"):
        t_id = getattr(target.tokenizer, f"{role}_token_id")
        d_id = getattr(draft.tokenizer, f"{role}_token_id")
        if t_id == d_id:
            continue
        message = f"target {role} token id {t_id} does not match draft {role} token id {d_id}"
        if role == "pad":  # padding is never generated or verified; the repository uses the target's
            report.warnings.append(Finding(code="pad-id", message=message + " (harmless: the target's pad id is used)"))
        else:
            report.reasons.append(Finding(
                code=f"{role}-id", message=message,
                fix=f"set the draft's {role}_token in tokenizer_config.json and {role}_token_id in config.json to "
                    "the target's"))


def _vocab_widths(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
                  report: CompatibilityReport) -> None:
    for role, info in (("target", target), ("draft", draft)):
        rows = info.embedding_rows
        if rows is not None and info.tokenizer.max_token_id >= rows:
            report.reasons.append(Finding(
                code=f"{role}-embedding",
                message=f"{role} tokenizer has ids up to {info.tokenizer.max_token_id} but its embedding only "
                        f"{rows} rows",
                fix=f"resize the {role}'s embeddings (model.resize_token_embeddings) or use its original tokenizer"))
        if rows is not None and rows != info.vocab_size:
            report.warnings.append(Finding(
                code=f"{role}-vocab-size",
                message=f"{role} config.json vocab_size {info.vocab_size} differs from its embedding rows {rows}"))
    runtime = runtime_for(params.runtime)  # the widths its models return: padded to a multiple of tp by some
    served = {role: runtime.served_logits_width(info.logits_width, tp)
              for role, info, tp in (("target", target, params.target_tp), ("draft", draft, params.draft_tp))}
    if served["target"] == served["draft"]:
        return
    widths = (f"target logits width {served['target']} does not match draft logits width {served['draft']}"
              + ("" if served == {"target": target.logits_width, "draft": draft.logits_width} else
                 f" as the {params.runtime} runtime serves them (output heads {target.logits_width} and "
                 f"{draft.logits_width} wide, padded to a multiple of tp {params.target_tp} and {params.draft_tp})"))
    if params.acceptance == "draft-logits":
        report.reasons.append(Finding(
            code="logits-width",
            message=f"{widths}: draft-logits acceptance compares target and draft probabilities token by token "
                    "and needs equal widths",
            fix="use acceptance token-match (--acceptance token-match), or a draft with the target's padded "
                "vocab size" + ("" if params.target_tp == params.draft_tp else ", or the target's tp_size")))
    else:
        report.warnings.append(Finding(
            code="logits-width",
            message=f"{widths}: embeddings padded differently (tokenizer size {target.tokenizer.vocab_size}); "
                    "fine for token-match, which compares token ids only, since both tokenizers agree; "
                    "draft-logits acceptance would need equal widths"))


def _head_vocabularies(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
                       report: CompatibilityReport) -> None:
    """A sub-vocabulary head (``head_vocabulary.json``) belongs to a draft. A runtime that cannot cut a head serves
    the draft's full one (exact: the list only makes the draft step cheaper), so the demo pair, which ships one,
    compiles for every runtime."""
    from specbuild.checkpoint.head_vocabulary import HEAD_VOCABULARY

    if target.head_vocabulary is not None:
        report.reasons.append(Finding(
            code="target-head-vocabulary",
            message=f"the target checkpoint has a {HEAD_VOCABULARY}: a target's head must cover its whole vocabulary "
                    "(a sub-vocabulary would change what it generates)",
            fix=f"remove {target.path}/{HEAD_VOCABULARY}; a head vocabulary belongs beside a draft"))
    vocabulary = draft.head_vocabulary
    if vocabulary is None:
        return
    runtime = runtime_for(params.runtime)
    if not runtime.sub_vocabulary_heads:
        supporting = [name for name, other in RUNTIMES.items() if other.sub_vocabulary_heads]
        report.warnings.append(Finding(
            code="draft-head-vocabulary-unused",
            message=f"the {runtime.name} runtime builds the draft's full head: its {HEAD_VOCABULARY} ({vocabulary.size} "
                    f"of {draft.logits_width} ids) is left unused. Exact either way; only the cheaper draft step is "
                    "lost",
            fix=f"--runtime {supporting[0]} serves the cut head"))
        return
    end_id = target.tokenizer.eos_token_id
    if end_id is not None and end_id not in vocabulary.ids:
        report.warnings.append(Finding(
            code="head-vocabulary-end",
            message=f"the draft's head vocabulary lacks the end token ({end_id}): the draft can never propose the end "
                    "of an answer, so the target's last round of each request finds nothing to accept"))


def _architectures(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
                   report: CompatibilityReport) -> None:
    """A reason where the spec's runtime cannot run a model; a warning where another runtime could not (the
    release could not move to it)."""
    chosen = runtime_for(params.runtime)
    for role, info in (("target", target), ("draft", draft)):
        problem = chosen.unsupported(info.architecture)
        if problem is not None:
            others = [name for name, runtime in RUNTIMES.items() if runtime.unsupported(info.architecture) is None]
            report.reasons.append(Finding(
                code=f"{role}-architecture", message=f"{role}: {problem}",
                fix=f"use a {role} of a supported architecture"
                    + (f", or --runtime {others[0]}" if others else "")))
            continue
        for name, runtime in RUNTIMES.items():
            elsewhere = runtime.unsupported(info.architecture) if name != params.runtime else None
            if elsewhere is not None:
                report.warnings.append(Finding(code=f"{role}-architecture-{name}",
                                               message=f"{role}: the {name} runtime could not serve it: {elsewhere}"))


def _dtypes(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
            report: CompatibilityReport) -> None:
    runtime = runtime_for(params.runtime)
    for role, info, requested in (("target", target, params.target_dtype), ("draft", draft, params.draft_dtype)):
        try:
            runtime.engine_dtype(requested, role, info.torch_dtype)
        except SpecbuildError as exc:
            report.reasons.append(Finding(code=f"{role}-dtype", message=exc.message, fix=exc.fix))
    stored = {info.torch_dtype for info in (target, draft)}
    if len(stored) > 1:
        report.warnings.append(Finding(
            code="checkpoint-dtypes",
            message=f"checkpoints are stored in different dtypes (target {target.torch_dtype}, draft "
                    f"{draft.torch_dtype}); both are cast to the engine dtype"))


def _sizes(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
           report: CompatibilityReport) -> None:
    cost = report.cost_ratio
    low, high = COST_RATIO_RANGE
    if cost is None or low <= cost <= high:
        return
    shapes = (f"draft {draft.num_layers} layers x {draft.hidden_size} wide with a {draft.head_rows}-row output head, "
              f"target {target.num_layers} x {target.hidden_size} with {target.head_rows} rows")
    if cost > high:
        advice = (f"the draft is too large to save time: {BreakEven(cost).meaning()}; a draft costing under "
                  f"{high:g} of a target step leaves room to gain")
    else:
        advice = "the draft is so small that its guesses may rarely be accepted"
    report.warnings.append(Finding(
        code="size-ratio",
        message=f"a draft token costs {cost:.3g} of a target step in multiply-adds ({shapes}): {advice}"))


@dataclass(frozen=True)
class BreakEven:
    """When the draft pays: the share of drafted tokens that must be accepted for ``k`` drafts a round to be as fast
    as the target alone. A round then yields ``1 + k * share`` tokens for ``k * cost_ratio + verify_cost`` target
    steps (the model of :func:`specbuild.speculation.cost.expected_speedup`); ``verify_cost`` is the target's
    verification of the k drafts as ``specbuild init`` or ``tune`` measured it (None: one target step, as on a
    GPU)."""

    cost_ratio: float
    k: int = 1
    verify_cost: float | None = None

    @classmethod
    def of(cls, cost_ratio: float, speculation: SpeculationSpec) -> BreakEven:
        """At the spec's default K (1 where it is 0), with the verification cost measured for it, if any."""
        k = speculation.num_draft_tokens or 1
        return cls(cost_ratio, k, speculation.verify_cost.get(k))

    @property
    def share(self) -> float | None:
        """None where not even every drafted token accepted pays."""
        share = self.cost_ratio + ((1.0 if self.verify_cost is None else self.verify_cost) - 1) / self.k
        return share if share < 1 else None

    def meaning(self) -> str:
        """The break-even in words."""
        k = self.k
        basis = (f"verifying {k} drafted token{'s' * (k > 1)} measured at {self.verify_cost:.2f} target steps"
                 if self.verify_cost is not None else "verification taken at one target step, as on a GPU "
                 "(`specbuild init` measures it on this machine)")
        if self.share is None:
            return (f"the draft cannot pay: even with every drafted token accepted, K={k} would be slower than the "
                    f"target alone ({basis})")
        return (f"speculation at K={k} breaks even when more than {self.share:.0%} of the drafted tokens are "
                f"accepted ({basis})")

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "verify_cost": self.verify_cost, "accepted_share": self.share}


def _beyond(role: str, field: str, value: int, limit: int) -> Finding:
    """A limit the user set to more positions than ``role``'s model holds."""
    return Finding(code=f"{role}-max-positions",
                   message=f"limits.{field} {value} is more than the {role} supports (max_position_embeddings {limit})",
                   fix=f"lower limits.{field} to {limit} or less, or leave it out to take it from the {role}")


def _positions(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
               report: CompatibilityReport) -> None:
    """Refuse limits the user set beyond what their model supports (defaults are taken to fit): the release's against
    the target alone, the draft engine's against the draft; warn when the draft holds less than the release serves."""
    limit, window = target.max_position_embeddings, draft.max_position_embeddings
    if limit is not None and params.max_seq_len is not None and params.max_seq_len > limit:
        report.reasons.append(_beyond("target", "max_seq_len", params.max_seq_len, limit))
    elif limit is not None and params.max_seq_len is None and params.max_input_len is not None \
            and params.max_input_len >= limit:
        report.reasons.append(Finding(
            code="target-max-positions",
            message=f"limits.max_input_len {params.max_input_len} leaves no room to generate within the "
                    f"target's max_position_embeddings ({limit})",
            fix=f"lower limits.max_input_len below {limit}, or leave it out to take it from the checkpoints"))
    if window is not None and params.draft_max_seq_len is not None and params.draft_max_seq_len > window:
        report.reasons.append(_beyond("draft", "draft_max_seq_len", params.draft_max_seq_len, window))
        return
    resolved = LimitsSpec(max_seq_len=params.max_seq_len, max_input_len=params.max_input_len,
                          draft_max_seq_len=params.draft_max_seq_len).resolve(limit, window)
    if resolved.draft_max_seq_len < resolved.max_seq_len:
        report.warnings.append(Finding(
            code="draft-window",
            message=f"the draft engine holds {resolved.draft_max_seq_len} positions, the release serves "
                    f"{resolved.max_seq_len}: past {resolved.draft_max_seq_len} tokens a request drafts by prompt "
                    "lookup only, or runs on the target alone (counted in specbuild_draft_window_requests_total)",
            fix="a draft trained for a longer context speculates over the whole window"))


def _rope(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
          report: CompatibilityReport) -> None:
    if (target.rope_theta, target.rope_scaling) != (draft.rope_theta, draft.rope_scaling):
        report.warnings.append(Finding(
            code="rope",
            message=f"rope settings differ (target theta {target.rope_theta}, scaling {target.rope_scaling}; draft "
                    f"theta {draft.rope_theta}, scaling {draft.rope_scaling}); each model keeps its own, but "
                    "acceptance may drop at lengths the draft was not trained for"))


def _legacy_rope(target: CheckpointInfo, draft: CheckpointInfo, params: PairParams,
                 report: CompatibilityReport) -> None:
    """A reason where the runtime's image reads a checkpoint as it is and its config.json holds RoPE only as
    transformers 5 saves it (``rope_parameters``): transformers 4.57 there runs its config class's default theta
    (10000 for Llama), unscaled, and TensorRT-LLM with it (``getattr(hf_config, "rope_theta", 10000.0)`` in its
    converters, ``config.rope_theta`` in its PyTorch backend), so the release would serve other text than the torch
    runtime's (:func:`specbuild.checkpoint.rope.legacy_rope_keys`)."""
    runtime = runtime_for(params.runtime)
    if not runtime.reads_checkpoints_in_image:
        return
    for role, info in (("target", target), ("draft", draft)):
        if not info.legacy_rope_missing:
            continue
        keys = json.dumps(info.legacy_rope_missing)[1:-1]
        report.reasons.append(Finding(
            code=f"{role}-rope-keys",
            message=f"{info.path}/config.json holds its RoPE only in rope_parameters (as transformers 5 saves it): "
                    f"the {runtime.name} runtime's image reads the folder as it is with transformers 4.57, which "
                    "ignores that key and runs its default rope_theta (10000 for Llama), unscaled: other numbers "
                    "than this checkpoint's",
            fix=f"add {keys} beside rope_parameters in {info.path}/config.json (transformers 5 reads the same RoPE "
                "from both), or use --runtime torch, whose release carries a copy with them"))
