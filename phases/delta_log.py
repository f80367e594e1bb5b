"""The head version of a Delta table read from its log folder, without Spark (for sensors).

A Dagster sensor must answer in seconds and should not start a JVM; the head version is the highest
``NNNNNNNNNNNNNNNNNNNN.json`` commit file in ``_delta_log``. Local paths and ``file:`` URIs only.
"""

from __future__ import annotations

import re
from pathlib import Path

from phases.errors import SourceError

_COMMIT = re.compile(r"^(\d{20})\.json$")


def _local(path: str) -> Path:
    if path.startswith("file://"):
        return Path(path[len("file://") :])
    if path.startswith("file:"):
        return Path(path[len("file:") :])
    if "://" in path:
        raise SourceError(
            f"cannot list the Delta log of {path} without Spark: only local paths and file: URIs are supported "
            "by the switch sensor's head-version probe"
        )
    return Path(path)


def head_version(path: str) -> int | None:
    """The table's latest commit version, or None when ``path`` holds no Delta table."""
    log = _local(path) / "_delta_log"
    if not log.is_dir():
        return None
    versions = [int(m.group(1)) for name in (p.name for p in log.iterdir()) if (m := _COMMIT.match(name))]
    return max(versions) if versions else None
