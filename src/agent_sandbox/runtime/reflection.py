"""gRPC server reflection as sandboxd serves it: `grpc.reflection.v1` and `grpc.reflection.v1alpha`.

Upstream's sandboxd calls grpc-go's `reflection.Register`, which registers both versions; clients that speak
only v1 (grpc-java's ProtoReflectionServiceV1 clients, `buf curl --reflect-protocol grpc-v1`) get
UNIMPLEMENTED from a server with v1alpha alone. grpcio-reflection ships only v1alpha, so one v1alpha servicer
answers on both method paths: the two protocols' messages are wire-identical (same fields, numbers and types;
only the proto package differs), so v1alpha's classes decode a v1 request and encode the v1 response byte
for byte. The v1 file descriptor is added to the default descriptor pool too, derived from v1alpha's, so
that a client resolving every listed service (`grpcurl describe`) finds `grpc.reflection.v1.ServerReflection`
as it does against sandboxd.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc import aio
from grpc_reflection.v1alpha import reflection as v1alpha_reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb

__all__ = ["V1ALPHA_SERVICE", "V1_FILE", "V1_SERVICE", "enable_reflection", "v1_file_descriptor"]

#: The deprecated protocol every grpc-go and grpcio reflection server speaks.
V1ALPHA_SERVICE: str = v1alpha_reflection.SERVICE_NAME
#: The current protocol (grpc-go's `reflection.Register` registers it next to v1alpha).
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
#: The v1 descriptor's file name and package, as in grpc-go's `grpc_reflection_v1` (and gRPC's proto repo).
V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1_PACKAGE = "grpc.reflection.v1"
_METHOD = "ServerReflectionInfo"


def _json_name(name: str) -> str:
    """protoc's default JSON name of a field (lowerCamelCase), which grpc-go's embedded descriptor carries."""
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def v1_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The `grpc/reflection/v1/reflection.proto` descriptor, equal to the one grpc-go serves.

    Built from grpcio-reflection's v1alpha descriptor: the message and service definitions are the same, only
    the file name, package, type references and file options (v1 is not deprecated) differ.
    """
    file = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb.DESCRIPTOR.CopyToProto(file)
    old_prefix, new_prefix = f".{file.package}.", f".{_V1_PACKAGE}."
    file.name, file.package = V1_FILE, _V1_PACKAGE
    file.options.Clear()
    file.options.java_package = "io.grpc.reflection.v1"
    file.options.java_outer_classname = "ServerReflectionProto"
    file.options.java_multiple_files = True
    file.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    for message in file.message_type:
        for field in message.field:
            if field.type_name.startswith(old_prefix):
                field.type_name = new_prefix + field.type_name[len(old_prefix) :]
            if not field.HasField("json_name"):
                field.json_name = _json_name(field.name)
    for service in file.service:
        for method in service.method:
            method.input_type = new_prefix + method.input_type[len(old_prefix) :]
            method.output_type = new_prefix + method.output_type[len(old_prefix) :]
    return file


def _ensure_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add the v1 file to `pool` unless a file of that name is there already (e.g. a v1 module of a future
    grpcio-reflection; adding ours then would be a conflicting definition)."""
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.AddSerializedFile(v1_file_descriptor().SerializeToString())


def enable_reflection(server: aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha on `server`, listing `service_names` and both reflection services.

    Descriptors come from the default pool, where generated modules (`process_pb2`) register theirs.
    """
    _ensure_v1_descriptor(descriptor_pool.Default())
    names = (*service_names, V1ALPHA_SERVICE, V1_SERVICE)
    servicer: Any = v1alpha_reflection.aio.ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        tuple(
            grpc.method_handlers_generic_handler(service, {_METHOD: handler})
            for service in (V1ALPHA_SERVICE, V1_SERVICE)
        )
    )
