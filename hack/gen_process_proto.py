#!/usr/bin/env python3
"""Generate src/agent_sandbox/api/processv1/process_pb2.py(.pyi) from process.proto (needs the dev extra).

protoc leaves `json_name` out of the descriptors it embeds unless a field spells it out, while buf (which
generated upstream's published stubs) always fills it in, map entries included, where `.proto` syntax cannot
set it. To get a descriptor byte-identical to upstream's, compile once to a descriptor set, fill in every
`json_name` as protoc would compute it, and generate the Python module from that set.

Usage: python hack/gen_process_proto.py [--check]   (--check: exit 1 if the committed files are stale)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import grpc_tools
from google.protobuf import descriptor_pb2

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "agent_sandbox" / "api" / "processv1"
PROTO_NAME = "process/v1/process.proto"
OUTPUTS = ("process_pb2.py", "process_pb2.pyi")


def _json_name(name: str) -> str:
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def _fill_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if not field.HasField("json_name"):
            field.json_name = _json_name(field.name)
    for nested in message.nested_type:
        _fill_json_names(nested)


def generate(out_dir: Path) -> None:
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        src_root = Path(tmp) / "src"
        (src_root / "process" / "v1").mkdir(parents=True)
        (src_root / PROTO_NAME).write_text((PACKAGE_DIR / "process.proto").read_text())
        raw_set = Path(tmp) / "raw.pb"
        protoc = [sys.executable, "-m", "grpc_tools.protoc"]
        subprocess.run(
            [
                *protoc,
                f"-I{src_root}",
                f"-I{include}",
                "--include_imports",
                f"--descriptor_set_out={raw_set}",
                PROTO_NAME,
            ],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(raw_set.read_bytes())
        for file in files.file:
            if file.name == PROTO_NAME:
                for message in file.message_type:
                    _fill_json_names(message)
        filled_set = Path(tmp) / "filled.pb"
        filled_set.write_bytes(files.SerializeToString())
        gen_dir = Path(tmp) / "out"
        gen_dir.mkdir()
        subprocess.run(
            [
                *protoc,
                f"--descriptor_set_in={filled_set}",
                f"--python_out={gen_dir}",
                f"--pyi_out={gen_dir}",
                PROTO_NAME,
            ],
            check=True,
        )
        for name in OUTPUTS:
            (out_dir / name).write_bytes((gen_dir / "process" / "v1" / name).read_bytes())


def main() -> int:
    if "--check" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            stale = [n for n in OUTPUTS if (Path(tmp) / n).read_bytes() != (PACKAGE_DIR / n).read_bytes()]
        if stale:
            print(f"stale generated files in {PACKAGE_DIR}: {stale}; run python hack/gen_process_proto.py")
            return 1
        return 0
    generate(PACKAGE_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
