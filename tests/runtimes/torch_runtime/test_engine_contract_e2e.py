"""The torch runtime's engine models enforce the ``tensorrtllm`` backend's contract on a real Triton server, so
the CPU rehearsal fails where a GPU release would: a config without a parameter the backend requires does not
load (naming it), and an input the backend does not know (an old name) is refused."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specbuild.serve.client import grpc_inputs
from specbuild.errors import ServerError
from specbuild.package.backend_contract import EngineParameters
from specbuild.serve.server import TritonServer

REQUIRED = [item.name for item in dataclasses.fields(EngineParameters) if not item.metadata.get("optional")]


@pytest.fixture(scope="module")
def bare_server(tiny_repository, tmp_path_factory):
    """A server on a copy of the tiny release with no model loaded yet (explicit model control)."""
    repository = shutil.copytree(tiny_repository.parent, tmp_path_factory.mktemp("contract") / "release",
                                 symlinks=True) / tiny_repository.name
    with TritonServer(repository, model_control="explicit", verify=False, startup_timeout=300) as server:
        yield server


@pytest.mark.slow
@pytest.mark.e2e
def test_required_parameters_are_required_on_cpu_too(bare_server):
    assert set(REQUIRED) == {"gpt_model_path", "gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path",
                             "guided_decoding_backend"}
    path = bare_server.repository / "target" / "config.pbtxt"
    original = path.read_text()
    try:
        for key in REQUIRED:
            config = text_format.Parse(original, model_config_pb2.ModelConfig())
            del config.parameters[key]
            path.write_text(text_format.MessageToString(config))
            with pytest.raises(ServerError, match=f"Cannot find parameter with name: {key}"):
                bare_server.load_model("target")
    finally:
        path.write_text(original)
    bare_server.load_model("target")
    assert bare_server.model_ready("target")


@pytest.mark.slow
@pytest.mark.e2e
def test_an_input_name_the_backend_does_not_know_is_refused(bare_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    bare_server.load_model("target")
    client = grpcclient.InferenceServerClient(bare_server.grpc_url)
    base = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
            "request_output_len": np.array([[2]], dtype=np.int32)}
    answer = client.infer("target", grpc_inputs({**base, "seed": np.array([[3]], dtype=np.uint64)}))
    assert answer.as_numpy("sequence_length").reshape(-1)[0] == 2  # the current name works
    for old in ("random_seed", "min_length"):  # renamed in tensorrtllm_backend PR #749
        dtype = np.uint64 if old == "random_seed" else np.int32
        with pytest.raises(InferenceServerException, match=f"unexpected inference input '{old}'"):
            client.infer("target", grpc_inputs({**base, old: np.array([[3]], dtype=dtype)}))
