"""Kubernetes manifests for a release, as plain dicts dumped to YAML.

The pod runs exactly the launch plan of :mod:`specbuild.serve.launch` (same ``tritonserver``/``mpirun`` argv,
environment, ports, mount points and GPU count), so what ``specbuild serve --dry-run`` shows for one
host is what each replica runs. Two variants:

* Deployment + Service + HorizontalPodAutoscaler (``autoscaling/v2``, on a Prometheus pods metric served
  through an adapter such as prometheus-adapter; the default is the runtime's gauge of requests in flight:
  ``nv_trt_llm_request_metrics{model="target",request_type="active"}`` for engines,
  ``specbuild_requests_in_flight{model="llmapi_adapter"}`` for TensorRT-LLM's LLM API);
* KServe ``ServingRuntime`` + ``InferenceService`` (RawDeployment mode: Triton needs GPUs and several ports).

The release (the folders the launch plan mounts: engines + repository as ``specbuild compile`` wrote them, or,
for ``tensorrt-llm-llmapi``, the repository and the two checkpoint folders) reaches the pod either as a
read-only PersistentVolumeClaim holding those folders side by side, or through an init container that copies
them out of a release image (see ``docker/Dockerfile.release``) into an ``emptyDir``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specbuild.build.runtimes import ROLES, runtime_for
from specbuild.errors import UsageError
from specbuild.serve.launch import DEFAULT_SHM_GIB, LaunchPlan, release_plan
from specbuild.spec import BuildSpec

IMAGE_USER_ID = 1000  # the NGC tritonserver images' non-root "triton-server" user
RELEASE_IMAGE_ROOT = "/release"  # where a release image holds the engines and repository folders
HEALTH_READY = "/v2/health/ready"
HEALTH_LIVE = "/v2/health/live"
KSERVE_CONTAINER = "kserve-container"  # the name KServe requires for a runtime's serving container
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class DeployOptions:
    """How a release is deployed; every field has a default that suits one replica on one node."""

    namespace: str = "default"
    replicas: int = 1
    max_replicas: int | None = None  # None: 4 x replicas
    pvc: str | None = None  # claim holding <engines>/ and <repository>/ side by side
    release_image: str | None = None  # image with /release/<engines> and /release/<repository>
    shm_gib: int = DEFAULT_SHM_GIB
    hpa_metric: str | None = None  # a pods metric; None: the runtime's gauge of requests in flight
    hpa_target: float | None = None  # in-flight requests per pod; None: 3/4 of limits.max_batch_size
    startup_timeout_s: int = 1800  # engine load (a 70B target takes minutes)
    termination_grace_s: int = 120


def k8s_name(name: str) -> str:
    """``spec.name`` as a DNS label (lowercase, ``-`` for other characters), valid for every kind here."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"specbuild-{label}".rstrip("-")
    return label[:63].rstrip("-")


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
    if options.hpa_target is not None and options.hpa_target <= 0:
        raise UsageError(f"HPA target must be positive, got {options.hpa_target}", "pass a value above 0")


def _plan(spec: BuildSpec, options: DeployOptions) -> LaunchPlan:
    checkpoints = {role: getattr(spec, role).checkpoint for role in ROLES}
    return release_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir, checkpoints,
                        shm_gib=options.shm_gib)


def _labels(spec: BuildSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "specbuild", "app.kubernetes.io/instance": k8s_name(spec.name),
            "app.kubernetes.io/component": "triton"}


def _meta(spec: BuildSpec, options: DeployOptions, name: str | None = None) -> dict[str, Any]:
    return {"name": name or k8s_name(spec.name), "namespace": options.namespace, "labels": _labels(spec)}


def _volume_mounts(plan: LaunchPlan) -> list[dict[str, Any]]:
    """The launch plan's mounts, each folder found in the release volume by its name (as compile named it)."""
    names = [Path(mount.source).name for mount in plan.mounts]
    if len(set(names)) != len(names):
        raise UsageError(f"the release's folders {', '.join(m.source for m in plan.mounts)} must have different "
                         "names to sit side by side in one volume", "rename the folders (and package again)")
    return [{"name": "dshm", "mountPath": "/dev/shm"}] + [
        {"name": "release", "mountPath": mount.target, "subPath": name, "readOnly": mount.read_only}
        for mount, name in zip(plan.mounts, names)]


def _volumes(options: DeployOptions) -> list[dict[str, Any]]:
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gib}Gi"}}
    if options.pvc is not None:
        release = {"name": "release", "persistentVolumeClaim": {"claimName": options.pvc, "readOnly": True}}
    else:
        release = {"name": "release", "emptyDir": {}}
    return [shm, release]


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _triton_container(spec: BuildSpec, plan: LaunchPlan, name: str) -> dict[str, Any]:
    gpus = str(plan.gpu_count)
    return {
        "name": name,
        "image": plan.image,
        # args, not command: the NGC image's entrypoint sets up its environment, then runs these
        "args": list(plan.server_argv),
        "env": [{"name": key, "value": value} for key, value in plan.env.items()],
        "ports": [{"name": kind, "containerPort": port, "protocol": "TCP"} for kind, port in plan.ports.items()],
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": _volume_mounts(plan),
        "securityContext": _container_security(),
    }


def _probes(options: DeployOptions) -> dict[str, Any]:
    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": failures}

    return {
        "startupProbe": probe(HEALTH_READY, 10, max(1, math.ceil(options.startup_timeout_s / 10))),
        "readinessProbe": probe(HEALTH_READY, 10, 3),
        "livenessProbe": probe(HEALTH_LIVE, 15, 4),
        # let the Service drop this pod from its endpoints before Triton gets SIGTERM and drains
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "15"]}}},
    }


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": IMAGE_USER_ID, "runAsGroup": IMAGE_USER_ID,
            "fsGroup": IMAGE_USER_ID, "seccompProfile": {"type": "RuntimeDefault"}}


def deployment(spec: BuildSpec, options: DeployOptions, plan: LaunchPlan) -> dict[str, Any]:
    container = {**_triton_container(spec, plan, "triton"), **_probes(options)}
    pod: dict[str, Any] = {
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": options.termination_grace_s,
        "containers": [container],
        "volumes": _volumes(options),
    }
    if options.release_image is not None:
        pod["initContainers"] = [{
            "name": "fetch-release",
            "image": options.release_image,
            "command": ["cp", "-R", f"{RELEASE_IMAGE_ROOT}/.", "/mnt/release/"],
            "volumeMounts": [{"name": "release", "mountPath": "/mnt/release"}],
            "securityContext": _container_security(),
        }]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, options),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": _labels(spec)},
            # a new pod must be ready before an old one goes (needs a spare GPU slot to roll)
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": _labels(spec),
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(plan.ports["metrics"]),
                                    "prometheus.io/path": "/metrics"},
                },
                "spec": pod,
            },
        },
    }


def service(spec: BuildSpec, options: DeployOptions, plan: LaunchPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, options),
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(spec),
            "ports": [{"name": kind, "port": port, "targetPort": kind, "protocol": "TCP"}
                      for kind, port in plan.ports.items()],
        },
    }


def _hpa_target(spec: BuildSpec, options: DeployOptions) -> str:
    value = options.hpa_target if options.hpa_target is not None else max(1, math.ceil(spec.limits.max_batch_size * 3 / 4))
    return f"{value:g}"


def autoscaler(spec: BuildSpec, options: DeployOptions) -> dict[str, Any]:
    metric: dict[str, Any] = {"name": options.hpa_metric}
    inflight = runtime_for(spec.runtime).inflight_metric
    if options.hpa_metric is None and inflight is not None:  # every container runtime names its gauge
        metric = {"name": inflight[0], "selector": {"matchLabels": dict(inflight[1])}}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(spec, options),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": k8s_name(spec.name)},
            "minReplicas": options.replicas,
            "maxReplicas": _max_replicas(options),
            "metrics": [{"type": "Pods", "pods": {"metric": metric, "target": {
                "type": "AverageValue", "averageValue": _hpa_target(spec, options)}}}],
            # GPU pods start slowly: add one at a time, remove slowly
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
                "scaleDown": {"stabilizationWindowSeconds": 600,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
            },
        },
    }


def _max_replicas(options: DeployOptions) -> int:
    return options.max_replicas if options.max_replicas is not None else 4 * options.replicas


def serving_runtime(spec: BuildSpec, options: DeployOptions, plan: LaunchPlan) -> dict[str, Any]:
    container = {**_triton_container(spec, plan, KSERVE_CONTAINER), **_probes(options)}
    # KServe routes to the first port; gRPC and metrics stay reachable on the pod
    container["ports"] = [{"containerPort": plan.ports["http"], "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container[probe]["httpGet"]["port"] = plan.ports["http"]
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
        },
    }


def inference_service(spec: BuildSpec, options: DeployOptions) -> dict[str, Any]:
    meta = _meta(spec, options)
    meta["annotations"] = {"serving.kserve.io/deploymentMode": "RawDeployment"}
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


def manifests(spec: BuildSpec, options: DeployOptions | None = None, *, kserve: bool = False) -> list[dict[str, Any]]:
    """The objects for one release (``spec``: the release's, see :func:`specbuild.serve.launch.release_launch_spec`):
    Deployment, Service, HPA; or KServe ServingRuntime + InferenceService."""
    options = options or DeployOptions()
    _check(options)
    if kserve and options.pvc is None:
        raise UsageError("the KServe variant mounts the release from a PVC; a release image is not supported there",
                         "pass --pvc CLAIM, or drop --kserve to use a Deployment with an init container")
    plan = _plan(spec, options)
    if kserve:
        return [serving_runtime(spec, options, plan), inference_service(spec, options)]
    return [deployment(spec, options, plan), service(spec, options, plan), autoscaler(spec, options)]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def write_manifests(out_dir: str | Path, objects: list[dict[str, Any]]) -> list[Path]:
    """One ``<kind>.yaml`` per object in ``out_dir``, each written whole or not at all."""
    from specbuild.build.atomic import atomic_write_text

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder", "choose another --k8s folder")
    return [atomic_write_text(out / f"{item['kind'].lower()}.yaml", yaml.safe_dump(item, sort_keys=False))
            for item in objects]
