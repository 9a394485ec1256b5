"""``specbuild check``: read both checkpoints, check the pair, plan the memory, report.

:func:`check` is the API (a release pipeline calls it and reads :class:`CheckReport`); :func:`render_check`
draws the report as rich tables for people.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specbuild.check.compatibility import BreakEven, CompatibilityReport, Finding, PairParams, check_pair
from specbuild.check.memory_plan import GIB, MemoryPlan, ModelMemory, plan_memory
from specbuild.checkpoint.info import CheckpointInfo, read_checkpoint
from specbuild.errors import UsageError
from specbuild.runtimes.registry import RUNTIMES, runtime_of
from specbuild.spec import BuildSpec, LimitsSpec, ModelSpec

# The spec fields :func:`check` reads (dotted, as :mod:`specbuild.stages.reads` takes them), besides those the
# runtime's own findings read (``Runtime.reads["check"]``): the pair rules, the resolved limits, the memory plan.
SPEC_READS = ("runtime", "target", "draft", "limits", "security", "speculation.acceptance", "speculation.verification",
              "speculation.max_draft_len", "triton.gpu_memory_gib", "triton.kv_cache_free_gpu_mem_fraction")


class CheckReport(BaseModel):
    target: CheckpointInfo
    draft: CheckpointInfo
    limits: LimitsSpec  # resolved: the spec's, with the ones it left open taken from the checkpoints
    compatibility: CompatibilityReport
    memory: MemoryPlan
    acceptance: str
    runtime: str

    @property
    def same_tokenizer(self) -> bool:
        return self.target.tokenizer.hash == self.draft.tokenizer.hash

    @property
    def reasons(self) -> list[Finding]:
        """Pair incompatibilities, plus the memory plan's refusal when the layout cannot fit the GPU."""
        if not self.memory.problem:
            return list(self.compatibility.reasons)
        return [*self.compatibility.reasons, Finding(code="memory", message=self.memory.problem, fix=self.memory.fix)]

    @property
    def warnings(self) -> list[Finding]:
        return self.compatibility.warnings

    @property
    def compatible(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {
            "compatible": self.compatible,
            "reasons": [r.model_dump() for r in self.reasons],
            "warnings": [w.model_dump() for w in self.warnings],
            "acceptance": self.acceptance,
            "runtime": self.runtime,
            "limits": self.limits.model_dump(),
            "tokenizer": {
                "identical": self.same_tokenizer,
                "target": self.target.tokenizer.model_dump(mode="json"),
                "draft": self.draft.tokenizer.model_dump(mode="json"),
            },
            "size_ratio": self.compatibility.size_ratio,
            "cost_ratio": self.compatibility.cost_ratio,
            "target": self.target.summary(),
            "draft": self.draft.summary(),
            "memory_plan": self.memory.to_dict(),
        }


def check(target_path: str | Path, draft_path: str | Path, spec: BuildSpec | None = None, *,
          allow_pickle: bool = False, trust_remote_code: bool = False,
          gpu_memory_gib: float | None = None) -> CheckReport:
    """Check that the draft at ``draft_path`` can speculate for the target at ``target_path``.

    ``spec`` supplies dtypes, parallelism, limits and acceptance (defaults when None); its security
    settings are honoured as well as the flags. Unreadable or unsafe checkpoints raise
    :class:`~specbuild.errors.CheckpointError`; an incompatible pair is a report with ``reasons``.
    """
    for role, path in (("target", target_path), ("draft", draft_path)):
        if not Path(path).is_dir():
            raise UsageError(f"{role} checkpoint folder {str(path)!r} does not exist",
                             f"pass the {role}'s Hugging Face checkpoint folder "
                             "(config.json, tokenizer files, *.safetensors)")
    spec = spec or BuildSpec(target=ModelSpec(checkpoint=str(target_path)), draft=ModelSpec(checkpoint=str(draft_path)))
    if gpu_memory_gib is not None:  # the GPU the memory plan is for
        spec = spec.model_copy(update={"triton": spec.triton.model_copy(update={"gpu_memory_gib": gpu_memory_gib})})
    options = {"allow_pickle": allow_pickle or spec.security.allow_pickle,
               "trust_remote_code": trust_remote_code or spec.security.trust_remote_code}
    target = read_checkpoint(target_path, **options)
    draft = read_checkpoint(draft_path, **options)
    resolved = spec_for_checkpoints(spec, target, draft)
    return CheckReport(
        target=target, draft=draft, limits=resolved.limits, compatibility=check_pair(target, draft, spec),
        memory=plan_memory(resolved, target, draft, refuse=False),
        acceptance=PairParams.from_spec(spec).acceptance, runtime=runtime_of(spec).name,
    )


def spec_for_checkpoints(spec: BuildSpec, target: CheckpointInfo, draft: CheckpointInfo) -> BuildSpec:
    """``spec`` with the limits it leaves open taken from the checkpoints (:meth:`LimitsSpec.resolve`: the release at
    the target's max_position_embeddings, the draft engine at its own): what every step after the check builds for."""
    return spec.model_copy(update={"limits": spec.limits.resolve(target.max_position_embeddings,
                                                                 draft.max_position_embeddings)})


# --- rendering -----------------------------------------------------------------------------------------
def _bytes(value: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _count(value: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return str(value)


def _checkpoint_rows(info: CheckpointInfo) -> list[str]:
    tok = info.tokenizer
    runs_on = [name for name, runtime in RUNTIMES.items() if runtime.unsupported(info.architecture) is None]
    return [
        info.path,
        f"{info.architecture} (runtimes: {', '.join(runs_on) or 'none'})",
        f"{info.torch_dtype} ({info.weights.format})",
        _count(info.num_parameters),
        f"{info.num_layers} x {info.hidden_size}",
        f"{info.num_attention_heads} / {info.num_kv_heads} x {info.head_dim}",
        str(info.vocab_size),
        str(info.embedding_rows),
        str(info.logits_width),
        (f"{info.head_vocabulary.size} ids (sha256 {info.head_vocabulary.sha256[:16]})" if info.head_vocabulary
         else "full"),
        str(tok.vocab_size),
        tok.hash[:16],
        f"{tok.bos_token_id} / {tok.eos_token_id} / {tok.pad_token_id}",
        str(info.max_position_embeddings),
        f"theta {info.rope_theta}" + (f", {info.rope_scaling}" if info.rope_scaling else ""),
    ]


CHECKPOINT_FIELDS = ("path", "architecture", "stored dtype", "parameters", "layers x hidden", "heads / kv heads x dim",
                     "config vocab_size", "embedding rows", "logits width", "head vocabulary", "tokenizer size", "tokenizer hash",
                     "bos / eos / pad ids", "max positions", "rope")


def _checkpoint_table(report: CheckReport) -> Table:
    table = Table(title="checkpoints")
    for column in ("", "target", "draft"):
        table.add_column(column, overflow="fold")
    for field, t, d in zip(CHECKPOINT_FIELDS, _checkpoint_rows(report.target), _checkpoint_rows(report.draft)):
        style = "red" if field in ("tokenizer hash", "bos / eos / pad ids") and t != d else None
        table.add_row(field, escape(t), escape(d), style=style)
    return table


MEMORY_FIELDS = ("engine dtype", "tp x pp", "weights", "KV cache per token", "KV tokens", "KV cache",
                 "activations + runtime", "kv_cache_free_gpu_mem_fraction")


def _memory_rows(model: ModelMemory, fraction: float) -> list[str]:
    return [model.dtype, f"{model.tp_size} x {model.pp_size}", _bytes(model.weights_bytes_per_gpu),
            _bytes(model.kv_bytes_per_token_per_gpu), f"{model.kv_tokens:,}", _bytes(model.kv_bytes_per_gpu),
            _bytes(model.activation_bytes_per_gpu + model.overhead_bytes_per_gpu), f"{fraction:g}"]


def memory_caption(plan: MemoryPlan) -> str:
    """The memory plan's conclusion in words: what each GPU must hold, the smallest GPU that does, the verdict;
    for models on the CPU, what they take of its memory."""
    if plan.device == "CPU":
        return (f"target and draft need {_bytes(plan.needed_bytes_per_gpu)} of the CPU's memory (weights, "
                "activations and the KV cache at the build limits; the runtime runs them on the CPU here, so no "
                "GPU is checked)")
    gpus = "1 GPU" if plan.gpus == 1 else f"each of {plan.gpus} GPUs"
    lines = [f"target and draft need {_bytes(plan.needed_bytes_per_gpu)} on {gpus} "
             "(weights, activations and the KV cache at the build limits)",
             f"smallest GPU that holds it: {_bytes(plan.min_gpu_bytes)} (the KV cache may use "
             f"{plan.kv_budget_fraction:g} of the memory left after the weights)"]
    if plan.gpu_memory_gib is None:
        lines.append("not checked against a GPU: pass --gpu-memory-gib (or set triton.gpu_memory_gib)")
    else:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"{verdict} a {plan.gpu_memory_gib:g} GiB GPU")
    return "\n".join(lines)


def _memory_table(plan: MemoryPlan) -> Table:
    on_gpu = plan.device == "GPU"
    table = Table(title="memory plan (per GPU)" if on_gpu else "memory plan (CPU memory)")
    for column in ("", "target", "draft"):
        table.add_column(column)
    for field, *values in zip(MEMORY_FIELDS, _memory_rows(plan.target, plan.target_kv_fraction),
                              _memory_rows(plan.draft, plan.draft_kv_fraction)):
        if on_gpu or field != "kv_cache_free_gpu_mem_fraction":  # a share of GPU memory: none on a CPU
            table.add_row(field, *values)
    return table


def render_check(report: CheckReport, console: Console, break_even: BreakEven | None = None) -> None:
    """The report for people: checkpoints side by side, the memory plan, reasons with fixes, warnings, and when the
    draft pays (``break_even``: at the spec's K, with the verification cost measured for it; default K=1)."""
    console.print(_checkpoint_table(report))
    console.print(_memory_table(report.memory))
    console.print(memory_caption(report.memory), highlight=False)
    limits = report.limits
    console.print(f"build limits: max_batch_size {limits.max_batch_size}, max_input_len {limits.max_input_len}, "
                  f"max_seq_len {limits.max_seq_len} (the target's window), draft_max_seq_len "
                  f"{limits.draft_max_seq_len} (the draft's) (those the spec leaves unset come from the checkpoints)",
                  highlight=False)
    for reason in report.reasons:
        console.print(f"[bold red]incompatible[/] ({reason.code}): {escape(reason.message)}", highlight=False)
        if reason.fix:
            console.print(f"  [bold]fix:[/] {escape(reason.fix)}", highlight=False)
    for warning in report.warnings:
        console.print(f"[yellow]warning[/] ({warning.code}): {escape(warning.message)}", highlight=False)
    cost = report.compatibility.cost_ratio
    verdict = ("[bold green]compatible[/]" if report.compatible
               else f"[bold red]incompatible[/] ({len(report.reasons)} reasons)")
    console.print(f"{verdict}: acceptance {report.acceptance}, runtime {report.runtime}", highlight=False)
    if cost is not None:
        meaning = (break_even or BreakEven(cost)).meaning()
        console.print(f"a draft token costs {cost:.3g} of a target step: {meaning}", highlight=False)
