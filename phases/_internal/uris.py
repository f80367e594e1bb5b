"""Table and folder locations as URIs: local paths, ``file:`` URIs and object-store URIs (``s3a://``,
``abfss://``, ``gs://``, ``hdfs://``) alike.

``pathlib`` must not build them: ``PurePosixPath("s3a://bucket/x")`` collapses the ``//`` after the scheme.
Everything the engine derives from a location (state tables, manifests, checkpoints, the live run's folders) is
joined here instead.
"""

from __future__ import annotations

import re

from phases._internal.errors import DefinitionError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def scheme(location: str) -> str | None:
    """The URI scheme (``s3a``, ``file``, ...), or None for a plain path."""
    match = _SCHEME.match(location)
    return match.group(0)[:-1].lower() if match else None


def is_local(location: str) -> bool:
    """True for a plain path or a ``file:`` URI: a folder this machine's file system holds."""
    return scheme(location) in (None, "file")


_OBJECT_STORES = frozenset({"s3a", "s3", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos"})


def is_object_store(location: str) -> bool:
    """True for an object-store URI (``s3a://``, ``gs://``, ``abfss://``, ...): no rename, no settable times."""
    return scheme(location) in _OBJECT_STORES


def local_path(location: str) -> str:
    """The file-system path of a local location (``file:/x``, ``file:///x`` and ``/x`` are the same folder).

    Raises DefinitionError (a ValueError) for an object-store URI: the caller is local-only and must say so."""
    if not is_local(location):
        raise DefinitionError(f"{location!r} is not a local path or file: URI")
    if location.lower().startswith("file://"):
        return location[len("file://") :] or "/"
    if location.lower().startswith("file:"):
        return location[len("file:") :]
    return location


def join(root: str, *parts: str) -> str:
    """``root`` with ``parts`` appended, one ``/`` between each; the scheme and authority are kept as given."""
    out = root.rstrip("/") if root.rstrip("/") else root
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}" if not out.endswith("/") else f"{out}{part}"
    return out


# Hadoop's scheme names against those of pyarrow's (and the object stores' own) file systems.
_PYARROW_SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "s3n": "s3",
    "abfss": "abfss",
    "abfs": "abfs",
    "gs": "gs",
    "gcs": "gs",
    "hdfs": "hdfs",
}


def pyarrow_filesystem(location: str):
    """(pyarrow file system, path within it) for reading a location without Spark (a sensor, a health check).

    Object stores take their settings from the SDKs' environment variables (``AWS_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``, ...; ``AZURE_STORAGE_*``; Google's application default credentials), the same ones
    delta-rs reads."""
    import pyarrow.fs as pafs

    if is_local(location):
        return pafs.LocalFileSystem(), local_path(location)
    name = scheme(location)
    mapped = _PYARROW_SCHEMES.get(name or "")
    if mapped is None:
        raise DefinitionError(
            f"{location!r}: no reader without Spark for scheme {name!r}; valid: {sorted(_PYARROW_SCHEMES)} and local"
        )
    return pafs.FileSystem.from_uri(mapped + location[len(name) :])  # pyright: ignore[reportArgumentType]
