"""Protobuf schemas from a schema registry, compiled into the descriptor sets the engine's JVM helper reads
(``org.apache.spark.sql.phases.ProtobufRecords``).

A registry keeps a Protobuf schema as a ``.proto`` text (Confluent's serializers in Java, Apicurio's) or as a base64
``FileDescriptorProto`` (Confluent's Python serializer), and its imports as references to other subjects' versions.
:func:`descriptor_set` gathers the schema and everything it imports (the references, recursively, and Protobuf's own
well-known types such as ``google/protobuf/timestamp.proto``) and compiles the texts with ``protoc`` (grpcio-tools,
run in a child process so that its messages are captured): a ``FileDescriptorSet`` with every file it needs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError
from py4j.protocol import Py4JJavaError

from phases._internal import spark_internals
from phases._internal.errors import PhasesError
from phases._internal.runtime.schema_registry import RegistryClient, SubjectVersion


def helper(spark) -> Any:
    """The helper's ``ProtobufRecords`` (its object's static forwarders)."""
    return spark_internals.jvm(spark).org.apache.spark.sql.phases.ProtobufRecords


def java_error(exc: Py4JJavaError) -> str:
    """The helper's own message of a failed call (an IllegalArgumentException's text)."""
    text = str(exc.java_exception.getMessage() or exc.java_exception.toString())
    return text.strip()


# Compiled sets by the schemas' content (a schema id's text never changes): one protoc run per schema a process.
_COMPILED: dict[str, bytes] = {}


def _as_descriptor(schema: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto of a base64-serialized schema; None when ``schema`` is a .proto text."""
    text = schema.strip()
    if not text or any(c.isspace() for c in text) or '"' in text or ";" in text:
        return None
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    return proto if proto.name else None


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    """Protobuf's own file ``name`` (google/protobuf/...), from the Python runtime's descriptors."""
    if not name.startswith("google/protobuf/"):
        return None
    from google.protobuf import (  # noqa: F401 - importing registers their files in the default pool
        any_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    try:
        found = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def descriptor_set(
    client: RegistryClient, version: SubjectVersion, subject: str, error: type[PhasesError]
) -> tuple[bytes, str]:
    """(a serialized FileDescriptorSet with ``version``'s schema and every file it imports, the schema's file name).
    A schema that does not compile is an ``error`` naming the subject, the version and protoc's message."""
    main = f"phases_schema_{version.id}.proto"
    files: dict[str, str] = {main: version.schema}  # import name -> schema text (or base64)
    pending = list(version.references)
    while pending:
        name, ref_subject, ref_version = pending.pop()
        if name in files:
            continue
        ref = client.version(ref_subject, ref_version)
        files[name] = ref.schema
        pending.extend(ref.references)
    key = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()
    if key not in _COMPILED:
        _COMPILED[key] = _compile(files, main, subject, version, error)
    # A .proto text is compiled under the name given to it; a descriptor keeps its own.
    described = _as_descriptor(version.schema)
    return _COMPILED[key], (main if described is None else described.name)


def compile_text(text: str, file_name: str, what: str, error: type[PhasesError]) -> bytes:
    """A .proto ``text`` of the engine's own (a topic sink's result schema) compiled into a descriptor set under
    ``file_name``; ``what`` names it in an error."""
    key = hashlib.sha256(f"{file_name}\0{text}".encode()).hexdigest()
    if key not in _COMPILED:
        try:
            _COMPILED[key] = _compile({file_name: text}, file_name, what, SubjectVersion(0, 0, text, "PROTOBUF"), error)
        except PhasesError as exc:
            raise error(f"{what}: the engine's Protobuf schema does not compile ({exc}); please report it") from None
    return _COMPILED[key]


def _compile(
    files: dict[str, str], main: str, subject: str, version: SubjectVersion, error: type[PhasesError]
) -> bytes:
    protos: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    texts: dict[str, str] = {}
    for name, schema in files.items():
        proto = _as_descriptor(schema)
        if proto is None:
            texts[name] = schema
        else:
            protos[proto.name] = proto
    if texts:
        for proto in _protoc(texts, protos, subject, version, error):
            protos.setdefault(proto.name, proto)
    # The imports nothing above holds: Protobuf's well-known types.
    missing = [d for p in list(protos.values()) for d in p.dependency if d not in protos]
    while missing:
        name = missing.pop()
        if name in protos:
            continue
        proto = _well_known(name)
        if proto is None:
            raise error(
                f"version {version.version} of subject {subject!r} (schema id {version.id}) imports {name!r}, which "
                "is neither among its references nor one of Protobuf's own files. Register the imported schema and "
                "reference it from the schema (Confluent's serializers do), then run again"
            )
        protos[name] = proto
        missing.extend(d for d in proto.dependency if d not in protos)
    return descriptor_pb2.FileDescriptorSet(file=list(protos.values())).SerializeToString()


def _protoc(
    texts: dict[str, str],
    protos: dict[str, descriptor_pb2.FileDescriptorProto],
    subject: str,
    version: SubjectVersion,
    error: type[PhasesError],
) -> list[descriptor_pb2.FileDescriptorProto]:
    """The .proto ``texts`` compiled (imports included); ``protos``: files known already as descriptors, given to
    protoc as a descriptor set."""
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="phases-proto-") as tmp:
        root = Path(tmp) / "src"
        for name, text in texts.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out = Path(tmp) / "set.pb"
        args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{include}", "--include_imports"]
        if protos:
            known = Path(tmp) / "known.pb"
            known.write_bytes(descriptor_pb2.FileDescriptorSet(file=list(protos.values())).SerializeToString())
            args.append(f"--descriptor_set_in={known}")
        proc = subprocess.run(
            [*args, f"--descriptor_set_out={out}", *sorted(texts)], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip().replace(str(root) + "/", "")
            raise error(
                f"version {version.version} of subject {subject!r} (schema id {version.id}) is not a Protobuf schema "
                f"protoc compiles: {message[-1500:]}. Register a valid .proto under the subject, then run again"
            )
        return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)
