"""The v1 reflection descriptor the runtime serves next to v1alpha (as grpc-go's `reflection.Register`)."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb

from agent_sandbox.runtime.reflection import V1_FILE, V1_SERVICE, _ensure_v1_descriptor, v1_file_descriptor

pytestmark = pytest.mark.unit

# grpc-go v1.83.2's grpc_reflection_v1 descriptor (what sandboxd serves for the v1 service):
# protodesc.ToFileDescriptorProto(grpc_reflection_v1.File_grpc_reflection_v1_reflection_proto), marshalled.
GRPC_GO_V1 = base64.b64decode(
    "CiNncnBjL3JlZmxlY3Rpb24vdjEvcmVmbGVjdGlvbi5wcm90bxISZ3JwYy5yZWZsZWN0aW9uLnYxIvMCChdTZXJ2ZXJSZWZsZWN0"
    "aW9uUmVxdWVzdBISCgRob3N0GAEgASgJUgRob3N0EioKEGZpbGVfYnlfZmlsZW5hbWUYAyABKAlIAFIOZmlsZUJ5RmlsZW5hbWUS"
    "NgoWZmlsZV9jb250YWluaW5nX3N5bWJvbBgEIAEoCUgAUhRmaWxlQ29udGFpbmluZ1N5bWJvbBJiChlmaWxlX2NvbnRhaW5pbmdf"
    "ZXh0ZW5zaW9uGAUgASgLMiQuZ3JwYy5yZWZsZWN0aW9uLnYxLkV4dGVuc2lvblJlcXVlc3RIAFIXZmlsZUNvbnRhaW5pbmdFeHRl"
    "bnNpb24SQgodYWxsX2V4dGVuc2lvbl9udW1iZXJzX29mX3R5cGUYBiABKAlIAFIZYWxsRXh0ZW5zaW9uTnVtYmVyc09mVHlwZRIl"
    "Cg1saXN0X3NlcnZpY2VzGAcgASgJSABSDGxpc3RTZXJ2aWNlc0IRCg9tZXNzYWdlX3JlcXVlc3QiZgoQRXh0ZW5zaW9uUmVxdWVz"
    "dBInCg9jb250YWluaW5nX3R5cGUYASABKAlSDmNvbnRhaW5pbmdUeXBlEikKEGV4dGVuc2lvbl9udW1iZXIYAiABKAVSD2V4dGVu"
    "c2lvbk51bWJlciKuBAoYU2VydmVyUmVmbGVjdGlvblJlc3BvbnNlEh0KCnZhbGlkX2hvc3QYASABKAlSCXZhbGlkSG9zdBJWChBv"
    "cmlnaW5hbF9yZXF1ZXN0GAIgASgLMisuZ3JwYy5yZWZsZWN0aW9uLnYxLlNlcnZlclJlZmxlY3Rpb25SZXF1ZXN0Ug9vcmlnaW5h"
    "bFJlcXVlc3QSZgoYZmlsZV9kZXNjcmlwdG9yX3Jlc3BvbnNlGAQgASgLMiouZ3JwYy5yZWZsZWN0aW9uLnYxLkZpbGVEZXNjcmlw"
    "dG9yUmVzcG9uc2VIAFIWZmlsZURlc2NyaXB0b3JSZXNwb25zZRJyCh5hbGxfZXh0ZW5zaW9uX251bWJlcnNfcmVzcG9uc2UYBSAB"
    "KAsyKy5ncnBjLnJlZmxlY3Rpb24udjEuRXh0ZW5zaW9uTnVtYmVyUmVzcG9uc2VIAFIbYWxsRXh0ZW5zaW9uTnVtYmVyc1Jlc3Bv"
    "bnNlEl8KFmxpc3Rfc2VydmljZXNfcmVzcG9uc2UYBiABKAsyJy5ncnBjLnJlZmxlY3Rpb24udjEuTGlzdFNlcnZpY2VSZXNwb25z"
    "ZUgAUhRsaXN0U2VydmljZXNSZXNwb25zZRJKCg5lcnJvcl9yZXNwb25zZRgHIAEoCzIhLmdycGMucmVmbGVjdGlvbi52MS5FcnJv"
    "clJlc3BvbnNlSABSDWVycm9yUmVzcG9uc2VCEgoQbWVzc2FnZV9yZXNwb25zZSJMChZGaWxlRGVzY3JpcHRvclJlc3BvbnNlEjIK"
    "FWZpbGVfZGVzY3JpcHRvcl9wcm90bxgBIAMoDFITZmlsZURlc2NyaXB0b3JQcm90byJqChdFeHRlbnNpb25OdW1iZXJSZXNwb25z"
    "ZRIkCg5iYXNlX3R5cGVfbmFtZRgBIAEoCVIMYmFzZVR5cGVOYW1lEikKEGV4dGVuc2lvbl9udW1iZXIYAiADKAVSD2V4dGVuc2lv"
    "bk51bWJlciJUChNMaXN0U2VydmljZVJlc3BvbnNlEj0KB3NlcnZpY2UYASADKAsyIy5ncnBjLnJlZmxlY3Rpb24udjEuU2Vydmlj"
    "ZVJlc3BvbnNlUgdzZXJ2aWNlIiUKD1NlcnZpY2VSZXNwb25zZRISCgRuYW1lGAEgASgJUgRuYW1lIlMKDUVycm9yUmVzcG9uc2US"
    "HQoKZXJyb3JfY29kZRgBIAEoBVIJZXJyb3JDb2RlEiMKDWVycm9yX21lc3NhZ2UYAiABKAlSDGVycm9yTWVzc2FnZTKJAQoQU2Vy"
    "dmVyUmVmbGVjdGlvbhJ1ChRTZXJ2ZXJSZWZsZWN0aW9uSW5mbxIrLmdycGMucmVmbGVjdGlvbi52MS5TZXJ2ZXJSZWZsZWN0aW9u"
    "UmVxdWVzdBosLmdycGMucmVmbGVjdGlvbi52MS5TZXJ2ZXJSZWZsZWN0aW9uUmVzcG9uc2UoATABQmYKFWlvLmdycGMucmVmbGVj"
    "dGlvbi52MUIVU2VydmVyUmVmbGVjdGlvblByb3RvUAFaNGdvb2dsZS5nb2xhbmcub3JnL2dycGMvcmVmbGVjdGlvbi9ncnBjX3Jl"
    "ZmxlY3Rpb25fdjFiBnByb3RvMw=="
)


def test_v1_descriptor_is_grpc_gos() -> None:
    ours = v1_file_descriptor()
    assert ours == descriptor_pb2.FileDescriptorProto.FromString(GRPC_GO_V1)
    assert ours.SerializeToString() == GRPC_GO_V1


def test_v1_messages_are_wire_identical_to_v1alpha() -> None:
    """What lets one v1alpha servicer answer v1: same messages, fields, numbers and types."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(v1_file_descriptor())
    v1 = pool.FindFileByName(V1_FILE)
    assert sorted(v1.message_types_by_name) == sorted(v1alpha_pb.DESCRIPTOR.message_types_by_name)
    for name, alpha in v1alpha_pb.DESCRIPTOR.message_types_by_name.items():
        fields = v1.message_types_by_name[name].fields
        assert [(f.name, f.number, f.type, f.is_repeated) for f in fields] == [
            (f.name, f.number, f.type, f.is_repeated) for f in alpha.fields
        ]
        assert [o.name for o in v1.message_types_by_name[name].oneofs] == [o.name for o in alpha.oneofs]
    assert pool.FindServiceByName(V1_SERVICE).methods_by_name["ServerReflectionInfo"].client_streaming


def test_ensure_v1_descriptor_is_idempotent() -> None:
    """Called once per runtime server; the dev cluster runs many in one process."""
    pool = descriptor_pool.DescriptorPool()
    _ensure_v1_descriptor(pool)
    _ensure_v1_descriptor(pool)
    assert pool.FindFileContainingSymbol(V1_SERVICE).name == V1_FILE
