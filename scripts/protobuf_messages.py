"""Protobuf messages for the tests' and the demo's producers, from .proto texts: compiled with protoc (grpcio-tools)
into a pool of their own and encoded by Protobuf's Python runtime, apart from the engine's JVM decoder."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def message_class(proto: str, full_name: str, file_name: str = "test.proto"):
    """The message class ``full_name`` of the .proto text ``proto`` (a pool of its own: two versions of one message
    can live side by side)."""
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / file_name).parent.mkdir(parents=True, exist_ok=True)
        (Path(tmp) / file_name).write_text(proto)
        out = Path(tmp) / "set.pb"
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{include}", "--include_imports",
             f"--descriptor_set_out={out}", file_name],
            check=True,
        )  # fmt: skip
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def wire(schema_id: int, message, indexes: tuple[int, ...] = (0,)) -> bytes:
    """``message`` in the Confluent wire format: magic byte, schema id, message indexes (zig-zag varints), payload."""

    def varint(n: int) -> bytes:
        n = (n << 1) ^ (n >> 63)
        out = bytearray()
        while n & ~0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)

    head = varint(0) if indexes == (0,) else varint(len(indexes)) + b"".join(varint(i) for i in indexes)
    return b"\x00" + schema_id.to_bytes(4, "big") + head + message.SerializeToString()
