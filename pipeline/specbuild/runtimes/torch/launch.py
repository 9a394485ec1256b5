"""How a ``torch`` release is deployed: each pod runs ``specbuild serve`` in the CPU image (``docker/Dockerfile.cpu``),
no GPU, as a host serves it (the Triton server bundled with specbuild)."""

from __future__ import annotations

from pathlib import Path

from specbuild.runtimes.launch_plans import api_port, published_ports
from specbuild.runtimes.pod_plans import CPU_IMAGE, POD_CAPTURE_STORE, DeployOptions, PodPlan, ReleaseFootprint
from specbuild.runtimes.pod_plans import capture_mount, memory_gib
from specbuild.spec import BuildSpec

CPU_RELEASE_ROOT = "/release"  # where the CPU pod mounts the release folder (the repository, its engines beside)
TORCH_WORKING_SHARE = 0.25  # the torch runtime's KV cache and activations, as a share of its weights
DEFAULT_CPU_CORES = 4  # a torch release whose engines use every core (threads 0) gets this many


def cpu_pod_plan(spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
    """``specbuild serve`` in the CPU image: the repository with its engines beside it, as compiled. CPU requests
    equal limits (whole cores): with the kubelet's static CPU manager the pod gets cores of its own, the ones torch
    sizes its threads by. A capturing release's store is its pod's claim, named to ``serve`` by ``--capture-dir``."""
    ports = {**published_ports(spec), "openai": api_port(spec)}  # serve runs the OpenAI-compatible API too
    threads = spec.torch
    if options.cpu is not None:
        cores = options.cpu
    elif threads.target_threads and threads.draft_threads:  # the engines' threads, one core for the rest
        cores = threads.target_threads + threads.draft_threads + 1
    else:  # 0: every core the pod may run on
        cores = DEFAULT_CPU_CORES
    repository = f"{CPU_RELEASE_ROOT}/{Path(spec.outputs.repository_dir).name}"
    capture = spec.capture.enabled
    args = ("serve", repository, "--host", "0.0.0.0", *(f"--{kind}-port={port}" for kind, port in ports.items()),
            f"--timeout={options.startup_timeout_s}", *([f"--capture-dir={POD_CAPTURE_STORE}"] if capture else []))
    return PodPlan(image=options.image or CPU_IMAGE, args=args, env={}, ports=ports, gpus=0, cpu=(cores, cores),
                   memory_gib=memory_gib(options, footprint.weight_bytes / 2**30 * (1 + TORCH_WORKING_SHARE), 0),
                   volume_mounts=({"name": "release", "mountPath": CPU_RELEASE_ROOT, "readOnly": True},
                                  *([capture_mount()] if capture else [])),
                   node_selector={})
