"""What both TensorRT-LLM runtimes share: TensorRT-LLM as the NGC image holds it (the installed package, the
dtypes it runs, its token budget per step), and how a release starts in that image (``tritonserver``'s flags,
``docker run``, the GPU pod).

Imported by :mod:`specbuild.runtimes.tensorrt_llm` (engines) and :mod:`specbuild.runtimes.tensorrt_llm_llmapi`
(the LLM API), and by the memory plan, which sizes activations by TensorRT-LLM's step budget.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from specbuild.capture.store import CAPTURE_DIR_ENV
from specbuild.errors import CheckpointError, SpecError, UsageError
from specbuild.package.contract import DRAFT_MODEL, TARGET_MODEL
from specbuild.runtimes.interface import Runtime
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, PORT_KINDS, LaunchPlan, Mount, bracket
from specbuild.runtimes.names import TENSORRT_LLM
from specbuild.runtimes.pod_plans import POD_CAPTURE_STORE, DeployOptions, PodPlan, ReleaseFootprint, capture_mount
from specbuild.runtimes.pod_plans import memory_gib
from specbuild.spec import ROLES, BuildSpec, Role

EngineDtype = Literal["float16", "bfloat16"]
MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default max_num_tokens: the most tokens one step of an engine takes
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
CONTAINER_BIND = "0.0.0.0"  # inside the container; the host side is published on spec.triton.host
ENGINE_MODELS = (TARGET_MODEL, DRAFT_MODEL)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery: the GPU's name, spaces as '-'
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def resolve_dtype(requested: str, role: Role, checkpoint_dtype: str | None, *,
                  runtime: str = TENSORRT_LLM) -> EngineDtype:
    """The engine dtype: the spec's, or for ``auto`` the checkpoint's ``torch_dtype``.

    ``auto`` follows ``convert_checkpoint.py --dtype auto``: a float32 (or unrecorded) checkpoint becomes
    float16. float32 is refused: TensorRT-LLM runs fp16/bf16 models only here.
    """
    if requested == "float32":
        raise SpecError(
            f"{role}.dtype is float32, which the {runtime} runtime does not run (fp16/bf16 only)",
            f"set {role}.dtype to bfloat16, float16 or auto, or use --runtime torch for float32",
        )
    if requested != "auto":
        return requested
    found = (checkpoint_dtype or "float32").removeprefix("torch.")
    if found in ("float16", "bfloat16"):
        return found
    if found == "float32":
        return "float16"
    raise CheckpointError(
        f"the {role} checkpoint's config.json records torch_dtype {checkpoint_dtype!r}, which is not a float type",
        f"set {role}.dtype to bfloat16 or float16 explicitly",
    )


def installed_package_dir() -> Path | None:
    """The folder of the installed ``tensorrt_llm`` package, found without importing it (an import loads CUDA)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_llm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


class ImageRuntime(Runtime):
    """A runtime whose releases start in the NGC TensorRT-LLM image: each replica of a deployment runs exactly its
    launch plan, on the GPU its engines were built on."""

    # TensorRT-LLM reads the HF folders with the image's transformers: convert_checkpoint.py / from_hugging_face
    # (engines), LLM(model=...) on the mounted folders (the LLM API).
    reads_checkpoints_in_image = True

    def served_logits_width(self, logits_width: int, tp_size: int) -> int:
        """TensorRT-LLM's model definitions split ``lm_head`` over tp with its width padded to a multiple of
        tp_size (``vocab_size_padded = pad_vocab_size(vocab_size, mapping.tp_size)`` in ``tensorrt_llm/models/
        llama/model.py`` and the other decoders, ``pad_vocab_size`` in ``tensorrt_llm/_utils.py``, v1.2.1)."""
        return -(-logits_width // tp_size) * tp_size

    @abc.abstractmethod
    def launch_plan(self, spec: BuildSpec, repository: Path, engines: Path, checkpoints: Mapping[str, Path], *,
                    gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> LaunchPlan:
        """``docker run`` of the image, with the release's layout (see :class:`Runtime`)."""

    def pod_plan(self, spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
        checkpoints = {role: Path(getattr(spec, role).checkpoint) for role in ROLES}
        plan = self.launch_plan(spec, Path(spec.outputs.repository_dir), Path(spec.outputs.engines_dir), checkpoints,
                                shm_gib=options.shm_gib)
        return gpu_pod_plan(plan, options, footprint, capture=spec.capture.enabled)


# --- a release started in the image -------------------------------------------------------------------
def server_args(spec: BuildSpec, ports: dict[str, int], *, rank: int, mpi: bool, gpu_count: int,
                spawns: bool | None) -> list[str]:
    """``tritonserver``'s arguments for MPI rank ``rank``: rank 0 serves every endpoint, the others load only the
    engines; ``spawns``: TensorRT-LLM starts its GPU workers itself (orchestrator mode, the LLM API)."""
    args = [TRITONSERVER, f"--model-repository={spec.triton.repository_mount}"]
    if rank == 0:
        for kind in PORT_KINDS:
            args += [f"--{kind}-address={CONTAINER_BIND}", f"--{kind}-port={ports[kind]}"]
        args += ["--exit-on-error=true", "--strict-readiness=true"]
    else:
        # worker ranks load only the engines and never open endpoints (no port clash with rank 0)
        args += ["--model-control-mode=explicit", *(f"--load-model={name}" for name in ENGINE_MODELS),
                 "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    if spawns:
        # what launch_triton_server.py --multi-model adds when TensorRT-LLM spawns its own workers
        args += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
                 *(f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(gpu_count))]
    args.append("--disable-auto-complete-config")
    if mpi:
        args.append(f"--backend-config=python,shm-region-prefix-name=prefix{rank}_")
    return args


def host_path(path: str | Path, what: str) -> str:
    """``path`` as the absolute host folder ``docker run --mount`` binds (which takes no comma in it)."""
    resolved = str(Path(path).expanduser().resolve())
    if "," in resolved:
        raise UsageError(f"{what} path {resolved!r} contains a comma, which `docker run --mount` cannot take",
                         f"move the {what} to a path without commas")
    return resolved


def publish(host: str, port: int) -> str:
    return f"{bracket(host)}:{port}:{port}"


def docker_argv(spec: BuildSpec, gpu_count: int, shm_gib: int, ports: dict[str, int], mounts: tuple[Mount, ...],
                env: dict[str, str], server_argv: list[str]) -> tuple[str, ...]:
    """``docker run`` of the image with ``server_argv``: GPUs, shared memory, published ports, read-only mounts."""
    argv = ["docker", "run", "--rm", "--name", f"specbuild-{spec.name}", "--gpus", str(gpu_count),
            "--shm-size", f"{shm_gib}g", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    for kind in PORT_KINDS:
        argv += ["-p", publish(spec.triton.host, ports[kind])]
    for mount in mounts:
        argv += mount.docker_args()
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    return tuple(argv + [spec.triton.image, *server_argv])


def gpu_label_value(gpu: str) -> str:
    """A GPU name as NVIDIA's GPU feature discovery writes it into ``nvidia.com/gpu.product`` (``NVIDIA H100 80GB
    HBM3`` -> ``NVIDIA-H100-80GB-HBM3``), cut to a valid label value."""
    return _LABEL_VALUE.sub("-", gpu.strip()).strip("-_.")[:63].rstrip("-_.")


def volume_mounts(plan: LaunchPlan) -> tuple[dict[str, Any], ...]:
    """The launch plan's mounts, each folder found in the release volume by its name (as compile named it)."""
    names = [Path(mount.source).name for mount in plan.mounts]
    if len(set(names)) != len(names):
        raise UsageError(f"the release's folders {', '.join(m.source for m in plan.mounts)} must have different "
                         "names to sit side by side in one volume", "rename the folders (and package again)")
    return tuple({"name": "release", "mountPath": mount.target, "subPath": name, "readOnly": mount.read_only}
                 for mount, name in zip(plan.mounts, names))


def gpu_pod_plan(plan: LaunchPlan, options: DeployOptions, footprint: ReleaseFootprint, *,
                 capture: bool = False) -> PodPlan:
    """``plan`` in the release's container image, on the GPU its engines were built on; ``capture``: the pod's
    capture claim mounted, its store named to the orchestrator (whose stubs inherit the server's environment)."""
    # one host core per engine process, two for the server and the python models; bursts up to twice that
    cores = 2 + plan.gpu_count
    cpu = (options.cpu, options.cpu) if options.cpu is not None else (cores, 2 * cores)
    env = {**plan.env, CAPTURE_DIR_ENV: POD_CAPTURE_STORE} if capture else plan.env
    return PodPlan(image=options.image or plan.image, args=plan.server_argv, env=env, ports=plan.ports,
                   gpus=plan.gpu_count, cpu=cpu,
                   memory_gib=memory_gib(options, footprint.weight_bytes / 2**30, plan.gpu_count),
                   volume_mounts=(*volume_mounts(plan), *([capture_mount()] if capture else [])),
                   node_selector={GPU_PRODUCT_LABEL: gpu_label_value(footprint.gpu)} if footprint.gpu else {},
                   openai_sidecar_port=plan.openai_port)
