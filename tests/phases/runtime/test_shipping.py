"""The archive shipped to a cluster's executors holds the named packages' sources and imports from itself."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from phases._internal.errors import SetupError
from phases._internal.runtime import shipping


def test_the_archive_holds_the_packages_and_imports_without_the_project(tmp_path):
    archive = shipping.package_archive(tmp_path, ["phases", "tests"])
    names = zipfile.ZipFile(archive).namelist()
    assert "phases/__init__.py" in names and "phases/_internal/operators/keyed_aggregate.py" in names
    assert "tests/phases/operators/process_functions.py" in names
    assert not any("__pycache__" in n for n in names)
    assert shipping.package_archive(tmp_path, ["tests", "phases"]) == archive  # same sources, same archive
    # A bare interpreter (-S: no site-packages, so no editable install of the project) imports the engine's
    # definitions from the archive alone, from a folder that is not the project's.
    code = "import sys; sys.path.insert(0, sys.argv[1]); import phases._internal.uris as u; print(u.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", code, archive], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(archive)


@pytest.mark.parametrize(
    ("package", "message"),
    [
        ("phases._internal.operators", "top-level"),
        ("no_such_package_x", "does not import"),
        ("json.decoder", "top-level"),
    ],
)
def test_what_cannot_be_shipped_is_named(tmp_path, package, message):
    with pytest.raises(SetupError, match=message):
        shipping.package_archive(tmp_path, [package])
