"""Python code shipped to a cluster's executors, the way ``spark-submit --py-files`` ships it.

On ``local[N]`` every Python worker is a child of the driver's machine and finds the engine (and the user's
functions) where the driver does. On a cluster the workers have only what their environment installed (pyspark,
pandas, pyarrow, protobuf) and what the application ships: :func:`package_archive` zips the engine's packages and
the user's own (the modules of process functions, co-group and map-partition functions), and
:class:`phases._internal.runtime.session.SparkSettings` ``py_files`` adds the archive to the SparkContext, which puts it
on every executor's Python path.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path

from phases._internal.errors import SetupError

ENGINE_PACKAGES = ("phases",)
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # zip entries with one timestamp: the same sources give the same archive


def _top_level_folder(package: str) -> Path:
    if "." in package:
        top = package.split(".")[0]
        raise SetupError(f"ship whole top-level packages: {package!r} names a subpackage; give {top!r}")
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise SetupError(f"cannot ship package {package!r}: it does not import here ({exc})") from exc
    paths = list(getattr(module, "__path__", []))
    if not paths:
        raise SetupError(f"cannot ship {package!r}: it is a module, not a package (a folder with __init__.py)")
    return Path(paths[0])


def package_archive(dest_dir: str | os.PathLike, packages: Iterable[str] = ENGINE_PACKAGES) -> str:
    """Zips the Python sources of the top-level ``packages`` (the engine's by default; add the packages that
    hold your functions) into ``dest_dir`` and returns the archive's path. The name carries a hash of the
    content, so a changed package never reuses an archive an executor already holds."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in sorted(set(packages)):
            folder = _top_level_folder(package)
            for path in sorted(folder.rglob("*.py")):
                if "__pycache__" in path.parts:
                    continue
                name = f"{package}/{path.relative_to(folder).as_posix()}"
                archive.writestr(zipfile.ZipInfo(name, _FIXED_TIME), path.read_bytes())
    data = buffer.getvalue()
    target = Path(dest_dir) / f"pyfiles-{hashlib.sha256(data).hexdigest()[:12]}.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return str(target)
