"""Kubernetes manifests: schema-valid for a pinned Kubernetes version (core kinds) and for the KServe and
Prometheus Operator CRDs (custom resources), consistent with the launch plan, sized for the release."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from k8s_objects import FOOTPRINT, H100, K8S_VERSION, by_kind, gpu_spec, validate
from specbuild.cli import main
from specbuild.package.contract import ENSEMBLE_MODEL
from specbuild.errors import UsageError
from specbuild.serve.k8s import ADAPTER_RULES_FILE, adapter_rules, k8s_name, manifests, to_yaml, write_manifests
from specbuild.runtimes.pod_plans import POD_CAPTURE_STORE, DeployOptions, ReleaseFootprint
from specbuild.runtimes.tensorrt_llm.launch import launch_plan
from specbuild.runtimes.trtllm_image import gpu_label_value
from specbuild.spec import CaptureSpec

MONITORING_KINDS = ["PodMonitor", "PrometheusRule", "ConfigMap"]
OPTION_SETS = [
    ({}, DeployOptions(pvc="release")),
    ({}, DeployOptions(release_image="registry.example/demo-release:1", replicas=3, namespace="llm")),
    ({"launch": {"fast_logits": True}}, DeployOptions(pvc="release", max_replicas=2, cpu=12, memory_gib=96)),
    ({"target": {"checkpoint": "/ckpt/target", "pp_size": 2}, "launch": {"mode": "leader", "placement": "separate"}},
     DeployOptions(pvc="release", hpa_target=5, monitor_labels={"release": "prometheus"})),
    ({"runtime": "torch"}, DeployOptions(pvc="release", image="registry.example/specbuild:cpu")),
    ({"runtime": "torch", "torch": {"target_threads": 6, "draft_threads": 2}}, DeployOptions(release_image="r/x:1")),
]


@pytest.mark.parametrize("kserve", [False, True])
@pytest.mark.parametrize(("spec", "options"), OPTION_SETS)
def test_every_object_validates_strictly(spec, options, kserve):
    if kserve and options.pvc is None:
        return  # refused: test_option_errors
    objects = manifests(gpu_spec(**spec), FOOTPRINT, options, kserve=kserve)
    expected = ["ServingRuntime", "InferenceService"] if kserve else ["Deployment", "Service"]
    assert [obj["kind"] for obj in objects] == [*expected, "HorizontalPodAutoscaler", "PodDisruptionBudget",
                                                *MONITORING_KINDS]
    for obj in objects:
        validate(obj)
    # and the YAML dump reads back to the same objects
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.parametrize("kind", ["Deployment", "ServingRuntime", "InferenceService", "PodMonitor",
                                  "PrometheusRule"])
def test_validators_reject_a_misspelled_field(kind):
    """Control: the schema checks used above can fail, for core kinds and custom resources alike."""
    objects = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release"), kserve=kind != "Deployment")
                      + manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release")))
    obj = objects[kind]
    spec = obj["spec"]
    target = {"Deployment": lambda: spec["template"]["spec"]["containers"][0], "ServingRuntime":
              lambda: spec["containers"][0], "InferenceService": lambda: spec["predictor"],
              "PodMonitor": lambda: spec["podMetricsEndpoints"][0],
              "PrometheusRule": lambda: spec["groups"][1]["rules"][0]}[kind]()
    target["readinesProbe"] = {}
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(obj)


def test_deployment_runs_the_launch_plan():
    spec = gpu_spec()
    options = DeployOptions(pvc="release", replicas=2)
    plan = launch_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir)
    objects = by_kind(manifests(spec, FOOTPRINT, options))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    container, _openai = pod["containers"]
    assert container["image"] == spec.triton.image
    assert tuple(container["args"]) == plan.server_argv
    assert {item["name"]: item["value"] for item in container["env"]} == plan.env == {
        "TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(plan.gpu_count) == "2"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == plan.ports
    assert {f"--{kind}-port={port}" for kind, port in plan.ports.items()} <= set(container["args"])
    # mounts: read-only at the launch plan's mount points, from the release's folder names
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert {m.target for m in plan.mounts} <= set(mounts)
    assert mounts["/engines"] == {"name": "release", "mountPath": "/engines", "subPath": "engines", "readOnly": True}
    assert mounts["/triton_repo"]["subPath"] == "triton_repo" and mounts["/triton_repo"]["readOnly"]
    assert f"--model-repository={spec.triton.repository_mount}" in container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["release"]["persistentVolumeClaim"] == {"claimName": "release", "readOnly": True}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert mounts["/dev/shm"]["name"] == "dshm"


def test_probes_termination_and_security():
    deployment = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release")))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "15"]
    assert pod["terminationGracePeriodSeconds"] > 15
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_openai_api_runs_beside_triton_with_its_port_and_probe():
    spec = gpu_spec()
    plan = launch_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir)
    pod = by_kind(manifests(spec, FOOTPRINT, DeployOptions(pvc="release")))["Deployment"]["spec"]["template"]["spec"]
    triton, api = pod["containers"]
    assert api["image"] == "specbuild:cpu" and api["args"][:2] == ["openai", spec.triton.repository_mount]
    assert api["args"][api["args"].index("--triton") + 1] == f"127.0.0.1:{plan.ports['grpc']}"
    assert api["ports"] == [{"name": "openai", "containerPort": plan.openai_port, "protocol": "TCP"}]
    assert api["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "openai"}
    [mount] = api["volumeMounts"]  # the repository only (the tokenizer and the models' parameters), read-only
    assert mount["mountPath"] == spec.triton.repository_mount and mount["readOnly"]


def test_init_container_copies_the_release_image():
    pod = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(release_image="reg/rel:1")))["Deployment"]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["image"] == "reg/rel:1"
    assert init["command"] == ["cp", "-R", "/release/.", "/mnt/release/"]
    assert {v["name"]: v for v in pod["volumes"]}["release"] == {"name": "release", "emptyDir": {}}


def test_service_hpa_budget_and_monitor_agree_with_the_deployment():
    objects = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release", replicas=2,
                                                                      monitor_labels={"release": "prom"})))
    deployment, svc, hpa = objects["Deployment"], objects["Service"], objects["HorizontalPodAutoscaler"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == pod_labels
    container_ports = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == container_ports == {"http", "grpc", "metrics", "openai"}
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    [metric] = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"] == {"name": "specbuild_requests_in_flight",  # the orchestrator's gauge
                                        "selector": {"matchLabels": {"model": "orchestrator"}}}
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "6"}  # 3/4 of max_batch_size 8
    assert deployment["metadata"]["name"] == "demo-pair"
    budget, monitor = objects["PodDisruptionBudget"], objects["PodMonitor"]
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels}}
    assert monitor["spec"]["selector"] == {"matchLabels": pod_labels}
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["labels"]["release"] == "prom"  # what the Prometheus selects monitors by


def test_the_adapter_rule_serves_the_hpa_metric():
    from specbuild.speculation.stats import IN_FLIGHT, METRICS

    assert IN_FLIGHT in METRICS and IN_FLIGHT.kind == "gauge"  # exported by the orchestrator
    [rule] = adapter_rules()["rules"]
    assert rule["seriesQuery"].startswith(IN_FLIGHT.name + "{")
    assert rule["name"]["as"] == IN_FLIGHT.name
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}  # a pods metric, as the HPA asks
    assert "<<.Series>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_gpu_pod_resources_count_shm_engines_and_server():
    container = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release")))["Deployment"][
        "spec"]["template"]["spec"]["containers"][0]
    # 2 GiB /dev/shm + 7 GiB (and a byte) of engines + 2 GiB server + 1 GiB for each of the 2 GPU processes
    assert container["resources"] == {
        "requests": {"cpu": "4", "memory": "14Gi", "nvidia.com/gpu": "2"},
        "limits": {"cpu": "8", "memory": "14Gi", "nvidia.com/gpu": "2"}}
    sized = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release", cpu=3, memory_gib=40.5)))
    assert sized["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "3", "memory": "41Gi", "nvidia.com/gpu": "2"}


def test_gpu_pods_go_to_the_gpu_the_engines_were_built_on():
    pod = by_kind(manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release")))["Deployment"]["spec"][
        "template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    unrecorded = manifests(gpu_spec(), ReleaseFootprint(0, None), DeployOptions(pvc="release"))[0]
    assert "nodeSelector" not in unrecorded["spec"]["template"]["spec"]


@pytest.mark.parametrize(("name", "label"), [(H100, "NVIDIA-H100-80GB-HBM3"), ("Tesla T4", "Tesla-T4"),
                                             ("NVIDIA A100-SXM4-80GB (MIG 1g.10gb)", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),
                                             ("x" * 70, "x" * 63)])
def test_gpu_label_values(name, label):
    assert gpu_label_value(name) == label


def test_a_torch_release_runs_specbuild_serve_on_cpus():
    spec = gpu_spec(runtime="torch", torch={"target_threads": 6, "draft_threads": 2})
    footprint = ReleaseFootprint(weight_bytes=4 * 2**30, gpu=None)
    objects = by_kind(manifests(spec, footprint, DeployOptions(pvc="release")))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "specbuild:cpu"  # docker/Dockerfile.cpu (entrypoint: specbuild)
    assert container["args"] == ["serve", "/release/triton_repo", "--host", "0.0.0.0", "--http-port=8000",
                                 "--grpc-port=8001", "--metrics-port=8002", "--openai-port=9000", "--timeout=1800"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["openai"] == 9000  # serve runs the API too
    # 6 + 2 engine threads and a core for the rest; requests = limits; memory: 2 shm + 4 x 1.25 weights + 2 server
    assert container["resources"] == {"requests": {"cpu": "9", "memory": "9Gi"},
                                      "limits": {"cpu": "9", "memory": "9Gi"}}
    # the whole release volume: the repository reads its engines' weights beside it
    assert {m["mountPath"]: m for m in container["volumeMounts"]}["/release"] == {
        "name": "release", "mountPath": "/release", "readOnly": True}
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert objects["Service"]["spec"]["ports"][0] == {"name": "http", "port": 8000, "targetPort": "http",
                                                      "protocol": "TCP"}


def test_kserve_structure():
    spec = gpu_spec()
    runtime, isvc, hpa, budget, monitor, _, _ = manifests(spec, FOOTPRINT, DeployOptions(pvc="release", replicas=2),
                                                          kserve=True)
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and runtime["kind"] == "ServingRuntime"
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    rspec = runtime["spec"]
    assert {"name": "triton", "version": "2", "autoSelect": False} in rspec["supportedModelFormats"]
    assert set(rspec["protocolVersions"]) == {"v2", "grpc-v2"}
    [container] = rspec["containers"]
    assert container["name"] == "kserve-container"
    plan = launch_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir)
    assert tuple(container["args"]) == plan.server_argv
    # HTTP first (KServe's Service routes its port 80 there), then gRPC and metrics, named for the PodMonitor
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == list(plan.ports.items())
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": plan.ports["http"]}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", "/engines", "/triton_repo"}
    assert {v["name"] for v in rspec["volumes"]} == {m["name"] for m in container["volumeMounts"]}
    assert rspec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    predictor = isvc["spec"]["predictor"]
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"]
    assert predictor["model"]["modelFormat"]["name"] in {f["name"] for f in rspec["supportedModelFormats"]}
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 8)
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    # autoscaling set explicitly: no CPU HPA from KServe; ours scales the predictor Deployment KServe creates
    assert annotations["serving.kserve.io/autoscalerClass"] == "external"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "demo-pair-predictor"
    pods = {"serving.kserve.io/inferenceservice": "demo-pair"}
    assert budget["spec"]["selector"]["matchLabels"] == monitor["spec"]["selector"]["matchLabels"] == pods
    # the pod-level fields KServe inlines in the predictor are valid core PodSpec fields
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [container], "volumes": rspec["volumes"],
                    **{k: predictor[k] for k in ("securityContext", "terminationGracePeriodSeconds")}}}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_option_errors():
    spec = gpu_spec()
    with pytest.raises(UsageError, match="exactly one source"):
        manifests(spec, FOOTPRINT, DeployOptions())
    with pytest.raises(UsageError, match="exactly one source"):
        manifests(spec, FOOTPRINT, DeployOptions(pvc="a", release_image="b"))
    with pytest.raises(UsageError, match="KServe variant mounts the release from a PVC"):
        manifests(spec, FOOTPRINT, DeployOptions(release_image="b"), kserve=True)
    with pytest.raises(UsageError, match="namespace"):
        manifests(spec, FOOTPRINT, DeployOptions(pvc="a", namespace="Bad_NS"))
    with pytest.raises(UsageError, match="max replicas"):
        manifests(spec, FOOTPRINT, DeployOptions(pvc="a", replicas=3, max_replicas=2))


@pytest.mark.parametrize(("name", "label"), [("demo", "demo"), ("Demo_Pair.v2", "demo-pair-v2"),
                                             ("7b-pair", "specbuild-7b-pair"), ("x" * 64, "x" * 63)])
def test_k8s_name(name, label):
    assert k8s_name(name) == label


def test_only_rank0_loads_the_ensemble():
    """Clients reach the release through ``ensemble`` on rank 0; worker ranks load the engine models only."""
    leader = gpu_spec(target={"checkpoint": "/ckpt/target", "pp_size": 2}, launch={"mode": "leader"})
    deployment = manifests(leader, FOOTPRINT, DeployOptions(pvc="release"))[0]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    loaded = {arg.split("=", 1)[1] for arg in args if arg.startswith("--load-model=")}
    assert loaded == {"target", "draft"} and ENSEMBLE_MODEL not in loaded
    assert args.count("--model-control-mode=explicit") == 1  # rank 1 of 2; rank 0 loads the whole repository


def test_deploy_command_writes_the_release_s_manifests(gpu_release, tmp_path):
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "--k8s", str(out), "--pvc", "release",
                                       "--replicas", "2", "--namespace", "llm"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "configmap.yaml", "deployment.yaml", "horizontalpodautoscaler.yaml", "poddisruptionbudget.yaml",
        "podmonitor.yaml", ADAPTER_RULES_FILE, "prometheusrule.yaml", "service.yaml"]
    deployment = yaml.safe_load((out / "deployment.yaml").read_text())
    assert deployment["metadata"]["namespace"] == "llm" and deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"  # the release's tp 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # its build record
    assert yaml.safe_load((out / ADAPTER_RULES_FILE).read_text()) == adapter_rules()
    for path in out.glob("*.yaml"):
        if path.name != ADAPTER_RULES_FILE:
            validate(yaml.safe_load(path.read_text()))

    kserve = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "-o", str(tmp_path / "ks"),
                                       "--pvc", "release", "--kserve"])
    assert kserve.exit_code == 0, kserve.output
    assert sorted(p.name for p in (tmp_path / "ks").iterdir()) == [
        "configmap.yaml", "horizontalpodautoscaler.yaml", "inferenceservice.yaml", "poddisruptionbudget.yaml",
        "podmonitor.yaml", ADAPTER_RULES_FILE, "prometheusrule.yaml", "servingruntime.yaml"]


def test_deploy_to_stdout_for_kubectl_apply(gpu_release, tmp_path):
    result = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "-o", "-", "--pvc", "release"])
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all(result.stdout))
    assert [obj["kind"] for obj in objects] == ["Deployment", "Service", "HorizontalPodAutoscaler",
                                                "PodDisruptionBudget", *MONITORING_KINDS]
    as_json = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "-o", "-", "--pvc", "release",
                                        "--json"])
    listed = json.loads(as_json.stdout)
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List" and listed["items"] == objects
    files = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "-o", str(tmp_path / "k"), "--pvc",
                                      "release", "--json"])
    assert json.loads(files.stdout)["kinds"] == [obj["kind"] for obj in objects]


def test_deploy_of_a_torch_release_writes_cpu_manifests(checkpoints, tmp_path):
    from served_tiny import compile_release

    release = compile_release(checkpoints, tmp_path / "release")
    result = CliRunner().invoke(main, ["deploy", str(release.repository), "-o", "-", "--pvc", "release",
                                       "--image", "registry.example/specbuild:cpu", "--set", "triton.http_port=9100"])
    assert result.exit_code == 0, result.output
    objects = by_kind(list(yaml.safe_load_all(result.stdout)))
    [container] = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/specbuild:cpu"
    assert container["args"][:2] == ["serve", "/release/triton_repo"] and "--http-port=9100" in container["args"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    for obj in objects.values():
        validate(obj)
    refused = CliRunner().invoke(main, ["deploy", str(release.repository), "-o", "-", "--pvc", "release",
                                        "--set", "limits.max_batch_size=64"])
    assert refused.exit_code == 2 and "compiled with limits.max_batch_size" in refused.output


def test_deploy_refuses_a_layout_the_release_was_not_compiled_for(gpu_release, tmp_path):
    result = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "--k8s", str(tmp_path / "k8s"),
                                       "--pvc", "release", "--set", "launch.mode=leader"])
    assert result.exit_code == 2 and "compiled with launch.mode='auto'" in result.output
    assert "--set launch.mode=leader" in result.output and not (tmp_path / "k8s").exists()


def test_deploy_command_reports_errors_without_traceback(gpu_release, tmp_path):
    result = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "--k8s", str(tmp_path / "k8s")])
    assert result.exit_code == 2 and "exactly one source" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "k8s").exists()


def test_write_manifests_refuses_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        write_manifests(target, manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="r")))


# --- a capturing release: a StatefulSet, a writable claim per pod -------------------------------------------
CAPTURING = {"capture": {"enabled": True, "claim_size": "50Gi"}}


def _pod_and_mounts(workload: dict) -> tuple[dict, dict]:
    pod = workload["spec"]["template"]["spec"]
    return pod, {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}


@pytest.mark.parametrize(("spec", "options"), [
    (CAPTURING, DeployOptions(pvc="release", replicas=2)),
    (CAPTURING, DeployOptions(release_image="reg/rel:1", capture_storage_class="fast-ssd")),
    ({"runtime": "torch", **CAPTURING}, DeployOptions(pvc="release")),
])
def test_a_capturing_release_is_a_stateful_set_whose_pods_each_write_their_own_claim(spec, options):
    objects = manifests(gpu_spec(**spec), FOOTPRINT, options)
    assert [obj["kind"] for obj in objects] == ["StatefulSet", "Service", "HorizontalPodAutoscaler",
                                                "PodDisruptionBudget", *MONITORING_KINDS]
    for obj in objects:
        validate(obj)
    workload = objects[0]["spec"]
    [template] = workload["volumeClaimTemplates"]
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}}}
    if options.capture_storage_class is not None:
        claim["storageClassName"] = options.capture_storage_class
    assert template == {"metadata": {"name": "capture"}, "spec": claim}
    # the claims outlive pods, scale-downs and the set: what was captured is read later
    assert workload["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert workload["podManagementPolicy"] == "Parallel" and workload["replicas"] == options.replicas
    pod, mounts = _pod_and_mounts(objects[0])
    serving = pod["containers"][0]
    # the claim read-write at /capture; the store a folder of it (its root is the fsGroup's, group-writable), named
    # to the orchestrator in its environment, or to `specbuild serve` (which sets that) by --capture-dir
    assert mounts["/capture"] == {"name": "capture", "mountPath": "/capture"}
    if spec.get("runtime") == "torch":
        assert serving["args"][-1] == "--capture-dir=/capture/store" and serving["env"] == []
    else:
        assert {"name": "SPECBUILD_CAPTURE_DIR", "value": "/capture/store"} in serving["env"]
    # the claim is the template's (the controller adds the pod's volume), the release's own stays read-only
    assert "capture" not in {volume["name"] for volume in pod["volumes"]}
    assert all(mount["readOnly"] for mount in serving["volumeMounts"] if mount["name"] == "release")
    if options.pvc is not None:
        assert {v["name"]: v for v in pod["volumes"]}["release"]["persistentVolumeClaim"]["readOnly"] is True
    else:
        assert pod["initContainers"][0]["volumeMounts"] == [{"name": "release", "mountPath": "/mnt/release"}]
    # only the serving container sees the capture (the OpenAI API's beside a GPU release's Triton does not)
    for container in pod["containers"][1:]:
        assert "capture" not in {mount["name"] for mount in container["volumeMounts"]}
        assert "env" not in container
    # non-root writes it; the kubelet re-permissions the files (group read-write) only on a new claim
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == security["fsGroup"] == 1000
    assert security["fsGroupChangePolicy"] == "OnRootMismatch"


def test_the_pod_s_store_is_a_folder_of_its_claim_which_the_kubelet_leaves_group_writable(tmp_path):
    """The store's own checks (the real ones) refuse the claim's root as the kubelet leaves it for the fsGroup (setgid,
    group read-write), and take the folder the server makes in it, its owner's alone."""
    from specbuild.capture.store import CAPTURE_MOUNT, CaptureStoreError, open_store

    claim = tmp_path / "claim"
    claim.mkdir()
    claim.chmod(0o2775)
    with pytest.raises(CaptureStoreError, match="writable by others"):
        open_store(claim)
    store = open_store(claim / Path(POD_CAPTURE_STORE).relative_to(CAPTURE_MOUNT))
    assert store.parent == claim and stat.S_IMODE(store.stat().st_mode) & 0o077 == 0


def test_a_capturing_torch_pod_names_its_store_to_serve_as_serve_reads_it():
    [container] = manifests(gpu_spec(runtime="torch", **CAPTURING), FOOTPRINT, DeployOptions(pvc="release"))[0][
        "spec"]["template"]["spec"]["containers"]
    context = main.get_command(None, "serve").make_context("serve", list(container["args"][1:]))
    assert context.params["capture_dir"] == POD_CAPTURE_STORE


def test_the_stateful_set_validator_rejects_a_misspelled_claim_field():
    """Control: the strict schema reaches into the claim template and the retention policy."""
    for broken in (lambda spec: spec["volumeClaimTemplates"][0]["spec"].update(accessMode=["ReadWriteOnce"]),
                   lambda spec: spec["persistentVolumeClaimRetentionPolicy"].update(whenScaledDown="Retain")):
        workload = manifests(gpu_spec(**CAPTURING), FOOTPRINT, DeployOptions(pvc="release"))[0]
        broken(workload["spec"])
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(workload)


def test_the_service_autoscaler_budget_and_monitor_point_at_the_stateful_set():
    objects = by_kind(manifests(gpu_spec(**CAPTURING), FOOTPRINT, DeployOptions(pvc="release", replicas=2)))
    workload, svc, hpa = objects["StatefulSet"], objects["Service"], objects["HorizontalPodAutoscaler"]
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    assert workload["spec"]["selector"]["matchLabels"] == pod_labels  # the claims get these labels too
    assert workload["spec"]["serviceName"] == svc["metadata"]["name"]
    # which clusters before 1.32 require (their schema, strict, as kubernetes-validate ships it)
    kubernetes_validate.validate(workload, "1.29", strict=True)
    assert svc["spec"]["selector"] == pod_labels
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": workload["metadata"]["name"]}
    assert objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == pod_labels
    assert objects["PodMonitor"]["spec"]["selector"]["matchLabels"] == pod_labels
    # the rules read the PodMonitor's job, which is the release's name whichever workload runs the pods
    assert objects["PodMonitor"]["metadata"]["name"] == workload["metadata"]["name"]


def test_a_release_that_does_not_capture_renders_as_before():
    """The capture section's other settings change nothing while capture is off: a Deployment, as always."""
    plain = manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release"))
    assert manifests(gpu_spec(capture={"enabled": False, "claim_size": "1Ti"}), FOOTPRINT,
                     DeployOptions(pvc="release")) == plain
    for spec in (gpu_spec(), gpu_spec(runtime="torch")):
        pod, mounts = _pod_and_mounts(manifests(spec, FOOTPRINT, DeployOptions(pvc="release"))[0])
        assert "/capture" not in mounts and "fsGroupChangePolicy" not in pod["securityContext"]
        serving = pod["containers"][0]
        assert "SPECBUILD_CAPTURE_DIR" not in {item["name"] for item in serving["env"]}
        assert not [arg for arg in serving["args"] if arg.startswith("--capture-dir")]
    assert plain[0]["kind"] == "Deployment"


def test_a_capturing_release_is_refused_where_pods_cannot_each_have_a_claim():
    with pytest.raises(UsageError, match="RawDeployment runs the predictor as a Deployment") as refused:
        manifests(gpu_spec(**CAPTURING), FOOTPRINT, DeployOptions(pvc="release"), kserve=True)
    assert "drop --kserve" in refused.value.fix
    with pytest.raises(UsageError, match="does not capture traffic") as unused:
        manifests(gpu_spec(), FOOTPRINT, DeployOptions(pvc="release", capture_storage_class="fast"))
    assert "capture.enabled: true" in unused.value.fix
    with pytest.raises(UsageError, match="storage class name 'Fast_SSD' is not a valid Kubernetes name"):
        manifests(gpu_spec(**CAPTURING), FOOTPRINT, DeployOptions(pvc="release", capture_storage_class="Fast_SSD"))


def test_deploy_writes_a_capturing_release_s_stateful_set(checkpoints, tmp_path):
    from checkpoint_factory import package_gpu_release

    release = package_gpu_release(checkpoints, tmp_path / "release", {"capture.enabled": True}, gpu=H100)
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, ["deploy", str(release.repository), "--k8s", str(out), "--pvc", "release",
                                       "--capture-storage-class", "fast-ssd"])
    assert result.exit_code == 0, result.output
    assert "statefulset.yaml" in {p.name for p in out.iterdir()} and not (out / "deployment.yaml").exists()
    workload = yaml.safe_load((out / "statefulset.yaml").read_text())
    [claim] = workload["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == CaptureSpec().claim_size  # the default
    for path in out.glob("*.yaml"):
        if path.name != ADAPTER_RULES_FILE:
            validate(yaml.safe_load(path.read_text()))
    refused = CliRunner().invoke(main, ["deploy", str(release.repository), "-o", "-", "--pvc", "release", "--kserve"])
    assert refused.exit_code == 2 and "--kserve" in refused.output and "Traceback" not in refused.output
