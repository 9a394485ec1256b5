"""Kubernetes manifests: schema-valid for a pinned Kubernetes version, consistent with the launch plan."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.package.contract import ENSEMBLE_MODEL
from specbuild.errors import UsageError
from checkpoint_factory import checkpoints, package_gpu_release  # noqa: F401
from specbuild.serve.k8s import DeployOptions, k8s_name, manifests, to_yaml, write_manifests
from specbuild.serve.launch import launch_plan
from specbuild.spec import BuildSpec

K8S_VERSION = "1.33"  # pinned: the schemas shipped with kubernetes-validate


def make_spec(**extra: Any) -> BuildSpec:
    data: dict[str, Any] = {"runtime": "tensorrt-llm", "name": "Demo_Pair",
                            "target": {"checkpoint": "/ckpt/target", "tp_size": 2},
                            "draft": {"checkpoint": "/ckpt/draft"},
                            "outputs": {"engines_dir": "/rel/engines", "repository_dir": "/rel/triton_repo"}}
    data.update(extra)
    return BuildSpec.model_validate(data)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


OPTION_SETS = [
    ({}, DeployOptions(pvc="release")),
    ({}, DeployOptions(release_image="registry.example/demo-release:1", replicas=3, namespace="llm")),
    ({"launch": {"fast_logits": True}}, DeployOptions(pvc="release", max_replicas=2)),
    ({"target": {"checkpoint": "/ckpt/target", "pp_size": 2}, "launch": {"mode": "leader", "placement": "separate"}},
     DeployOptions(pvc="release", hpa_metric="nv_inference_queue_duration_us", hpa_target=500)),
]


@pytest.mark.parametrize(("spec", "options"), OPTION_SETS)
def test_core_kinds_validate_strictly(spec, options):
    objects = manifests(make_spec(**spec), options)
    assert [obj["kind"] for obj in objects] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # and the YAML dump reads back to the same objects
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


def test_validator_rejects_a_misspelled_field():
    """Control: the schema check used above can fail."""
    deployment = manifests(make_spec(), DeployOptions(pvc="release"))[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_deployment_runs_the_launch_plan():
    spec = make_spec()
    options = DeployOptions(pvc="release", replicas=2)
    plan = launch_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir)
    objects = by_kind(manifests(spec, options))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
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
    deployment = by_kind(manifests(make_spec(), DeployOptions(pvc="release")))["Deployment"]
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


def test_init_container_copies_the_release_image():
    pod = by_kind(manifests(make_spec(), DeployOptions(release_image="reg/rel:1")))["Deployment"]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["image"] == "reg/rel:1"
    assert init["command"] == ["cp", "-R", "/release/.", "/mnt/release/"]
    assert {v["name"]: v for v in pod["volumes"]}["release"] == {"name": "release", "emptyDir": {}}


def test_service_and_hpa_agree_with_the_deployment():
    objects = by_kind(manifests(make_spec(), DeployOptions(pvc="release", replicas=2)))
    deployment, svc, hpa = objects["Deployment"], objects["Service"], objects["HorizontalPodAutoscaler"]
    assert svc["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == container_ports == {"http", "grpc", "metrics"}
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    [metric] = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"] == {"name": "nv_trt_llm_request_metrics",
                                        "selector": {"matchLabels": {"model": "target", "request_type": "active"}}}
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "6"}  # 3/4 of max_batch_size 8
    assert deployment["metadata"]["name"] == "demo-pair"


def test_kserve_structure():
    spec = make_spec()
    runtime, isvc = manifests(spec, DeployOptions(pvc="release", replicas=2), kserve=True)
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and runtime["kind"] == "ServingRuntime"
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    rspec = runtime["spec"]
    assert {"name": "triton", "version": "2", "autoSelect": False} in rspec["supportedModelFormats"]
    assert set(rspec["protocolVersions"]) == {"v2", "grpc-v2"}
    [container] = rspec["containers"]
    assert container["name"] == "kserve-container"
    plan = launch_plan(spec, spec.outputs.repository_dir, spec.outputs.engines_dir)
    assert tuple(container["args"]) == plan.server_argv
    assert container["ports"] == [{"containerPort": plan.ports["http"], "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": plan.ports["http"]}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", "/engines", "/triton_repo"}
    assert {v["name"] for v in rspec["volumes"]} == {m["name"] for m in container["volumeMounts"]}
    predictor = isvc["spec"]["predictor"]
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"]
    assert predictor["model"]["modelFormat"]["name"] in {f["name"] for f in rspec["supportedModelFormats"]}
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 8)
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    # the pod-level fields KServe inlines in the predictor are valid core PodSpec fields
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [container], "volumes": rspec["volumes"],
                    **{k: predictor[k] for k in ("securityContext", "terminationGracePeriodSeconds")}}}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_option_errors():
    spec = make_spec()
    with pytest.raises(UsageError, match="exactly one source"):
        manifests(spec, DeployOptions())
    with pytest.raises(UsageError, match="exactly one source"):
        manifests(spec, DeployOptions(pvc="a", release_image="b"))
    with pytest.raises(UsageError, match="KServe variant mounts the release from a PVC"):
        manifests(spec, DeployOptions(release_image="b"), kserve=True)
    with pytest.raises(UsageError, match="namespace"):
        manifests(spec, DeployOptions(pvc="a", namespace="Bad_NS"))
    with pytest.raises(UsageError, match="max replicas"):
        manifests(spec, DeployOptions(pvc="a", replicas=3, max_replicas=2))


@pytest.mark.parametrize(("name", "label"), [("demo", "demo"), ("Demo_Pair.v2", "demo-pair-v2"),
                                             ("7b-pair", "specbuild-7b-pair"), ("x" * 64, "x" * 63)])
def test_k8s_name(name, label):
    assert k8s_name(name) == label


def test_only_rank0_loads_the_ensemble():
    """Clients reach the release through ``ensemble`` on rank 0; worker ranks load the engine models only."""
    leader = make_spec(target={"checkpoint": "/ckpt/target", "pp_size": 2}, launch={"mode": "leader"})
    deployment = manifests(leader, DeployOptions(pvc="release"))[0]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    loaded = {arg.split("=", 1)[1] for arg in args if arg.startswith("--load-model=")}
    assert loaded == {"target", "draft"} and ENSEMBLE_MODEL not in loaded
    assert args.count("--model-control-mode=explicit") == 1  # rank 1 of 2; rank 0 loads the whole repository


@pytest.fixture
def gpu_release(checkpoints, tmp_path):  # noqa: F811
    """A tensorrt-llm release (tp 2 target) whose engines were "built elsewhere": build records in engines/."""
    return package_gpu_release(checkpoints, tmp_path, {"target.tp_size": 2})


def test_deploy_command_writes_the_release_s_manifests(gpu_release, tmp_path):
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "--k8s", str(out), "--pvc", "release",
                                       "--replicas", "2", "--namespace", "llm"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["deployment.yaml", "horizontalpodautoscaler.yaml",
                                                     "service.yaml"]
    deployment = yaml.safe_load((out / "deployment.yaml").read_text())
    assert deployment["metadata"]["namespace"] == "llm" and deployment["spec"]["replicas"] == 2
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"  # the release's tp 2, from its manifest
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)

    kserve = CliRunner().invoke(main, ["deploy", str(gpu_release.repository), "--k8s", str(tmp_path / "ks"),
                                       "--pvc", "release", "--kserve"])
    assert kserve.exit_code == 0, kserve.output
    assert sorted(p.name for p in (tmp_path / "ks").iterdir()) == ["inferenceservice.yaml", "servingruntime.yaml"]


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
        write_manifests(target, manifests(make_spec(), DeployOptions(pvc="r")))
