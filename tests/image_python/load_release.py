"""Run by test_release_image.py in a Python environment shaped like the NGC TensorRT-LLM image's (numpy < 2,
transformers 4.x, torch, the stand-in triton_python_backend_utils, no specbuild installed): import each python
model of a release the way the python backend's stub does (module ``1.model`` of the model folder), initialize
it with its config, and run one request through those that answer without other models (of a tensorrt-llm-llmapi
release: initialize its adapter, the one specbuild model there). Prints a JSON report.

A release of the ``tensorrt-llm`` runtime has no python target or draft (the ``tensorrtllm`` backend serves
them): its other models load and pre/postprocessing answer. Configs are read with specbuild's own ModelConfig
schema, loaded by path (specbuild is not importable here, and the image has no tritonclient).

Usage: python load_release.py REPOSITORY MODEL_CONFIG_PY
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from google.protobuf import json_format, text_format


def _schema(path: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("image_model_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model_config_pb2 = _schema(sys.argv[2])


def load(repository: Path, name: str):
    """As the stub does, in a process of its own: forget the specbuild modules an earlier model imported."""
    for module in [module for module in sys.modules if module.split(".")[0] == "specbuild"]:
        del sys.modules[module]
    version = repository / name / "1"
    spec = importlib.util.spec_from_file_location("1.model", version / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = text_format.Parse((repository / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    as_json = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))  # as Triton passes it
    # the keys python_backend's stub passes (src/pb_stub.cc, Stub::Initialize)
    model.initialize({"model_config": as_json, "model_repository": str(repository / name),
                      "model_version": "1", "model_name": name, "model_instance_name": f"{name}_0_0",
                      "model_instance_kind": "CPU", "model_instance_device_id": "0"})
    origins = {Path(module.__file__).resolve().relative_to(repository).parts[0]
               for module_name, module in sys.modules.items()
               if module_name.split(".")[0] == "specbuild" and getattr(module, "__file__", None)}
    assert origins == {name}, (name, origins)  # every specbuild module from the model's own folder
    return model


def main() -> None:
    repository = Path(sys.argv[1]).resolve()
    report = {"specbuild_installed": importlib.util.find_spec("specbuild") is not None}
    import numpy
    import transformers

    report["numpy"], report["transformers"] = numpy.__version__, transformers.__version__
    if (repository / "llmapi_adapter").is_dir():  # a tensorrt-llm-llmapi release: the image runs its own model
        adapter = load(repository, "llmapi_adapter")
        report["adapter_end_id"] = adapter.settings.end_id
        print(json.dumps(report))
        return
    python_models = [name for name in ("preprocessing", "orchestrator", "postprocessing", "target", "draft")
                     if (repository / name / "1" / "model.py").is_file()]
    models = {name: load(repository, name) for name in python_models}
    [pre] = models["preprocessing"].execute([pb_utils.Request({"text_input": np.array([["def add(a, b):"]],
                                                                                      dtype=object)})])
    ids = pb_utils.get_output_tensor_by_name(pre, "input_ids").as_numpy()
    report["prompt_ids"] = ids[0].tolist()
    if "target" in models:
        tokens = _target_tokens(models["target"], ids)
        report["target_tokens"] = tokens
    else:  # the tensorrtllm backend's engines: nothing generates here, postprocessing decodes the prompt's tail
        tokens = report["prompt_ids"][-4:]
    [text] = models["postprocessing"].execute([pb_utils.Request({
        "output_ids": np.array([tokens], dtype=np.int32), "output_length": np.array([[len(tokens)]], dtype=np.int32),
        "skip_tokens": np.array([[0]], dtype=np.int32), "is_final": np.array([[True]])})])
    report["text"] = pb_utils.get_output_tensor_by_name(text, "text_output").as_numpy().reshape(-1)[0].decode()
    print(json.dumps(report))


def _target_tokens(target, ids: np.ndarray) -> list[int]:  # noqa: ANN001 - the model
    [answer] = target.execute([pb_utils.Request({
        "input_ids": ids, "input_lengths": np.array([ids.shape[1]], dtype=np.int32),
        "request_output_len": np.array([4], dtype=np.int32), "runtime_top_k": np.array([1], dtype=np.int32),
        "seed": np.array([7], dtype=np.uint64), "min_tokens": np.array([4], dtype=np.int32)})])
    assert not answer.has_error(), answer.error().message()
    return pb_utils.get_output_tensor_by_name(answer, "output_ids").as_numpy()[0, 0].tolist()


if __name__ == "__main__":
    main()
