"""specbuild's own ModelConfig schema (package/model_config.py) is Triton's, field for field, and packaging needs
no tritonclient: checked against tritonclient's generated descriptor of Triton's model_config.proto."""

from __future__ import annotations

import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2, text_format
from tritonclient.grpc import model_config_pb2 as triton

from specbuild.package import model_config as mc


def _upstream(name: str):  # noqa: ANN202 - a protobuf descriptor
    descriptor = triton.DESCRIPTOR
    outer, _, inner = name.partition(".")
    message = descriptor.message_types_by_name[outer]
    return message.nested_types_by_name[inner] if inner else message


@pytest.mark.parametrize("name", sorted(mc.MESSAGES))
def test_every_field_is_triton_s(name: str) -> None:
    ours, theirs = mc.ModelConfig.DESCRIPTOR.file.pool.FindMessageTypeByName(f"inference.{name}"), _upstream(name)
    for field in ours.fields:
        upstream = theirs.fields_by_name[field.name]
        shape = (field.number, field.type, field.is_repeated)
        assert shape == (upstream.number, upstream.type, upstream.is_repeated), field.name
        for kind in ("message_type", "enum_type"):
            mine, real = getattr(field, kind), getattr(upstream, kind)
            assert (mine and mine.full_name) == (real and real.full_name), field.name
        assert (field.containing_oneof and field.containing_oneof.name) == (
            upstream.containing_oneof and upstream.containing_oneof.name), field.name


@pytest.mark.parametrize("name", sorted(mc.ENUMS))
def test_every_enum_value_is_triton_s(name: str) -> None:
    outer, _, inner = name.rpartition(".")
    theirs = (_upstream(outer).enum_types_by_name[inner] if outer else triton.DESCRIPTOR.enum_types_by_name[name])
    assert [(value.name, value.number) for value in theirs.values] == list(mc.ENUMS[name])


def test_a_config_written_here_reads_the_same_in_triton_s_message_and_back() -> None:
    config = mc.ModelConfig(name="m", backend="python", max_batch_size=4, input=[mc.ModelInput(
        name="x", data_type=mc.DataType.Value("TYPE_BF16"), dims=[-1], optional=True)])
    config.parameters["k"].string_value = "v"
    config.ensemble_scheduling.step.add(model_name="a", model_version=-1, input_map={"x": "y"})
    text = text_format.MessageToString(config)
    assert text_format.MessageToString(text_format.Parse(text, triton.ModelConfig())) == text
    with pytest.raises(text_format.ParseError, match="sequence_batching"):  # outside the table: refused
        text_format.Parse(text + "sequence_batching {}\n", mc.ModelConfig())


def test_the_descriptor_is_a_valid_proto_file() -> None:
    proto = mc.file_descriptor()
    assert isinstance(proto, descriptor_pb2.FileDescriptorProto) and proto.package == "inference"
    assert proto == mc.file_descriptor()  # built the same every time


def test_packaging_imports_no_tritonclient() -> None:
    code = ("import sys; import specbuild.package.repository, specbuild.runtimes.tensorrt_llm_llmapi.repository; "
            "sys.exit(1 if any(m.split('.')[0] in ('tritonclient', 'grpc') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
