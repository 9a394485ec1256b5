"""How a ``tensorrt-llm-llmapi`` release starts in the NGC image. It has no engines: TensorRT-LLM's LLM-API model loads
the checkpoints, mounted at ``triton.checkpoint_mount``, in one of two layouts, as TensorRT-LLM's
``triton_backend/scripts/launch_triton_server.py`` and tensorrtllm_backend ``docs/llmapi.md`` run it
(:func:`launch_plan`):

* ``single`` (``auto``): one ``tritonserver`` under ``mpirun -n 1``; the LLM spawns its tp x pp GPU workers.
* ``leader``: ``mpirun -n <tp x pp> trtllm-llmapi-launch tritonserver ...``: MPI starts every rank,
  ``trtllm-llmapi-launch`` runs Triton on rank 0 and an LLM-API worker on the others (TensorRT-LLM
  ``tensorrt_llm/llmapi/trtllm-llmapi-launch``); the form that spans nodes (``srun`` in place of ``mpirun``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from specbuild.errors import SpecError, UsageError
from specbuild.package.contract import DRAFT_MODEL, TARGET_MODEL
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, LaunchPlan, Mode, ModelDevices, Mount, published_ports
from specbuild.runtimes.trtllm_image import ENGINE_MODELS, docker_argv, host_path, server_args
from specbuild.spec import BuildSpec, Role

LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # on the NGC image's PATH with TensorRT-LLM


def container_checkpoint(spec: BuildSpec, role: Role) -> str:
    """Where the checkpoint of ``role`` is mounted inside the container (what ``model.yaml`` names)."""
    return f"{spec.triton.checkpoint_mount.rstrip('/')}/{role}"


def launch_mode(spec: BuildSpec) -> Mode:
    """The process layout of ``spec.launch`` for the LLM API (see the module notes)."""
    mode = spec.launch.mode
    if mode == "orchestrator" or spec.launch.fast_logits:
        raise SpecError("TensorRT-LLM's orchestrator mode and fast logits lay out engines; the LLM API starts its "
                        "own workers", "set launch.mode to auto, single or leader (and fast_logits: false), and "
                        "package again")
    return "leader" if mode == "leader" else "single"


def launch_plan(spec: BuildSpec, repository: str | Path, checkpoints: Mapping[str, str | Path], *,
                gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
    """The plan to serve a ``tensorrt-llm-llmapi`` release: ``repository`` and the ``checkpoints`` (host folders
    by role) mounted read-only, the draft on the target's GPUs (the LLM API runs it with the target's layout)."""
    resolved = launch_mode(spec)
    gpu_count = spec.target.world_size
    if gpus is not None and gpu_count > gpus:
        raise UsageError(f"the target needs {gpu_count} GPUs (tp_size x pp_size), but only {gpus} are available",
                         "use smaller tp_size/pp_size, or a host with more GPUs")
    if shm_gib < 1:
        raise UsageError(f"shm_gib must be at least 1, got {shm_gib}", "give /dev/shm 1 GiB or more")
    ports = published_ports(spec)
    server = server_args(spec, ports, rank=0, mpi=True, gpu_count=gpu_count, spawns=None)
    ranks = 1 if resolved == "single" else gpu_count
    server_argv = ["mpirun", "--allow-run-as-root", "-n", str(ranks),
                   *([LLMAPI_LAUNCH] if resolved == "leader" else []), *server]
    mounts = (*(Mount(host_path(checkpoints[role], f"{role} checkpoint"), container_checkpoint(spec, role))
                for role in ENGINE_MODELS),
              Mount(host_path(repository, "repository"), spec.triton.repository_mount))
    devices = {role: ModelDevices(tuple(range(gpu_count)), None, False) for role in ENGINE_MODELS}
    return LaunchPlan(mode=resolved, world_size=ranks, gpu_count=gpu_count, fast_logits=False,
                      spawn_processes=resolved == "single", devices=devices, server_argv=tuple(server_argv), env={},
                      image=spec.triton.image, host=spec.triton.host, ports=ports, openai_port=None,
                      shm_gib=shm_gib, mounts=mounts,
                      docker_argv=docker_argv(spec, gpu_count, shm_gib, ports, mounts, {}, server_argv),
                      runtime=spec.runtime)


def check_compiled_config(repository: Path, spec: BuildSpec) -> None:
    """The LLM-API model's ``model.yaml`` must read back through its typed model and name the checkpoints and
    the parallel layout this launch mounts and reserves GPUs for."""
    from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_MODEL, MODEL_YAML
    from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES
    from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml, parse

    path = repository / LLMAPI_MODEL / "1" / MODEL_YAML
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc}", "package the release again (specbuild package)") from None
    config = parse(ModelYaml, text, str(path), LINES[spec.triton.tensorrt_llm])
    compared = {  # key: (model.yaml's value, what the launch mounts and reserves GPUs for)
        "model": (config.model, container_checkpoint(spec, TARGET_MODEL)),
        "tensor_parallel_size": (config.tensor_parallel_size, spec.target.tp_size),
        "pipeline_parallel_size": (config.pipeline_parallel_size, spec.target.pp_size),
    }
    if config.speculative_config is not None:  # K=0 names no draft
        compared["speculative_model"] = (config.speculative_config.speculative_model,
                                         container_checkpoint(spec, DRAFT_MODEL))
    problems = [f"{key} is {found!r}, the launch needs {needed!r}" for key, (found, needed) in compared.items()
                if found != needed]
    if problems:
        raise SpecError(f"{path} does not match the launch:\n  " + "\n  ".join(problems),
                        "package the release again (specbuild package) rather than editing model.yaml")
