"""Kubernetes manifests for a release, as plain dicts dumped to YAML.

Each replica's serving container is a :class:`PodPlan`, made from the release by the way its runtime serves:

* a runtime that launches a container (``tensorrt-llm``, ``tensorrt-llm-llmapi``): exactly the launch plan of
  :mod:`specbuild.serve.launch` (same ``tritonserver``/``mpirun`` argv, environment, ports, mount points and GPU
  count), so what ``specbuild serve --dry-run`` shows for one host is what each replica runs, on a node with the
  GPU the engines were built on (the build record's GPU name, as NVIDIA's GPU feature discovery labels nodes);
* the embedded ``torch`` runtime: ``specbuild serve`` in the CPU image (``docker/Dockerfile.cpu``), no GPU.

specbuild's OpenAI-compatible API comes with ``specbuild serve`` in the CPU image, and beside a ``tensorrt-llm``
release's container as a second container (``specbuild openai`` in the CPU image, on the pod's gRPC port); a
``tensorrt-llm-llmapi`` release has no orchestrator for it to call. Its port is on the Service.

Everything around the container is common to both: Deployment + Service, or KServe ``ServingRuntime`` +
``InferenceService`` (RawDeployment mode: several ports, no Knative, autoscaling handed to the HPA here); a
PodDisruptionBudget; a Prometheus Operator ``PodMonitor``; and a HorizontalPodAutoscaler on
``specbuild_requests_in_flight``, the gauge of requests being served that the model answering them exports (the
orchestrator; the LLM-API adapter for ``tensorrt-llm-llmapi``; the target engine's "active" count would
undercount: the orchestrator sends it one request per round), which the HPA reads through prometheus-adapter
with the rule :func:`adapter_rules` writes. Requests and limits count what a replica holds in host memory: the
in-memory ``/dev/shm`` (the python backend's tensors), the weights as they load (and, for the torch runtime, as
they run), and the server's own processes.

The release (the folders the launch plan mounts: engines + repository as ``specbuild compile`` wrote them, or,
for ``tensorrt-llm-llmapi``, the repository and the two checkpoint folders) reaches the pod either as a read-only
PersistentVolumeClaim holding those folders side by side, or through an init container that copies them out of
a release image (see ``docker/Dockerfile.release``) into an ``emptyDir``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from specbuild.build.runtimes import ROLES, runtime_for
from specbuild.errors import UsageError
from specbuild.serve.launch import (
    DEFAULT_SHM_GIB,
    LaunchPlan,
    api_port,
    apply_launch_settings,
    published_ports,
    release_plan,
)
from specbuild.speculation.stats import IN_FLIGHT
from specbuild.spec import BuildSpec

if TYPE_CHECKING:
    from specbuild.package.manifest import Release

IMAGE_USER_ID = 1000  # the non-root user of the NGC tritonserver images and of docker/Dockerfile.cpu
RELEASE_IMAGE_ROOT = "/release"  # where a release image holds the engines and repository folders
CPU_RELEASE_ROOT = "/release"  # where the CPU pod mounts the release folder (the repository, its engines beside)
CPU_IMAGE = "specbuild:cpu"  # docker/Dockerfile.cpu: push it to your registry and pass --image
HEALTH_READY = "/v2/health/ready"
HEALTH_LIVE = "/v2/health/live"
KSERVE_CONTAINER = "kserve-container"  # the name KServe requires for a runtime's serving container
KSERVE_ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels an InferenceService's pods with its name
GPU_RESOURCE = "nvidia.com/gpu"
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


def _check(options: DeployOptions) -> None:
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


def _labels(spec: BuildSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "specbuild", "app.kubernetes.io/instance": k8s_name(spec.name),
            "app.kubernetes.io/component": "triton"}


def _meta(spec: BuildSpec, options: DeployOptions, name: str | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name or k8s_name(spec.name), "namespace": options.namespace,
            "labels": {**_labels(spec), **(labels or {})}}


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


# --- the objects around it --------------------------------------------------------------------------------
def _volumes(options: DeployOptions) -> list[dict[str, Any]]:
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gib}Gi"}}
    if options.pvc is not None:
        release = {"name": "release", "persistentVolumeClaim": {"claimName": options.pvc, "readOnly": True}}
    else:
        release = {"name": "release", "emptyDir": {}}
    return [shm, release]


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _resources(pod: PodPlan) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{pod.cpu[0]:g}", "memory": f"{pod.memory_gib}Gi"}
    limits: dict[str, str] = {"cpu": f"{pod.cpu[1]:g}", "memory": f"{pod.memory_gib}Gi"}
    if pod.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(pod.gpus)
    return {"requests": requests, "limits": limits}


def _probes(options: DeployOptions, port: str | int) -> dict[str, Any]:
    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": failures}

    return {
        "startupProbe": probe(HEALTH_READY, 10, max(1, math.ceil(options.startup_timeout_s / 10))),
        "readinessProbe": probe(HEALTH_READY, 10, 3),
        "livenessProbe": probe(HEALTH_LIVE, 15, 4),
        # let the Service drop this pod from its endpoints before Triton gets SIGTERM and drains
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "15"]}}},
    }


def _container(pod: PodPlan, options: DeployOptions, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": pod.image,
        # args, not command: the image's entrypoint sets up its environment, then runs these
        "args": list(pod.args),
        "env": [{"name": key, "value": value} for key, value in pod.env.items()],
        "ports": [{"name": kind, "containerPort": port, "protocol": "TCP"} for kind, port in pod.ports.items()],
        "resources": _resources(pod),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *pod.volume_mounts],
        "securityContext": _container_security(),
        **_probes(options, "http"),
    }


def _openai_container(spec: BuildSpec, pod: PodPlan, options: DeployOptions, port: int) -> dict[str, Any]:
    """The OpenAI-compatible API (``specbuild openai``) beside Triton: it reads the release's tokenizer from the
    repository mount and calls the orchestrator on the pod's own gRPC port; ready when Triton's orchestrator is."""
    [repository] = [mount for mount in pod.volume_mounts if mount["mountPath"] == spec.triton.repository_mount]
    return {
        "name": "openai",
        "image": options.openai_image,
        "args": ["openai", spec.triton.repository_mount, "--triton", f"127.0.0.1:{pod.ports['grpc']}",
                 "--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "openai", "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
        "readinessProbe": {"httpGet": {"path": "/health/ready", "port": "openai"}, "periodSeconds": 10,
                           "timeoutSeconds": 5, "failureThreshold": 3},
        "volumeMounts": [repository],
        "securityContext": _container_security(),
    }


def _service_ports(pod: PodPlan) -> dict[str, int]:
    sidecar = {} if pod.openai_sidecar_port is None else {"openai": pod.openai_sidecar_port}
    return {**pod.ports, **sidecar}


def _scheduling(pod: PodPlan) -> dict[str, Any]:
    """Node selector and, for GPU pods, the toleration of the taint GPU nodes usually carry."""
    placement: dict[str, Any] = {"nodeSelector": pod.node_selector} if pod.node_selector else {}
    if pod.gpus:
        placement["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return placement


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": IMAGE_USER_ID, "runAsGroup": IMAGE_USER_ID,
            "fsGroup": IMAGE_USER_ID, "seccompProfile": {"type": "RuntimeDefault"}}


def deployment(spec: BuildSpec, options: DeployOptions, pod: PodPlan) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": options.termination_grace_s,
        "containers": [_container(pod, options, "triton")] + ([] if pod.openai_sidecar_port is None else [
            _openai_container(spec, pod, options, pod.openai_sidecar_port)]),
        "volumes": _volumes(options),
        **_scheduling(pod),
    }
    if options.release_image is not None:
        pod_spec["initContainers"] = [{
            "name": "fetch-release",
            "image": options.release_image,
            "command": ["cp", "-R", f"{RELEASE_IMAGE_ROOT}/.", "/mnt/release/"],
            "volumeMounts": [{"name": "release", "mountPath": "/mnt/release"}],
            "resources": {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
            "securityContext": _container_security(),
        }]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, options),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": _labels(spec)},
            # a new pod must be ready before an old one goes (needs a spare slot, GPUs included, to roll)
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": _labels(spec)}, "spec": pod_spec},
        },
    }


def service(spec: BuildSpec, options: DeployOptions, pod: PodPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, options),
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(spec),
            "ports": [{"name": kind, "port": port, "targetPort": kind, "protocol": "TCP"}
                      for kind, port in _service_ports(pod).items()],
        },
    }


def _hpa_target(spec: BuildSpec, options: DeployOptions) -> str:
    value = options.hpa_target if options.hpa_target is not None else max(1, math.ceil(spec.limits.max_batch_size * 3 / 4))
    return f"{value:g}"


def _max_replicas(options: DeployOptions) -> int:
    return options.max_replicas if options.max_replicas is not None else 4 * options.replicas


def autoscaler(spec: BuildSpec, options: DeployOptions, deployment_name: str) -> dict[str, Any]:
    """Scale ``deployment_name`` on the requests each pod is serving (needs :func:`adapter_rules`)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(spec, options),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment_name},
            "minReplicas": options.replicas,
            "maxReplicas": _max_replicas(options),
            "metrics": [{"type": "Pods", "pods": {"metric": {
                "name": IN_FLIGHT.name, "selector": {"matchLabels": {"model": runtime_for(spec.runtime).serving_model}}},
                "target": {"type": "AverageValue", "averageValue": _hpa_target(spec, options)}}}],
            # pods start slowly (engine load): add one at a time, remove slowly
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
                "scaleDown": {"stabilizationWindowSeconds": 600,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
            },
        },
    }


def disruption_budget(spec: BuildSpec, options: DeployOptions, pod_labels: dict[str, str]) -> dict[str, Any]:
    """Voluntary disruptions (node drains) take one replica at a time."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(spec, options),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels}}}


def pod_monitor(spec: BuildSpec, options: DeployOptions, pod_labels: dict[str, str]) -> dict[str, Any]:
    """Prometheus Operator scraping of every replica's metrics port (Triton's and the orchestrator's metrics)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(spec, options, labels=options.monitor_labels),
            "spec": {"selector": {"matchLabels": pod_labels},
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}}


def adapter_rules() -> dict[str, Any]:
    """prometheus-adapter's rule that serves ``specbuild_requests_in_flight`` to the HPA as a pods metric (the
    adapter's ``rules:`` config; in its Helm chart, ``rules.custom``). Averaged over a minute so one scrape does
    not decide."""
    return {"rules": [{
        "seriesQuery": f'{IN_FLIGHT.name}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{IN_FLIGHT.name}$", "as": IN_FLIGHT.name},
        "metricsQuery": "sum(avg_over_time(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)",
    }]}


def serving_runtime(spec: BuildSpec, options: DeployOptions, pod: PodPlan) -> dict[str, Any]:
    container = _container(pod, options, KSERVE_CONTAINER)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container[probe]["httpGet"]["port"] = pod.ports["http"]  # KServe's Service routes to the first port
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": _meta(spec, options, f"{k8s_name(spec.name)}-runtime"),
        "spec": {
            "supportedModelFormats": [{"name": "triton", "version": "2", "autoSelect": False}],
            "protocolVersions": ["v2", "grpc-v2"],
            "multiModel": False,
            "containers": [container],
            "volumes": _volumes(options),
            **_scheduling(pod),
        },
    }


def inference_service(spec: BuildSpec, options: DeployOptions) -> dict[str, Any]:
    meta = _meta(spec, options)
    # autoscaling set explicitly: KServe's default in RawDeployment is an HPA on CPU utilisation, which follows
    # neither GPU load nor queued requests; "external" leaves the predictor to the HPA written beside this
    meta["annotations"] = {"serving.kserve.io/deploymentMode": "RawDeployment",
                           "serving.kserve.io/autoscalerClass": "external"}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": {
            "minReplicas": options.replicas,
            "maxReplicas": _max_replicas(options),
            "securityContext": _pod_security(),
            "terminationGracePeriodSeconds": options.termination_grace_s,
            "model": {"modelFormat": {"name": "triton", "version": "2"},
                      "runtime": f"{k8s_name(spec.name)}-runtime", "protocolVersion": "v2"},
        }},
    }


def kserve_predictor(spec: BuildSpec) -> str:
    """The Deployment KServe creates for an InferenceService's predictor in RawDeployment mode."""
    return f"{k8s_name(spec.name)}-predictor"


def manifests(spec: BuildSpec, footprint: ReleaseFootprint, options: DeployOptions | None = None, *,
              kserve: bool = False) -> list[dict[str, Any]]:
    """The objects for one release (``spec``: the release's, launch settings applied): Deployment, Service, HPA,
    PodDisruptionBudget, PodMonitor; or KServe ServingRuntime + InferenceService, HPA, PodDisruptionBudget,
    PodMonitor."""
    options = options or DeployOptions()
    _check(options)
    if kserve and options.pvc is None:
        raise UsageError("the KServe variant mounts the release from a PVC; a release image is not supported there",
                         "pass --pvc CLAIM, or drop --kserve to use a Deployment with an init container")
    pod = pod_plan(spec, options, footprint)
    if kserve:
        pod_labels = {KSERVE_ISVC_LABEL: k8s_name(spec.name)}
        serving = [serving_runtime(spec, options, pod), inference_service(spec, options)]
        scaled = kserve_predictor(spec)
    else:
        pod_labels = _labels(spec)
        serving = [deployment(spec, options, pod), service(spec, options, pod)]
        scaled = k8s_name(spec.name)
    return [*serving, autoscaler(spec, options, scaled), disruption_budget(spec, options, pod_labels),
            pod_monitor(spec, options, pod_labels)]


def release_manifests(release: Release, overrides: dict[str, Any], options: DeployOptions, *,
                      kserve: bool = False) -> list[dict[str, Any]]:
    """:func:`manifests` of a compiled release, with ``overrides`` only where a launch may choose; a GPU release
    is also held to the launch layout it was compiled for (:mod:`specbuild.serve.launch`)."""
    from specbuild.serve.launch import check_compiled_layout, release_launch_spec

    if runtime_for(release.spec.runtime).container_launch:
        spec = release_launch_spec(release.spec, overrides)
        check_compiled_layout(release.repository, spec)
    else:
        spec = apply_launch_settings(release.spec, overrides)
    return manifests(spec, ReleaseFootprint.of(release), options, kserve=kserve)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


ADAPTER_RULES_FILE = "prometheus-adapter-rules.yaml"


def write_manifests(out_dir: str | Path, objects: list[dict[str, Any]]) -> list[Path]:
    """One ``<kind>.yaml`` per object in ``out_dir``, and the prometheus-adapter rule the HPA needs (not an object:
    it goes into the adapter's configuration); each file written whole or not at all."""
    from specbuild.build.atomic import atomic_write_text

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder", "choose another output folder, or - for stdout")
    rules = ("# prometheus-adapter rule for the HorizontalPodAutoscaler: add it to the adapter's config `rules:`\n"
             "# (Helm chart prometheus-community/prometheus-adapter: values `rules.custom`)\n"
             + yaml.safe_dump(adapter_rules(), sort_keys=False))
    return [*(atomic_write_text(out / f"{item['kind'].lower()}.yaml", yaml.safe_dump(item, sort_keys=False))
              for item in objects), atomic_write_text(out / ADAPTER_RULES_FILE, rules)]
