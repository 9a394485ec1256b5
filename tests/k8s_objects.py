"""What the Kubernetes tests share: a GPU release's spec and footprint, the manifests' schema check, and the
``gpu_release`` fixture (a tensorrt-llm release whose engines were "built elsewhere")."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from checkpoint_factory import package_gpu_release

import crd_schemas
from specbuild.runtimes.pod_plans import ReleaseFootprint
from specbuild.spec import BuildSpec

K8S_VERSION = "1.33"  # pinned: the schemas shipped with kubernetes-validate
CORE_KINDS = {"Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"}
H100 = "NVIDIA H100 80GB HBM3"
FOOTPRINT = ReleaseFootprint(weight_bytes=7 * 2**30 + 1, gpu=H100)  # a 7 GiB engine pair, built on an H100


def gpu_spec(**extra: Any) -> BuildSpec:
    """A tensorrt-llm spec (tp 2 target) whose checkpoints and release live at fixed, absolute paths."""
    data: dict[str, Any] = {"runtime": "tensorrt-llm", "name": "Demo_Pair",
                            "target": {"checkpoint": "/ckpt/target", "tp_size": 2},
                            "draft": {"checkpoint": "/ckpt/draft"},
                            "outputs": {"engines_dir": "/rel/engines", "repository_dir": "/rel/triton_repo"}}
    data.update(extra)
    return BuildSpec.model_validate(data)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


def validate(obj: dict[str, Any]) -> None:
    """A core kind against Kubernetes' schema, a custom resource against its CRD's (both strict)."""
    if obj["kind"] in CORE_KINDS:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    else:
        crd_schemas.validate(obj)


@pytest.fixture
def gpu_release(checkpoints, tmp_path):
    """A tensorrt-llm release (tp 2 target) whose engines were "built elsewhere", on an H100."""
    return package_gpu_release(checkpoints, tmp_path, {"target.tp_size": 2}, gpu=H100)
