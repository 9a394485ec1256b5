"""A replica's serving container for ``specbuild deploy``: the deploy options, what a release needs of a node,
and the :class:`PodPlan` each runtime serves with (see :mod:`specbuild.serve.k8s` for the objects around it)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.runtimes.registry import runtime_for
from specbuild.spec import ROLES
from specbuild.errors import UsageError
from specbuild.serve.launch import DEFAULT_SHM_GIB, LaunchPlan, api_port, published_ports, release_plan
from specbuild.spec import BuildSpec

if TYPE_CHECKING:
    from specbuild.package.manifest import Release

CPU_RELEASE_ROOT = "/release"  # where the CPU pod mounts the release folder (the repository, its engines beside)
CPU_IMAGE = "specbuild:cpu"  # docker/Dockerfile.cpu: push it to your registry and pass --image
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery: the GPU's name, spaces as '-'
# Host memory of a replica beyond /dev/shm and the engines: tritonserver and the python models' processes
# (tokenizers in pre/postprocessing, the orchestrator), and, per GPU process, CUDA's and TensorRT-LLM's host side.
SERVER_HOST_GIB = 2
PER_GPU_HOST_GIB = 1
TORCH_WORKING_SHARE = 0.25  # the torch runtime's KV cache and activations, as a share of its weights
DEFAULT_CPU_CORES = 4  # a torch release whose engines use every core (threads 0) gets this many
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class DeployOptions:
    """How a release is deployed; every field has a default that suits one replica on one node."""

    namespace: str = "default"
    replicas: int = 1
    max_replicas: int | None = None  # None: 4 x replicas
    pvc: str | None = None  # claim holding <engines>/ and <repository>/ side by side
    release_image: str | None = None  # image with /release/<engines> and /release/<repository>
    image: str | None = None  # the serving image; None: the release's triton.image, or CPU_IMAGE for torch
    cpu: float | None = None  # cores per replica; None: from the release
    memory_gib: float | None = None  # host memory per replica; None: from the release (see the module notes)
    shm_gib: int = DEFAULT_SHM_GIB
    hpa_target: float | None = None  # in-flight requests per pod; None: 3/4 of limits.max_batch_size
    monitor_labels: dict[str, str] = field(default_factory=dict)  # labels a Prometheus selects PodMonitors by
    startup_timeout_s: int = 1800  # engine load (a 70B target takes minutes)
    termination_grace_s: int = 120
    # specbuild's OpenAI-compatible API beside a GPU release's Triton (docker/Dockerfile.cpu builds this image)
    openai_image: str = "specbuild:cpu"


@dataclass(frozen=True)
class ReleaseFootprint:
    """What a release needs of a node, read from the release on disk."""

    weight_bytes: int  # the engines, or the checkpoints a runtime without engines serves: loaded through host
    # memory (and kept there by the torch runtime)
    gpu: str | None  # the GPU the engines were built on (their build record), None: not recorded (CPU runtimes)

    @classmethod
    def of(cls, release: Release) -> ReleaseFootprint:
        folders = list(release.checkpoints.values()) or [release.engines]
        weights = [path for folder in folders if folder.is_dir() for path in folder.rglob("*") if path.is_file()]
        gpu = (release.build_info.get("target") or {}).get("gpu") or {}
        return cls(sum(path.stat().st_size for path in weights), gpu.get("name"))


@dataclass(frozen=True)
class PodPlan:
    """A replica's serving container: what it runs, with what, and where it may be scheduled."""

    image: str
    args: tuple[str, ...]  # to the image's entrypoint
    env: dict[str, str]
    ports: dict[str, int]  # by name; "http" answers the health checks, "metrics" is scraped
    gpus: int
    cpu: tuple[float, float]  # cores: request, limit
    memory_gib: int  # request = limit
    volume_mounts: tuple[dict[str, Any], ...]
    node_selector: dict[str, str]
    # a container of its own for the OpenAI-compatible API, on this port (a GPU release's image has no specbuild;
    # `specbuild serve` in the CPU image serves the API itself, its port among ``ports``); None: none
    openai_sidecar_port: int | None = None


def k8s_name(name: str) -> str:
    """``spec.name`` as a DNS label (lowercase, ``-`` for other characters), valid for every kind here."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"specbuild-{label}".rstrip("-")
    return label[:63].rstrip("-")


def gpu_label_value(gpu: str) -> str:
    """A GPU name as NVIDIA's GPU feature discovery writes it into ``nvidia.com/gpu.product`` (``NVIDIA H100 80GB
    HBM3`` -> ``NVIDIA-H100-80GB-HBM3``), cut to a valid label value."""
    return _LABEL_VALUE.sub("-", gpu.strip()).strip("-_.")[:63].rstrip("-_.")


def check_options(options: DeployOptions) -> None:
    if not _DNS_LABEL.match(options.namespace):
        raise UsageError(f"namespace {options.namespace!r} is not a valid Kubernetes name",
                         "use lowercase letters, digits and '-', starting with a letter")
    if options.replicas < 1:
        raise UsageError(f"replicas must be at least 1, got {options.replicas}", "pass --replicas 1 or more")
    if options.max_replicas is not None and options.max_replicas < options.replicas:
        raise UsageError(f"max replicas ({options.max_replicas}) is below replicas ({options.replicas})",
                         "raise --max-replicas or lower --replicas")
    if (options.pvc is None) == (options.release_image is None):
        raise UsageError("the pod needs the release from exactly one source: a PVC or a release image",
                         "pass --pvc CLAIM (holding the engines and repository folders) or --release-image IMAGE")
    if options.pvc is not None and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", options.pvc):
        raise UsageError(f"PVC name {options.pvc!r} is not a valid Kubernetes name", "use the claim's exact name")
    for what, value in (("HPA target", options.hpa_target), ("--cpu", options.cpu), ("--memory-gib", options.memory_gib)):
        if value is not None and value <= 0:
            raise UsageError(f"{what} must be positive, got {value}", "pass a value above 0")



def _memory_gib(options: DeployOptions, weights_gib: float, gpus: int) -> int:
    if options.memory_gib is not None:
        return math.ceil(options.memory_gib)
    return math.ceil(options.shm_gib + weights_gib + SERVER_HOST_GIB + PER_GPU_HOST_GIB * gpus)


def _volume_mounts(plan: LaunchPlan) -> tuple[dict[str, Any], ...]:
    """The launch plan's mounts, each folder found in the release volume by its name (as compile named it)."""
    names = [Path(mount.source).name for mount in plan.mounts]
    if len(set(names)) != len(names):
        raise UsageError(f"the release's folders {', '.join(m.source for m in plan.mounts)} must have different "
                         "names to sit side by side in one volume", "rename the folders (and package again)")
    return tuple({"name": "release", "mountPath": mount.target, "subPath": name, "readOnly": mount.read_only}
                 for mount, name in zip(plan.mounts, names))


# --- the serving container, by how the runtime serves ------------------------------------------------------
def gpu_pod_plan(spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
    """The launch plan in the release's container image, on the GPU it was built for."""
    checkpoints = {role: getattr(spec, role).checkpoint for role in ROLES}
    plan = release_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir, checkpoints,
                        shm_gib=options.shm_gib)
    # one host core per engine process, two for the server and the python models; bursts up to twice that
    cores = 2 + plan.gpu_count
    cpu = (options.cpu, options.cpu) if options.cpu is not None else (cores, 2 * cores)
    return PodPlan(image=options.image or plan.image, args=plan.server_argv, env=plan.env, ports=plan.ports,
                   gpus=plan.gpu_count, cpu=cpu,
                   memory_gib=_memory_gib(options, footprint.weight_bytes / 2**30, plan.gpu_count),
                   volume_mounts=_volume_mounts(plan),
                   node_selector={GPU_PRODUCT_LABEL: gpu_label_value(footprint.gpu)} if footprint.gpu else {},
                   openai_sidecar_port=plan.openai_port)


def cpu_pod_plan(spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
    """``specbuild serve`` in the CPU image: the repository with its engines beside it, as compiled. CPU requests
    equal limits (whole cores): with the kubelet's static CPU manager the pod gets cores of its own, the ones torch
    sizes its threads by."""
    ports = {**published_ports(spec), "openai": api_port(spec)}  # serve runs the OpenAI-compatible API too
    threads = spec.torch
    if options.cpu is not None:
        cores = options.cpu
    elif threads.target_threads and threads.draft_threads:  # the engines' threads, one core for the rest
        cores = threads.target_threads + threads.draft_threads + 1
    else:  # 0: every core the pod may run on
        cores = DEFAULT_CPU_CORES
    repository = f"{CPU_RELEASE_ROOT}/{Path(spec.outputs.repository_dir).name}"
    args = ("serve", repository, "--host", "0.0.0.0", *(f"--{kind}-port={port}" for kind, port in ports.items()),
            f"--timeout={options.startup_timeout_s}")
    return PodPlan(image=options.image or CPU_IMAGE, args=args, env={}, ports=ports, gpus=0, cpu=(cores, cores),
                   memory_gib=_memory_gib(options, footprint.weight_bytes / 2**30 * (1 + TORCH_WORKING_SHARE), 0),
                   volume_mounts=({"name": "release", "mountPath": CPU_RELEASE_ROOT, "readOnly": True},),
                   node_selector={})


def pod_plan(spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
    make = gpu_pod_plan if runtime_for(spec.runtime).container_launch else cpu_pod_plan
    return make(spec, options, footprint)
