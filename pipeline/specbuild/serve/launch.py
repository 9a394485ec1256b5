"""Launch plans for the ``tensorrt-llm`` runtime: the ``docker run`` and ``tritonserver``/``mpirun`` commands.

Everything here is a pure function of a :class:`~specbuild.spec.BuildSpec` (no GPU, Docker or TensorRT-LLM
needed), so every command can be generated and checked anywhere. The layout is the spec's ``launch``
section: compile renders it into the engine configs (:func:`model_devices`), and ``serve``/``deploy`` launch
what the release was compiled for (:mod:`specbuild.serve.release_launch` refuses a launch that disagrees with
it). Three process layouts, named as in NVIDIA's tensorrtllm_backend (``scripts/launch_triton_server.py``, ``docs/llama_multi_instance.md``):

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

A ``tensorrt-llm-llmapi`` release (no engines; TensorRT-LLM's LLM-API model loads the checkpoints, mounted at
``triton.checkpoint_mount``) has two layouts, as TensorRT-LLM's ``triton_backend/scripts/launch_triton_server.py``
and tensorrtllm_backend ``docs/llmapi.md`` run it (:func:`llmapi_launch_plan`):

* ``single`` (``auto``): one ``tritonserver`` under ``mpirun -n 1``; the LLM spawns its tp x pp GPU workers.
* ``leader``: ``mpirun -n <tp x pp> trtllm-llmapi-launch tritonserver ...``: MPI starts every rank,
  ``trtllm-llmapi-launch`` runs Triton on rank 0 and an LLM-API worker on the others (TensorRT-LLM
  ``tensorrt_llm/llmapi/trtllm-llmapi-launch``); the form that spans nodes (``srun`` in place of ``mpirun``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from specbuild.runtimes.registry import runtime_for
from specbuild.runtimes.tensorrt_llm_llmapi.launch import container_checkpoint
from specbuild.errors import SpecError, UsageError
from specbuild.package.contract import DRAFT_MODEL, TARGET_MODEL
from specbuild.spec import BuildSpec

Mode = Literal["single", "leader", "orchestrator"]

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # on the NGC image's PATH with TensorRT-LLM
CONTAINER_BIND = "0.0.0.0"  # inside the container; the host side is published on spec.triton.host
ENGINE_MODELS = (TARGET_MODEL, DRAFT_MODEL)
DEFAULT_SHM_GIB = 2  # /dev/shm for the python backend's tensors (Docker default 64 MiB is too small)
PORT_KINDS = ("http", "grpc", "metrics")


@dataclass(frozen=True)
class ModelDevices:
    """Where one engine model runs: the values of its ``gpu_device_ids``/``participant_ids`` parameters."""

    gpu_device_ids: tuple[int, ...]
    participant_ids: tuple[int, ...] | None  # None: not set (TensorRT-LLM picks, or spawns the workers)
    fast_logits: bool


@dataclass(frozen=True)
class Mount:
    source: str  # absolute host path
    target: str  # path inside the container
    read_only: bool = True


@dataclass(frozen=True)
class LaunchPlan:
    """How to start Triton for one release: argv lists and env dicts, never a shell string to parse."""

    mode: Mode
    world_size: int  # MPI processes started by mpirun (1 for single and spawning orchestrator mode)
    gpu_count: int
    fast_logits: bool
    spawn_processes: bool | None  # TensorRT-LLM starts its GPU workers itself (orchestrator mode; LLM API single)
    devices: dict[str, ModelDevices]
    server_argv: tuple[str, ...]  # run inside the container
    env: dict[str, str]
    image: str
    host: str  # host address the ports are published on
    ports: dict[str, int]  # Triton's, published from the container
    # specbuild's OpenAI-compatible API, run on the host next to the container (`specbuild serve`); None: the release
    # has no orchestrator for it to call (tensorrt-llm-llmapi)
    openai_port: int | None
    shm_gib: int
    mounts: tuple[Mount, ...]
    docker_argv: tuple[str, ...]
    runtime: str = "tensorrt-llm"

    @property
    def server_command(self) -> str:
        return shlex.join(self.server_argv)

    @property
    def docker_command(self) -> str:
        return shlex.join(self.docker_argv)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["server_command"] = self.server_command
        data["docker_command"] = self.docker_command
        return _lists(data)

    def render(self) -> str:
        """A commented, copy-pasteable shell rendering (``shlex.join``) of the plan."""
        url_host = _bracket(self.host)
        lines = [
            f"# specbuild launch plan ({self.runtime} runtime): {self.mode} mode, "
            f"MPI world size {self.world_size}, {self.gpu_count} GPU(s)"
            + (", fast logits" if self.fast_logits else ""),
        ]
        for role, devices in self.devices.items():
            ranks = "" if devices.participant_ids is None else f", MPI ranks {_csv(devices.participant_ids)}"
            lines.append(f"#   {role}: GPUs {_csv(devices.gpu_device_ids)}{ranks}")
        lines.append(f"# serves http://{url_host}:{self.ports['http']} (gRPC {url_host}:{self.ports['grpc']}, "
                     f"metrics http://{url_host}:{self.ports['metrics']}/metrics)")
        if self.openai_port is not None:
            lines.append(f"# `specbuild serve` adds the OpenAI-compatible API at "
                         f"http://{url_host}:{self.openai_port}/v1 (on this host; `specbuild openai` runs it alone)")
        lines.append(self.docker_command)
        return "\n".join(lines) + "\n"


def _lists(value: Any) -> Any:
    """Tuples to lists, recursively: the plain JSON shape."""
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(item) for item in value]
    return value


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(value) for value in values)


def require_trtllm(spec: BuildSpec) -> None:
    if not runtime_for(spec.runtime).container_launch:
        raise UsageError(f"launch plans are for GPU releases (tensorrt-llm, tensorrt-llm-llmapi); this release uses "
                         f"runtime {spec.runtime!r}", "serve it with `specbuild serve` (the bundled Triton, CPU or any "
                         "CUDA GPU), or compile it with --runtime tensorrt-llm")


def resolve_mode(spec: BuildSpec) -> Mode:
    """The process layout of ``spec.launch``; raises when it cannot work (see the module notes)."""
    require_trtllm(spec)
    if not runtime_for(spec.runtime).builds_engines:
        return _llmapi_mode(spec)
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


def release_plan(spec: BuildSpec, repository: str | Path, engines: str | Path, checkpoints: Mapping[str, str | Path],
                 **options: Any) -> LaunchPlan:
    """The launch plan of a release of ``spec``'s runtime: its ``engines`` folder, or, for a runtime without
    engines, the ``checkpoints`` TensorRT-LLM's LLM API loads."""
    if runtime_for(spec.runtime).builds_engines:
        return launch_plan(spec, repository, engines, **options)
    return llmapi_launch_plan(spec, repository, checkpoints, **options)


def published_ports(spec: BuildSpec) -> dict[str, int]:
    """The release's fixed ports by kind (``http``, ``grpc``, ``metrics``), refused when one is 0 or they clash."""
    ports = {kind: getattr(spec.triton, f"{kind}_port") for kind in PORT_KINDS}
    for kind, port in ports.items():
        if port == 0:
            raise SpecError(f"triton.{kind}_port is 0 (pick a free port), which a deployment cannot publish",
                            f"set triton.{kind}_port to a fixed port, e.g. --set triton.{kind}_port=800{PORT_KINDS.index(kind)}")
    if len(set(ports.values())) != len(ports):
        raise SpecError(f"triton ports must differ, got {ports}", "give http, grpc and metrics their own ports")
    return ports


def api_port(spec: BuildSpec) -> int:
    """The OpenAI-compatible API's fixed port (``triton.openai_port``), refused when 0 or one of Triton's."""
    port = spec.triton.openai_port
    if port == 0:
        raise SpecError("triton.openai_port is 0 (pick a free port), which a deployment cannot publish",
                        "set triton.openai_port to a fixed port, e.g. --set triton.openai_port=9000")
    clash = [kind for kind, taken in published_ports(spec).items() if taken == port]
    if clash:
        raise SpecError(f"the ports must differ: triton.openai_port is triton.{clash[0]}_port ({port})",
                        "give the OpenAI-compatible API a port of its own")
    return port


def _server_args(spec: BuildSpec, ports: dict[str, int], *, rank: int, mpi: bool, gpu_count: int,
                 spawns: bool | None) -> list[str]:
    args = [TRITONSERVER, f"--model-repository={spec.triton.repository_mount}"]
    if rank == 0:
        for kind in PORT_KINDS:
            args += [f"--{kind}-address={CONTAINER_BIND}", f"--{kind}-port={ports[kind]}"]
        args += ["--exit-on-error=true", "--strict-readiness=true"]
    else:
        # worker ranks load only the engines and never open endpoints (no port clash with rank 0)
        args += ["--model-control-mode=explicit", *(f"--load-model={name}" for name in ENGINE_MODELS),
                 "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    if spawns:
        # what launch_triton_server.py --multi-model adds when TensorRT-LLM spawns its own workers
        args += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
                 *(f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(gpu_count))]
    args.append("--disable-auto-complete-config")
    if mpi:
        args.append(f"--backend-config=python,shm-region-prefix-name=prefix{rank}_")
    return args


def _host_path(path: str | Path, what: str) -> str:
    resolved = str(Path(path).expanduser().resolve())
    if "," in resolved:
        raise UsageError(f"{what} path {resolved!r} contains a comma, which `docker run --mount` cannot take",
                         f"move the {what} to a path without commas")
    return resolved


def _bracket(host: str) -> str:
    """IPv6 addresses in brackets, as URLs and ``docker run -p`` want them."""
    return f"[{host}]" if ":" in host else host


def _publish(host: str, port: int) -> str:
    return f"{_bracket(host)}:{port}:{port}"


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
            f"this layout needs {gpu_count} GPUs (target {_csv(devices['target'].gpu_device_ids)}, draft "
            f"{_csv(devices['draft'].gpu_device_ids)}), but only {gpus} are available",
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
        server_argv = _server_args(spec, ports, rank=0, mpi=False, gpu_count=gpu_count, spawns=spawns)
    else:
        server_argv = ["mpirun", "--allow-run-as-root"]
        for rank in range(world_size):
            if rank:
                server_argv.append(":")
            server_argv += ["-n", "1", *_server_args(spec, ports, rank=rank, mpi=True, gpu_count=gpu_count,
                                                     spawns=spawns)]
    env: dict[str, str] = {}
    if resolved == "orchestrator":
        env = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1" if spawns else "0"}

    mounts = (Mount(_host_path(engines, "engines"), spec.triton.engine_mount),
              Mount(_host_path(repository, "repository"), spec.triton.repository_mount))
    return LaunchPlan(mode=resolved, world_size=world_size, gpu_count=gpu_count, fast_logits=fast_logits,
                      spawn_processes=spawns, devices=devices, server_argv=tuple(server_argv), env=env,
                      image=spec.triton.image, host=spec.triton.host, ports=ports, openai_port=openai_port,
                      shm_gib=shm_gib, mounts=mounts,
                      docker_argv=_docker_argv(spec, gpu_count, shm_gib, ports, mounts, env, server_argv),
                      runtime=spec.runtime)


def _docker_argv(spec: BuildSpec, gpu_count: int, shm_gib: int, ports: dict[str, int], mounts: tuple[Mount, ...],
                 env: dict[str, str], server_argv: list[str]) -> tuple[str, ...]:
    """``docker run`` of the image with ``server_argv``: GPUs, shared memory, published ports, read-only mounts."""
    argv = ["docker", "run", "--rm", "--name", f"specbuild-{spec.name}", "--gpus", str(gpu_count),
            "--shm-size", f"{shm_gib}g", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    for kind in PORT_KINDS:
        argv += ["-p", _publish(spec.triton.host, ports[kind])]
    for mount in mounts:
        argv += ["--mount", f"type=bind,source={mount.source},target={mount.target}"
                 + (",readonly" if mount.read_only else "")]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    return tuple(argv + [spec.triton.image, *server_argv])


# --- tensorrt-llm-llmapi: TensorRT-LLM's LLM-API model ---------------------------------------------------
def _llmapi_mode(spec: BuildSpec) -> Mode:
    mode = spec.launch.mode
    if mode == "orchestrator" or spec.launch.fast_logits:
        raise SpecError("TensorRT-LLM's orchestrator mode and fast logits lay out engines; the LLM API starts its "
                        "own workers", "set launch.mode to auto, single or leader (and fast_logits: false), and "
                        "package again")
    return "leader" if mode == "leader" else "single"


def llmapi_launch_plan(spec: BuildSpec, repository: str | Path, checkpoints: Mapping[str, str | Path], *,
                       gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
    """The plan to serve a ``tensorrt-llm-llmapi`` release: ``repository`` and the ``checkpoints`` (host folders
    by role) mounted read-only, the draft on the target's GPUs (the LLM API runs it with the target's layout)."""
    resolved = resolve_mode(spec)
    gpu_count = spec.target.world_size
    if gpus is not None and gpu_count > gpus:
        raise UsageError(f"the target needs {gpu_count} GPUs (tp_size x pp_size), but only {gpus} are available",
                         "use smaller tp_size/pp_size, or a host with more GPUs")
    if shm_gib < 1:
        raise UsageError(f"shm_gib must be at least 1, got {shm_gib}", "give /dev/shm 1 GiB or more")
    ports = published_ports(spec)
    server = _server_args(spec, ports, rank=0, mpi=True, gpu_count=gpu_count, spawns=None)
    ranks = 1 if resolved == "single" else gpu_count
    server_argv = ["mpirun", "--allow-run-as-root", "-n", str(ranks),
                   *([LLMAPI_LAUNCH] if resolved == "leader" else []), *server]
    mounts = (*(Mount(_host_path(checkpoints[role], f"{role} checkpoint"), container_checkpoint(spec, role))
                for role in ENGINE_MODELS),
              Mount(_host_path(repository, "repository"), spec.triton.repository_mount))
    devices = {role: ModelDevices(tuple(range(gpu_count)), None, False) for role in ENGINE_MODELS}
    return LaunchPlan(mode=resolved, world_size=ranks, gpu_count=gpu_count, fast_logits=False,
                      spawn_processes=resolved == "single", devices=devices, server_argv=tuple(server_argv), env={},
                      image=spec.triton.image, host=spec.triton.host, ports=ports, openai_port=None,
                      shm_gib=shm_gib, mounts=mounts,
                      docker_argv=_docker_argv(spec, gpu_count, shm_gib, ports, mounts, {}, server_argv),
                      runtime=spec.runtime)


def format_launch(spec: BuildSpec, repository: str | Path, engines: str | Path, **options: Any) -> str:
    """:func:`launch_plan` as commented shell text (what ``specbuild serve --dry-run`` prints)."""
    return launch_plan(spec, repository, engines, **options).render()


def launch_as_dict(spec: BuildSpec, repository: str | Path, engines: str | Path, **options: Any) -> dict[str, Any]:
    """:func:`launch_plan` as a JSON-ready dict (argv lists, env, devices, ports, mounts)."""
    return launch_plan(spec, repository, engines, **options).to_dict()
