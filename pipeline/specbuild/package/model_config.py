"""Triton's ``ModelConfig`` message, the part of it specbuild writes, without ``tritonclient``.

Packaging renders every ``config.pbtxt`` as a protobuf message and parses it back (``text_format``). Taking the
message classes from ``tritonclient.grpc.model_config_pb2`` made packaging need tritonclient, grpcio and a protobuf
its generated module accepts (tritonclient 2.73's checks for protobuf >= 6.30 at import), none of which the NGC
TensorRT-LLM image has. So the schema is here, as a table: each message and field specbuild writes, with the
number, type and label of Triton's ``protobuf/model_config.proto`` (triton-inference-server/common, as served by
Triton 2.51 and the 26.xx images; a test checks every entry against tritonclient's descriptor, field for field).
The classes are built from it at import with protobuf's own descriptor pool (any protobuf >= 4.22), so the
text format is Triton's: a config written here parses in Triton, and one with a field outside this table is
refused on reading back, as a misspelled one is.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

PACKAGE = "inference"  # Triton's proto package, so every full name is Triton's
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "bool": _F.TYPE_BOOL}
# Triton's enums: name -> (value name, number) in order.
ENUMS: dict[str, tuple[tuple[str, int], ...]] = {
    "DataType": tuple((name, number) for number, name in enumerate((
        "TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
        "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING",
        "TYPE_BF16"))),
    "ModelInstanceGroup.Kind": (("KIND_AUTO", 0), ("KIND_GPU", 1), ("KIND_CPU", 2), ("KIND_MODEL", 3)),
}
# Messages: name (nested ones dotted, after their outer one) -> fields (name, number, type). A type is a scalar,
# an enum or message of this table, with "[]" for a repeated field and "{}" for a map from string.
MESSAGES: dict[str, tuple[tuple[str, int, str], ...]] = {
    "ModelTensorReshape": (("shape", 1, "int64[]"),),
    "ModelInput": (("name", 1, "string"), ("data_type", 2, "DataType"), ("dims", 4, "int64[]"),
                   ("reshape", 5, "ModelTensorReshape"), ("allow_ragged_batch", 7, "bool"), ("optional", 8, "bool")),
    "ModelOutput": (("name", 1, "string"), ("data_type", 2, "DataType"), ("dims", 3, "int64[]")),
    "ModelInstanceGroup": (("count", 2, "int32"), ("kind", 4, "ModelInstanceGroup.Kind")),
    "ModelTransactionPolicy": (("decoupled", 1, "bool"),),
    "ModelDynamicBatching": (),
    "ModelParameter": (("string_value", 1, "string"),),
    "ModelEnsembling": (("step", 1, "ModelEnsembling.Step[]"),),
    "ModelEnsembling.Step": (("model_name", 1, "string"), ("model_version", 2, "int64"),
                             ("input_map", 3, "string{}"), ("output_map", 4, "string{}")),
    "ModelConfig": (("name", 1, "string"), ("platform", 2, "string"), ("max_batch_size", 4, "int32"),
                    ("input", 5, "ModelInput[]"), ("output", 6, "ModelOutput[]"),
                    ("instance_group", 7, "ModelInstanceGroup[]"), ("dynamic_batching", 11, "ModelDynamicBatching"),
                    ("parameters", 14, "ModelParameter{}"), ("ensemble_scheduling", 15, "ModelEnsembling"),
                    ("backend", 17, "string"), ("model_transaction_policy", 19, "ModelTransactionPolicy")),
}

# Triton's oneofs among those fields: message -> oneof name -> its members here.
ONEOFS: dict[str, dict[str, tuple[str, ...]]] = {
    "ModelConfig": {"scheduling_choice": ("dynamic_batching", "ensemble_scheduling")},
}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _set_type(field: Any, kind: str) -> None:
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    else:
        field.type = _F.TYPE_ENUM if kind in ENUMS else _F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{kind}"


def _add_fields(message: Any, owner: str, fields: tuple[tuple[str, int, str], ...]) -> None:
    for name, number, kind in fields:
        field = message.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL)
        if kind.endswith("{}"):  # map<string, value>: a repeated nested entry message, as protoc writes it
            entry = message.nested_type.add(name=f"{_camel(name)}Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
            _set_type(entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL), kind[:-2])
            field.label, field.type = _F.LABEL_REPEATED, _F.TYPE_MESSAGE
            field.type_name = f".{PACKAGE}.{owner}.{entry.name}"
        else:
            if kind.endswith("[]"):
                field.label, kind = _F.LABEL_REPEATED, kind[:-2]
            _set_type(field, kind)


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The tables above as the ``.proto`` file protoc would compile (proto3, package ``inference``)."""
    proto = descriptor_pb2.FileDescriptorProto(name="specbuild/model_config.proto", package=PACKAGE,
                                               syntax="proto3")
    made: dict[str, Any] = {}
    for name, values in ENUMS.items():
        owner, _, enum_name = name.rpartition(".")
        if owner:
            continue  # nested: added with its message
        proto.enum_type.add(name=enum_name).value.extend(
            descriptor_pb2.EnumValueDescriptorProto(name=value, number=number) for value, number in values)
    for name, fields in MESSAGES.items():
        outer, _, inner = name.rpartition(".")
        message = made[outer].nested_type.add(name=inner) if outer else proto.message_type.add(name=name)
        made[name] = message
        for enum_name, values in ENUMS.items():
            if enum_name.rpartition(".")[0] == name:
                message.enum_type.add(name=enum_name.rpartition(".")[2]).value.extend(
                    descriptor_pb2.EnumValueDescriptorProto(name=value, number=number) for value, number in values)
        _add_fields(message, name, fields)
        for index, (oneof, members) in enumerate(ONEOFS.get(name, {}).items()):
            message.oneof_decl.add(name=oneof)
            for field in message.field:
                if field.name in members:
                    field.oneof_index = index
    return proto


_POOL = descriptor_pool.DescriptorPool()  # its own pool: tritonclient's classes, where loaded, are not touched
_POOL.Add(file_descriptor())


def _message(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ModelConfig = _message("ModelConfig")
ModelInput = _message("ModelInput")
ModelOutput = _message("ModelOutput")
ModelInstanceGroup = _message("ModelInstanceGroup")
ModelEnsembling = _message("ModelEnsembling")
DataType = EnumTypeWrapper(_POOL.FindEnumTypeByName(f"{PACKAGE}.DataType"))
