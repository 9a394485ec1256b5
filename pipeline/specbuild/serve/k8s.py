"""Kubernetes manifests for a release, as plain dicts dumped to YAML.

Each replica's serving container is a :class:`~specbuild.runtimes.pod_plans.PodPlan`, which the release's runtime
makes (:meth:`~specbuild.runtimes.interface.Runtime.pod_plan`):

* a runtime that launches a container (``tensorrt-llm``, ``tensorrt-llm-llmapi``): exactly its launch plan
  (the same ``tritonserver``/``mpirun`` argv, environment, ports, mount points and GPU
  count), so what ``specbuild serve --dry-run`` shows for one host is what each replica runs, on a node with the
  GPU the engines were built on (the build record's GPU name, as NVIDIA's GPU feature discovery labels nodes);
* the embedded ``torch`` runtime: ``specbuild serve`` in the CPU image (``docker/Dockerfile.cpu``), no GPU.

specbuild's OpenAI-compatible API comes with ``specbuild serve`` in the CPU image, and beside a ``tensorrt-llm``
release's container as a second container (``specbuild openai`` in the CPU image, on the pod's gRPC port); a
``tensorrt-llm-llmapi`` release has no orchestrator for it to call. Its port is on the Service.

Everything around the container is common to both: Deployment (a capturing release's: StatefulSet, below) + Service,
or KServe ``ServingRuntime`` + ``InferenceService`` (RawDeployment mode: several ports, no Knative, autoscaling
handed to the HPA here); a PodDisruptionBudget; a Prometheus Operator ``PodMonitor`` and ``PrometheusRule`` (the
release's recording and alerting rules); the Grafana dashboard in a ConfigMap for Grafana's sidecar; and a
HorizontalPodAutoscaler on ``specbuild_requests_in_flight``, the gauge of requests being served that the model
answering them exports (the orchestrator; the LLM-API adapter for ``tensorrt-llm-llmapi``; the target engine's
"active" count would undercount: the orchestrator sends it one request per round), which the HPA reads through
prometheus-adapter with the rule :func:`adapter_rules` writes. Requests and limits count what a replica holds in
host memory: the in-memory ``/dev/shm`` (the python backend's tensors), the weights as they load (and, for the torch
runtime, as they run), and the server's own processes.

The release (the folders the launch plan mounts: engines + repository as ``specbuild compile`` wrote them, or,
for ``tensorrt-llm-llmapi``, the repository and the two checkpoint folders) reaches the pod either as a read-only
PersistentVolumeClaim holding those folders side by side, or through an init container that copies them out of
a release image (see ``docker/Dockerfile.release``) into an ``emptyDir``.

A release packaged with ``capture.enabled`` writes each finished request to a store of its own per pod (one writer
per file), which must outlive the pod: the traffic is read later, by ``specbuild draft --from-capture``. A
Deployment cannot give each pod a claim of its own (its pods share one template's volumes), and a generic ephemeral
volume is deleted with its pod ("The volume's lifecycle is tied to the pod that defines it", core/v1
``Volume.ephemeral``), so a scale-down or a rollout would drop what was captured. Such a release is a StatefulSet:
its ``volumeClaimTemplates`` give pod ``<name>-<n>`` the claim ``capture-<name>-<n>``, labelled with the pods'
selector (kubernetes ``pkg/controller/statefulset/stateful_set_utils.go``, ``getPersistentVolumeClaimName`` and
``getPersistentVolumeClaims``), kept through rollouts, restarts and, with ``persistentVolumeClaimRetentionPolicy``
``Retain``, scale-downs and the set's deletion (apps/v1 ``StatefulSetPersistentVolumeClaimRetentionPolicy``: "The
default policy of Retain causes PVCs to not be affected by a scaledown"), and found again by the pod that comes
back with the same ordinal. KServe's RawDeployment makes a Deployment of the predictor (kserve
``pkg/controller/v1beta1/inferenceservice/reconcilers/deployment/deployment_reconciler.go``,
``createRawDefaultDeployment``), so a capturing release is refused there.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from specbuild.errors import UsageError
from specbuild.monitoring.dashboard import DASHBOARD_FILE
from specbuild.monitoring.promql import Scope
from specbuild.monitoring.alert_rules import release_thresholds, rule_groups
from specbuild.runtimes.pod_plans import CAPTURE_VOLUME, DeployOptions, PodPlan, ReleaseFootprint, check_options
from specbuild.runtimes.registry import runtime_for
from specbuild.serve.release_launch import release_launch_spec
from specbuild.spec import BuildSpec
from specbuild.speculation.stats import IN_FLIGHT

if TYPE_CHECKING:
    from specbuild.package.manifest import Release

IMAGE_USER_ID = 1000  # the non-root user of the NGC tritonserver images and of docker/Dockerfile.cpu
RELEASE_IMAGE_ROOT = "/release"  # where a release image holds the engines and repository folders
HEALTH_READY = "/v2/health/ready"
HEALTH_LIVE = "/v2/health/live"
KSERVE_CONTAINER = "kserve-container"  # the name KServe requires for a runtime's serving container
KSERVE_ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels an InferenceService's pods with its name
GPU_RESOURCE = "nvidia.com/gpu"


def k8s_name(name: str) -> str:
    """``spec.name`` as a DNS label (lowercase, ``-`` for other characters), valid for every kind here."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"specbuild-{label}".rstrip("-")
    return label[:63].rstrip("-")


def _labels(spec: BuildSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "specbuild", "app.kubernetes.io/instance": k8s_name(spec.name),
            "app.kubernetes.io/component": "triton"}


def _meta(spec: BuildSpec, options: DeployOptions, name: str | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name or k8s_name(spec.name), "namespace": options.namespace,
            "labels": {**_labels(spec), **(labels or {})}}


# --- the objects around the serving container ------------------------------------------------------------
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


def _pod_spec(spec: BuildSpec, options: DeployOptions, pod: PodPlan) -> dict[str, Any]:
    """A replica's pod: the serving container (and the OpenAI API's beside a GPU release's), the release's volumes
    (and the init container that fills them from a release image), security and placement."""
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
    return pod_spec


def deployment(spec: BuildSpec, options: DeployOptions, pod: PodPlan) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, options),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": _labels(spec)},
            # a new pod must be ready before an old one goes (needs a spare slot, GPUs included, to roll)
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": _labels(spec)}, "spec": _pod_spec(spec, options, pod)},
        },
    }


# --- a capturing release: a StatefulSet, a writable claim per pod (see the module notes) ---------------------
def capture_claim(spec: BuildSpec, options: DeployOptions) -> dict[str, Any]:
    """The claim template: one node's read-write volume of ``capture.claim_size`` per pod, of the cluster's default
    storage class unless one is named."""
    claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": spec.capture.claim_size}}}
    if options.capture_storage_class is not None:
        claim["storageClassName"] = options.capture_storage_class
    return {"metadata": {"name": CAPTURE_VOLUME}, "spec": claim}


def stateful_set(spec: BuildSpec, options: DeployOptions, pod: PodPlan) -> dict[str, Any]:
    """The pods of a capturing release (their pod plan mounts the claim and names the store to the server), each
    with its claim (:func:`capture_claim`), kept when pods or the set go.

    The kubelet gives a volume to the pod's ``fsGroup``, by default on every mount and down to each file, group
    read-write (kubernetes ``pkg/volume/volume_linux.go``: ``rwMask = 0660``); ``fsGroupChangePolicy:
    OnRootMismatch`` does it only while the volume's root is not yet the group's (a new claim), so the store (0700)
    and its files (0600) keep the owner-only modes their writer gives them, which it checks on every start."""
    pod_spec = _pod_spec(spec, options, pod)
    pod_spec["securityContext"]["fsGroupChangePolicy"] = "OnRootMismatch"
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(spec, options),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": _labels(spec)},
            # required before Kubernetes 1.32; the pods' own DNS names would need a headless Service, which nothing
            # here uses (clients reach the release through the Service)
            "serviceName": k8s_name(spec.name),
            # start (and stop) pods at once, not each after the one before is ready (an engine loads for minutes)
            "podManagementPolicy": "Parallel",
            # one pod at a time is replaced, without a surge: its claim goes to its successor
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "template": {"metadata": {"labels": _labels(spec)}, "spec": pod_spec},
            "volumeClaimTemplates": [capture_claim(spec, options)],
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


def autoscaler(spec: BuildSpec, options: DeployOptions, kind: str, name: str) -> dict[str, Any]:
    """Scale the ``kind`` (Deployment or StatefulSet) ``name`` on the requests each pod is serving (needs
    :func:`adapter_rules`)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(spec, options),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
            "minReplicas": options.replicas,
            "maxReplicas": options.autoscaler_ceiling,
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


def release_scope(spec: BuildSpec, options: DeployOptions) -> Scope:
    """The release's series as its PodMonitor's scrape job labels them: ``<namespace>/<PodMonitor name>``, the job
    name the Prometheus Operator gives a PodMonitor's targets (prometheus-operator pkg/prometheus/promcfg.go,
    generatePodMonitorConfig, v0.93.0)."""
    return Scope((f'namespace="{options.namespace}"', f'job="{options.namespace}/{k8s_name(spec.name)}"'))


def prometheus_rule(spec: BuildSpec, options: DeployOptions) -> dict[str, Any]:
    """The release's recording and alerting rules (:mod:`specbuild.monitoring.alert_rules`), for the Prometheus that selects
    the PodMonitor (the same labels)."""
    thresholds = release_thresholds(spec, min_acceptance=options.min_acceptance,
                                    ttft_p95_seconds=options.ttft_p95_seconds)
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(spec, options, labels=options.monitor_labels),
            "spec": {"groups": rule_groups(release_scope(spec, options), thresholds)}}


DASHBOARD_CONFIG_MAP = "specbuild-dashboard"  # one for every release of a namespace: the dashboard picks the release


def dashboard_config_map(spec: BuildSpec, options: DeployOptions) -> dict[str, Any]:
    """The Grafana dashboard (:mod:`specbuild.monitoring.dashboard`) for Grafana's dashboard sidecar, which loads
    the ConfigMaps carrying its label."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(spec, options, DASHBOARD_CONFIG_MAP, labels=options.dashboard_labels),
            "data": {"specbuild.json": DASHBOARD_FILE.read_text(encoding="utf-8")}}


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
            "maxReplicas": options.autoscaler_ceiling,
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
    """The objects for one release (``spec``: the release's, launch settings applied): Deployment (a capturing
    release: StatefulSet) and Service, or KServe ServingRuntime + InferenceService; then HPA, PodDisruptionBudget,
    PodMonitor, PrometheusRule and the dashboard's ConfigMap."""
    options = options or DeployOptions()
    check_options(options)
    if kserve and options.pvc is None:
        raise UsageError("the KServe variant mounts the release from a PVC; a release image is not supported there",
                         "pass --pvc CLAIM, or drop --kserve to use a Deployment with an init container")
    if options.capture_storage_class is not None and not spec.capture.enabled:
        raise UsageError(f"--capture-storage-class {options.capture_storage_class} names the class of capture claims, "
                         "but this release does not capture traffic (capture.enabled is false)",
                         "leave --capture-storage-class out, or package the release with capture.enabled: true")
    if kserve and spec.capture.enabled:
        raise UsageError("this release captures traffic (capture.enabled), which needs a writable claim per pod; "
                         "KServe's RawDeployment runs the predictor as a Deployment, whose pods share their volumes",
                         "drop --kserve (specbuild deploy then writes a StatefulSet with a claim per pod), or "
                         "package the release with capture.enabled: false")
    pod = runtime_for(spec.runtime).pod_plan(spec, options, footprint)
    if kserve:
        pod_labels = {KSERVE_ISVC_LABEL: k8s_name(spec.name)}
        serving = [serving_runtime(spec, options, pod), inference_service(spec, options)]
        scaled = ("Deployment", kserve_predictor(spec))
    else:
        pod_labels = _labels(spec)
        workload = (stateful_set if spec.capture.enabled else deployment)(spec, options, pod)
        serving = [workload, service(spec, options, pod)]
        scaled = (workload["kind"], workload["metadata"]["name"])
    return [*serving, autoscaler(spec, options, *scaled), disruption_budget(spec, options, pod_labels),
            pod_monitor(spec, options, pod_labels), prometheus_rule(spec, options),
            dashboard_config_map(spec, options)]


def release_manifests(release: Release, overrides: dict[str, Any], options: DeployOptions, *,
                      kserve: bool = False) -> list[dict[str, Any]]:
    """:func:`manifests` of a compiled release, with ``overrides`` only where a launch may choose, held to the
    launch layout it was compiled for (:mod:`specbuild.serve.release_launch`)."""
    spec = release_launch_spec(release.spec, overrides)
    runtime_for(spec.runtime).check_compiled_layout(release.repository, spec)
    return manifests(spec, ReleaseFootprint.of(release), options, kserve=kserve)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


ADAPTER_RULES_FILE = "prometheus-adapter-rules.yaml"


def write_manifests(out_dir: str | Path, objects: list[dict[str, Any]]) -> list[Path]:
    """One ``<kind>.yaml`` per object in ``out_dir``, and the prometheus-adapter rule the HPA needs (not an object:
    it goes into the adapter's configuration); each file written whole or not at all."""
    from specbuild.stages.atomic import atomic_write_text

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder", "choose another output folder, or - for stdout")
    rules = ("# prometheus-adapter rule for the HorizontalPodAutoscaler: add it to the adapter's config `rules:`\n"
             "# (Helm chart prometheus-community/prometheus-adapter: values `rules.custom`)\n"
             + yaml.safe_dump(adapter_rules(), sort_keys=False))
    return [*(atomic_write_text(out / f"{item['kind'].lower()}.yaml", yaml.safe_dump(item, sort_keys=False))
              for item in objects), atomic_write_text(out / ADAPTER_RULES_FILE, rules)]
