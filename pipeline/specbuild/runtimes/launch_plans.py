"""What a runtime answers when asked how its release is launched: a :class:`LaunchPlan` (a container of the
runtime's image, for GPU releases) or a :class:`BundledPlan` (the Triton server bundled with specbuild), and the
ports every launch publishes. ``specbuild serve`` runs the plan; ``deploy`` puts the same one in a pod."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from specbuild.capture.store import CAPTURE_DIR_ENV, CAPTURE_MOUNT
from specbuild.errors import SpecError
from specbuild.spec import TRITON_DEFAULTS, BuildSpec, TritonSpec

Mode = Literal["single", "leader", "orchestrator"]
DEFAULT_SHM_GIB = 2  # /dev/shm for the python backend's tensors (Docker default 64 MiB is too small)
PORT_KINDS = ("http", "grpc", "metrics")
# Settings a launch may choose; everything else is the release's and is compiled into it.
LAUNCH_SETTINGS = frozenset({"triton.host", "triton.http_port", "triton.grpc_port", "triton.metrics_port",
                             "triton.openai_port", "triton.image", "triton.repository_mount"})


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

    def docker_args(self) -> list[str]:
        return ["--mount", f"type=bind,source={self.source},target={self.target}" + (",readonly" * self.read_only)]


@dataclass(frozen=True)
class LaunchPlan:
    """How to start Triton for one release in its runtime's container image: argv lists and env dicts, never a
    shell string to parse."""

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
    runtime: str  # the release's

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
        return json_lists(data)

    def with_capture(self, store: Path) -> LaunchPlan:
        """This plan with the capture store ``store`` (a host folder) mounted read-write at
        :data:`~specbuild.capture.store.CAPTURE_MOUNT` and named to the server there (a capturing release)."""
        mount = Mount(str(store), CAPTURE_MOUNT, read_only=False)
        at = len(self.docker_argv) - len(self.server_argv) - 1  # the image: docker's options go before it
        options = (*mount.docker_args(), "-e", f"{CAPTURE_DIR_ENV}={CAPTURE_MOUNT}")
        return replace(self, mounts=(*self.mounts, mount), env={**self.env, CAPTURE_DIR_ENV: CAPTURE_MOUNT},
                       docker_argv=(*self.docker_argv[:at], *options, *self.docker_argv[at:]))

    def render(self) -> str:
        """A commented, copy-pasteable shell rendering (``shlex.join``) of the plan."""
        url_host = bracket(self.host)
        lines = [
            f"# specbuild launch plan ({self.runtime} runtime): {self.mode} mode, "
            f"MPI world size {self.world_size}, {self.gpu_count} GPU(s)"
            + (", fast logits" if self.fast_logits else ""),
        ]
        for role, devices in self.devices.items():
            ranks = "" if devices.participant_ids is None else f", MPI ranks {id_list(devices.participant_ids)}"
            lines.append(f"#   {role}: GPUs {id_list(devices.gpu_device_ids)}{ranks}")
        lines.append(f"# serves http://{url_host}:{self.ports['http']} (gRPC {url_host}:{self.ports['grpc']}, "
                     f"metrics http://{url_host}:{self.ports['metrics']}/metrics)")
        if self.openai_port is not None:
            lines.append(f"# `specbuild serve` adds the OpenAI-compatible API at "
                         f"http://{url_host}:{self.openai_port}/v1 (on this host; `specbuild openai` runs it alone)")
        lines.append(self.docker_command)
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BundledPlan:
    """A release served by the Triton server bundled with specbuild, on this machine (``specbuild serve``'s
    :class:`~specbuild.serve.server.TritonServer`): the torch runtime's releases, and rehearsals."""

    repository: Path
    host: str
    ports: dict[str, int]  # Triton's by kind (http, grpc, metrics); 0: a free one
    # specbuild's OpenAI-compatible API beside it; None: the repository has no orchestrator for it to call
    openai_port: int | None

    @classmethod
    def of(cls, triton: TritonSpec, repository: Path, *, openai: bool) -> BundledPlan:
        """``repository`` at the addresses ``triton`` names; ``openai``: with the OpenAI-compatible API."""
        return cls(Path(repository), triton.host, {kind: getattr(triton, f"{kind}_port") for kind in PORT_KINDS},
                   triton.openai_port if openai else None)


def json_lists(value: Any) -> Any:
    """Tuples to lists, recursively: the plain JSON shape."""
    if isinstance(value, dict):
        return {key: json_lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_lists(item) for item in value]
    return value


def id_list(values: tuple[int, ...]) -> str:
    return ",".join(str(value) for value in values)


def bracket(host: str) -> str:
    """IPv6 addresses in brackets, as URLs and ``docker run -p`` want them."""
    return f"[{host}]" if ":" in host else host


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
                        "set triton.openai_port to a fixed port, e.g. "
                        f"--set triton.openai_port={TRITON_DEFAULTS.openai_port}")
    clash = [kind for kind, taken in published_ports(spec).items() if taken == port]
    if clash:
        raise SpecError(f"the ports must differ: triton.openai_port is triton.{clash[0]}_port ({port})",
                        "give the OpenAI-compatible API a port of its own")
    return port
