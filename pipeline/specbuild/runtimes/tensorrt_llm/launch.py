"""How a ``tensorrt-llm`` release starts: the ``docker run`` and ``tritonserver``/``mpirun`` commands of its layout.

Everything here is a pure function of a :class:`~specbuild.spec.BuildSpec` (no GPU, Docker or TensorRT-LLM
needed), so every command can be generated and checked anywhere. The layout is the spec's ``launch``
section: compile renders it into the engine configs (:func:`model_devices`), and ``serve``/``deploy`` launch
what the release was compiled for (:func:`check_engine_configs` refuses a launch that disagrees with it). Three process layouts, named as in NVIDIA's tensorrtllm_backend (``scripts/launch_triton_server.py``, ``docs/llama_multi_instance.md``):

* ``single``: both engines have one rank; one plain ``tritonserver`` process, both models on GPU 0.
* ``leader``: ``mpirun -n <world>``, one ``tritonserver`` per rank; rank 0 loads the whole repository and
  serves HTTP/gRPC/metrics, the other ranks load only the engine models with their endpoints off.
* ``orchestrator``: TensorRT-LLM's *orchestrator mode* (an MPI process mode chosen by
  ``TRTLLM_ORCHESTRATOR=1``; unrelated to specbuild's ``orchestrator`` Triton model). By default rank 0
  spawns the engine workers itself (MPI world size 1). With fast logits (draft logits passed device to
  device) spawning must be off (``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0``), every rank is started by
  ``mpirun`` (world size 1 + draft ranks + target ranks) and both engine configs need ``participant_ids``.
  TensorRT-LLM silently turns fast logits off when any of this is missing; here it is an error instead.

``auto`` picks ``single`` when both models fit one rank, otherwise ``orchestrator``: NVIDIA's draft-target
guide (TensorRT-LLM ``examples/draft_target_model/README.md``) says ``--multi-model`` (orchestrator mode)
is necessary once tensor parallelism is used, because two TensorRT-LLM models share the MPI world; so
``leader`` (the slurm-friendly mode) is refused when either model uses tensor parallelism.
"""

from __future__ import annotations

from pathlib import Path

from specbuild.errors import SpecError, UsageError
from specbuild.runtimes.launch_plans import (
    DEFAULT_SHM_GIB,
    LaunchPlan,
    Mode,
    ModelDevices,
    Mount,
    api_port,
    id_list,
    published_ports,
)
from specbuild.runtimes.names import TENSORRT_LLM
from specbuild.runtimes.trtllm_image import docker_argv, host_path, server_args
from specbuild.spec import BuildSpec


def resolve_mode(spec: BuildSpec) -> Mode:
    """The process layout of ``spec.launch``; raises when it cannot work (see the module notes)."""
    if spec.runtime != TENSORRT_LLM:
        raise UsageError(f"this launch layout is for tensorrt-llm GPU releases; this release uses runtime {spec.runtime!r}",
                         "ask the release's own runtime for its launch plan (specbuild serve --dry-run)")
    mode, fast_logits = spec.launch.mode, spec.launch.fast_logits
    ranks = max(spec.target.world_size, spec.draft.world_size)
    if fast_logits:
        if mode in ("single", "leader"):
            raise SpecError(
                f"fast logits need TensorRT-LLM orchestrator mode with spawning disabled, not {mode} mode "
                "(TensorRT-LLM would silently turn them off)",
                "set launch.mode: orchestrator (or auto), or launch.fast_logits: false, and compile again")
        return "orchestrator"
    if mode == "auto":
        return "single" if ranks == 1 else "orchestrator"
    if mode == "single" and ranks > 1:
        raise SpecError(
            f"single mode runs one process, but the target has {spec.target.world_size} rank(s) and the draft "
            f"{spec.draft.world_size} (tp_size x pp_size)",
            "set launch.mode: orchestrator (or auto), or build both models with tp_size=pp_size=1")
    if mode == "leader" and max(spec.target.tp_size, spec.draft.tp_size) > 1:
        raise SpecError(
            "leader mode with tensor parallelism for two TensorRT-LLM models is not a layout NVIDIA supports "
            "(its draft-target guide requires orchestrator mode with tensor parallelism)",
            "set launch.mode: orchestrator (or auto) and compile again")
    return mode


def _spawns(mode: Mode, fast_logits: bool) -> bool | None:
    """Orchestrator mode spawns its own workers, except with fast logits (every rank started by mpirun)."""
    return None if mode != "orchestrator" else not fast_logits


def model_devices(spec: BuildSpec) -> dict[str, ModelDevices]:
    """``{"target": ModelDevices, "draft": ModelDevices}``: the GPUs and MPI ranks of each engine for the spec's
    launch layout. ``placement: shared`` puts the draft on the target's first GPU(s) (best when both fit, per
    NVIDIA's draft-target guide); ``separate`` gives the draft its own GPU(s) after the target's."""
    mode = resolve_mode(spec)
    fast_logits = spec.launch.fast_logits
    target_ranks, draft_ranks = spec.target.world_size, spec.draft.world_size
    target_gpus = tuple(range(target_ranks))
    first_draft_gpu = target_ranks if spec.launch.placement == "separate" else 0
    draft_gpus = tuple(range(first_draft_gpu, first_draft_gpu + draft_ranks))
    if mode == "leader":
        target_ids: tuple[int, ...] | None = tuple(range(target_ranks))
        draft_ids: tuple[int, ...] | None = tuple(range(draft_ranks))
    elif mode == "orchestrator" and not _spawns(mode, fast_logits):
        # rank 0 is the orchestrator, then the draft's ranks, then the target's (NVIDIA's fast-logits layout)
        draft_ids = tuple(range(1, 1 + draft_ranks))
        target_ids = tuple(range(1 + draft_ranks, 1 + draft_ranks + target_ranks))
    else:
        target_ids = draft_ids = None
    return {
        "target": ModelDevices(target_gpus, target_ids, fast_logits),
        "draft": ModelDevices(draft_gpus, draft_ids, fast_logits),
    }


def launch_plan(spec: BuildSpec, repository: str | Path, engines: str | Path, *, gpus: int | None = None,
                shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
    """The full plan to serve ``repository`` + ``engines`` (host folders) in ``spec.triton.image``.

    ``gpus``: GPUs the host has; a layout needing more is refused. The engines and the repository are
    mounted read-only at ``spec.triton.engine_mount``/``repository_mount`` (the repository's engine paths
    must point there), ports are published on ``spec.triton.host`` (loopback unless the spec says otherwise).
    """
    resolved = resolve_mode(spec)
    fast_logits = spec.launch.fast_logits
    spawns = _spawns(resolved, fast_logits)
    devices = model_devices(spec)
    gpu_count = len(set(devices["target"].gpu_device_ids) | set(devices["draft"].gpu_device_ids))
    if gpus is not None and gpu_count > gpus:
        raise UsageError(
            f"this layout needs {gpu_count} GPUs (target {id_list(devices['target'].gpu_device_ids)}, draft "
            f"{id_list(devices['draft'].gpu_device_ids)}), but only {gpus} are available",
            "use placement 'shared', smaller tp_size/pp_size, or a host with more GPUs")
    if shm_gib < 1:
        raise UsageError(f"shm_gib must be at least 1, got {shm_gib}", "give /dev/shm 1 GiB or more")
    ports = published_ports(spec)
    openai_port = api_port(spec)

    if resolved == "single":
        world_size = 1
    elif resolved == "leader":
        world_size = max(spec.target.world_size, spec.draft.world_size)
    else:
        world_size = 1 if spawns else 1 + spec.draft.world_size + spec.target.world_size
    if resolved == "single":
        server_argv = server_args(spec, ports, rank=0, mpi=False, gpu_count=gpu_count, spawns=spawns)
    else:
        server_argv = ["mpirun", "--allow-run-as-root"]
        for rank in range(world_size):
            if rank:
                server_argv.append(":")
            server_argv += ["-n", "1", *server_args(spec, ports, rank=rank, mpi=True, gpu_count=gpu_count,
                                                     spawns=spawns)]
    env: dict[str, str] = {}
    if resolved == "orchestrator":
        env = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1" if spawns else "0"}

    mounts = (Mount(host_path(engines, "engines"), spec.triton.engine_mount),
              Mount(host_path(repository, "repository"), spec.triton.repository_mount))
    return LaunchPlan(mode=resolved, world_size=world_size, gpu_count=gpu_count, fast_logits=fast_logits,
                      spawn_processes=spawns, devices=devices, server_argv=tuple(server_argv), env=env,
                      image=spec.triton.image, host=spec.triton.host, ports=ports, openai_port=openai_port,
                      shm_gib=shm_gib, mounts=mounts,
                      docker_argv=docker_argv(spec, gpu_count, shm_gib, ports, mounts, env, server_argv),
                      runtime=spec.runtime)


def check_engine_configs(repository: Path, spec: BuildSpec) -> None:
    """Refuse engine configs whose devices differ from the launch layout: a missing ``participant_ids`` would make
    TensorRT-LLM drop fast logits without a word, or hang waiting for ranks; this names the model and the key."""
    from specbuild.package.backend_contract import EngineParameters
    from specbuild.package.repository import read_config

    problems = []
    for role, devices in model_devices(spec).items():
        config = read_config(repository / role)
        rendered = EngineParameters.from_parameters({k: v.string_value for k, v in config.parameters.items()})
        expected = {"gpu_device_ids": devices.gpu_device_ids, "participant_ids": devices.participant_ids,
                    "speculative_decoding_fast_logits": devices.fast_logits}
        for key, value in expected.items():
            if getattr(rendered, key) != value:
                problems.append(f"{role}: {key} is {getattr(rendered, key)!r}, the launch layout needs {value!r}")
    if problems:
        raise SpecError("the release's engine configs do not match its launch layout:\n  " + "\n  ".join(problems),
                        "package the release again (specbuild package) rather than editing its configs")
