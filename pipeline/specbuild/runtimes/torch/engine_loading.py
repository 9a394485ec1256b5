"""An engine model of a torch-runtime release loaded from its parameters, as Triton's ``target``/``draft`` model
(``engine_model.py``) loads it and as ``specbuild bench --in-process`` loads it beside the server, so both run the
very same engine: its folder confined to the release, its limits from its build record, its head vocabulary
checked, its threads (a :class:`~specbuild.runtimes.torch.threads.ThreadGovernor`), its first-call paths warmed up
and the backend's own guided decoding where the parameters turn it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.package.backend_guides import guided_decoding_configured
from specbuild.package.build_record import BUILD_INFO, BuildRecord
from specbuild.runtimes.torch.parameters import TorchEngineParameters
from specbuild.runtimes.torch.threads import ThreadGovernor, threads, wait_policy


def resolve_engine_dir(value: str, release_root: Path) -> Path:
    """``gpt_model_path`` as a folder; a relative one may not climb out of the release folder."""
    path = Path(value)
    if path.is_absolute():
        resolved = path.resolve()
    else:
        resolved = (release_root / path).resolve()
        if release_root != resolved and release_root not in resolved.parents:
            raise ValueError(f"gpt_model_path {value!r} escapes the release folder {release_root}")
    if not (resolved / BUILD_INFO).is_file():
        raise ValueError(f"gpt_model_path {value!r}: no engine at {resolved} (its {BUILD_INFO} is missing)")
    return resolved


def check_head_vocabulary(loaded: str | None, recorded: str | None, parameter: str | None) -> None:
    """The sha256 of the head vocabulary the engine loaded (None: a full head) must be the one its build record and
    its ``head_vocabulary_sha256`` parameter name: a list swapped after the build would serve another draft."""
    if loaded == recorded == parameter:
        return
    raise ValueError(f"head vocabulary mismatch: the engine folder holds {loaded or 'none'}, its build record names "
                     f"{recorded or 'none'} and head_vocabulary_sha256 {parameter or 'none'}; recompile the release "
                     "(specbuild compile)")


def engine_governor(parameters: TorchEngineParameters, device: str) -> ThreadGovernor:
    """The engine's threads: a fixed count, or for 0 (every core) one or every core step by step on a CPU."""
    count = threads(parameters.torch_threads)
    return ThreadGovernor(count, adaptive=not parameters.torch_threads and device == "cpu")


@dataclass
class LoadedEngine:
    engine: Any  # TorchEngine
    runner: Any  # what answers requests: the engine, or the engine under the backend's guided decoding
    guided: bool  # the backend's guided decoding is on
    description: str  # for the model's log: device, threads, wait policy


def load_engine(parameters: TorchEngineParameters, release_root: Path) -> LoadedEngine:
    """The engine ``parameters`` describe, in the release at ``release_root`` (the repository's parent)."""
    from specbuild.runtimes.torch.backend_guided import BackendGuidedEngine
    from specbuild.runtimes.torch.engine import TorchEngine, resolve_device

    engine_dir = resolve_engine_dir(parameters.gpt_model_path, release_root)
    record = BuildRecord.read(engine_dir)
    device = resolve_device(parameters.torch_device)
    governor = engine_governor(parameters, device)
    engine = TorchEngine(
        engine_dir,
        dtype=record.dtype,
        device=device,
        max_seq_len=record.limits.engine_seq_len,
        max_draft_len=record.limits.max_draft_len,
        cache_tokens=(parameters.max_tokens_in_paged_kv_cache or 0) if parameters.enable_kv_cache_reuse else 0,
        governor=governor,
    )
    check_head_vocabulary(engine.head_vocabulary.sha256 if engine.head_vocabulary else None,
                          record.head_vocabulary.sha256 if record.head_vocabulary else None,
                          parameters.head_vocabulary_sha256)
    engine.warm_up()  # before the model reports ready: the first request costs what later ones do
    guided = guided_decoding_configured(parameters.guided_decoding_backend, parameters.xgrammar_tokenizer_info_path)
    runner = BackendGuidedEngine(engine, release_root / parameters.xgrammar_tokenizer_info_path) if guided else engine
    return LoadedEngine(engine, runner, guided, f"torch on {device} with {governor.describe()} intra-op threads, "
                                                f"{wait_policy()}")
