"""A replica's serving container for ``specbuild deploy``: the deploy options, what a release needs of a node, and
the :class:`PodPlan` a runtime answers with (:meth:`~specbuild.runtimes.interface.Runtime.pod_plan`; the objects
around it are :mod:`specbuild.serve.k8s`'s)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specbuild.capture.store import CAPTURE_MOUNT
from specbuild.errors import UsageError
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB

if TYPE_CHECKING:
    from specbuild.package.manifest import Release

# Host memory of a replica beyond /dev/shm and the engines: tritonserver and the python models' processes
# (tokenizers in pre/postprocessing, the orchestrator), and, per GPU process, CUDA's and TensorRT-LLM's host side.
SERVER_HOST_GIB = 2
PER_GPU_HOST_GIB = 1
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a claim's or a storage class's name
# what docker/Dockerfile.cpu builds: the torch runtime's serving image, and the OpenAI-compatible API's beside a GPU
# release's Triton (push it to your registry and pass its name)
CPU_IMAGE = "specbuild:cpu"
REPLICA_CEILING = 4  # the autoscaler's ceiling unless given, in replicas per requested replica
# A capturing release's pods (specbuild.serve.k8s: a StatefulSet): pod <name>-<n> mounts the claim capture-<name>-<n>,
# read-write, at CAPTURE_MOUNT. Its store is a folder of the claim, not the claim's root (as a host folder is for
# `serve`): the kubelet gives a volume's root to the pod's fsGroup, group-writable (kubernetes
# pkg/volume/volume_linux.go, SetVolumeOwnership: rwMask 0660, directories setgid), and a store must be writable by
# its owner alone (specbuild.capture.store.check_store_folder), so the server creates the folder itself, 0700.
CAPTURE_VOLUME = "capture"
POD_CAPTURE_STORE = f"{CAPTURE_MOUNT}/store"


@dataclass(frozen=True)
class DeployOptions:
    """How a release is deployed; every field has a default that suits one replica on one node."""

    namespace: str = "default"
    replicas: int = 1
    max_replicas: int | None = None  # None: REPLICA_CEILING x replicas
    pvc: str | None = None  # claim holding <engines>/ and <repository>/ side by side
    capture_storage_class: str | None = None  # a capturing release's claims; None: the cluster's default class
    release_image: str | None = None  # image with /release/<engines> and /release/<repository>
    image: str | None = None  # the serving image; None: the release's triton.image, or CPU_IMAGE for torch
    cpu: float | None = None  # cores per replica; None: from the release
    memory_gib: float | None = None  # host memory per replica; None: from the release (see the module notes)
    shm_gib: int = DEFAULT_SHM_GIB
    hpa_target: float | None = None  # in-flight requests per pod; None: 3/4 of limits.max_batch_size
    monitor_labels: dict[str, str] = field(default_factory=dict)  # labels a Prometheus selects PodMonitors by
    # (and PrometheusRules); the alerts' thresholds, None: specbuild.monitoring.alert_rules' defaults (the runtime's TTFT)
    min_acceptance: float | None = None
    ttft_p95_seconds: float | None = None
    # labels Grafana's dashboard sidecar selects ConfigMaps by (kube-prometheus-stack's default)
    dashboard_labels: dict[str, str] = field(default_factory=lambda: {"grafana_dashboard": "1"})
    startup_timeout_s: int = 1800  # engine load (a 70B target takes minutes)
    termination_grace_s: int = 120
    # specbuild's OpenAI-compatible API beside a GPU release's Triton (docker/Dockerfile.cpu builds this image)
    openai_image: str = CPU_IMAGE

    @property
    def autoscaler_ceiling(self) -> int:
        return self.max_replicas if self.max_replicas is not None else REPLICA_CEILING * self.replicas


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
        target = release.build_info.get("target")
        gpu = target.gpu if target is not None else None
        return cls(sum(path.stat().st_size for path in weights), gpu.name if gpu is not None else None)


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


def capture_mount() -> dict[str, Any]:
    """The serving container's mount of its pod's capture claim (read-write; the OpenAI API's container never
    gets it: it sends requests and reads nothing captured)."""
    return {"name": CAPTURE_VOLUME, "mountPath": CAPTURE_MOUNT}


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
    for what, name in (("PVC", options.pvc), ("storage class", options.capture_storage_class)):
        if name is not None and not _DNS_SUBDOMAIN.match(name):
            raise UsageError(f"{what} name {name!r} is not a valid Kubernetes name", f"use the {what}'s exact name")
    for what, value in (("HPA target", options.hpa_target), ("--cpu", options.cpu), ("--memory-gib", options.memory_gib)):
        if value is not None and value <= 0:
            raise UsageError(f"{what} must be positive, got {value}", "pass a value above 0")


def memory_gib(options: DeployOptions, weights_gib: float, gpus: int) -> int:
    if options.memory_gib is not None:
        return math.ceil(options.memory_gib)
    return math.ceil(options.shm_gib + weights_gib + SERVER_HOST_GIB + PER_GPU_HOST_GIB * gpus)
