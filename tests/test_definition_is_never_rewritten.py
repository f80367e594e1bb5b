"""The user's definition reaches every room as declared: a backlog through Dagster (its asset and checks), a catch-up
increment, a live phase, a redeploy and its rollback run with relative paths under a storage root while every way of
copying a ``Pipeline`` raises; each result equals the reference. The same run counts how often a definition is placed
(the redeploy log read, a placement made), and the static walk (``scripts/definition_walk.py``) must count the same
for the Dagster steps."""

from __future__ import annotations

import pytest

from phases import BacklogRunner, LiveRunner, Pipeline, Redeploy, place
from phases._internal.definition.model import SettingsModel
from phases._internal.deployment import binding
from phases_dagster.testing import materialize_backlog
from scripts.definition_walk import measure
from tests.helpers import append_version, assert_results_equal, sink_rows, write_source
from tests.phases.redeploy.test_redeploy import _expected_new, _expected_old, _new, _old, _upto, _version

COPIES = ("model_copy", "copy", "__copy__", "__deepcopy__")


def _forbid_copies(monkeypatch) -> list[str]:
    """Every copy of a Pipeline raises (and is recorded, should a caller swallow the error)."""
    made: list[str] = []

    def refuse(name):
        original = getattr(SettingsModel, name, None)

        def method(self, *args, **kwargs):
            if isinstance(self, Pipeline):
                made.append(name)
                raise AssertionError(f"the engine copied the user's definition ({name})")
            return original(self, *args, **kwargs)  # type: ignore[misc]

        return method

    for name in COPIES:
        monkeypatch.setattr(Pipeline, name, refuse(name), raising=False)
    return made


def _count_placings(monkeypatch) -> list[str]:
    """Every placement made (``place`` and a direct ``settle`` both settle: the redeploy log read once)."""
    placed: list[str] = []
    real = binding.settle

    def counted(spark, where, **kwargs):
        placed.append(where.name)
        return real(spark, where, **kwargs)

    monkeypatch.setattr(binding, "settle", counted)
    return placed


@pytest.mark.slow
def test_every_phase_runs_the_declared_definition_and_never_copies_it(spark, tmp_path, monkeypatch):
    root = str(tmp_path / "data")
    versions = {i: _version(i) for i in range(1, 7)}
    write_source(spark, f"{root}/source", _upto(versions, 3))
    old, new = _old("source", "engine"), _new("source", "engine")  # relative: under the storage root
    assert old.sink.path == "engine/sink"
    copies = _forbid_copies(monkeypatch)
    placings = _count_placings(monkeypatch)

    # The Dagster steps: the backlog asset and its checks, each placing the definition once.
    result = materialize_backlog(spark, old, root=root)
    assert result.success and all(result.checks.values()), result.checks
    walks = [
        measure(f"phases_dagster/{e}:pipeline")
        for e in ("backlog.py:build_backlog_assets", "checks.py:build_backlog_checks")
    ]
    assert len(placings) == sum(len(w["binds"]) for w in walks) == 2, (placings, [w["binds"] for w in walks])
    assert [w["copies"] for w in walks] == [[], []]

    # A catch-up increment, then the live phase, each placed once at its entry.
    append_version(spark, f"{root}/source", versions[4])
    BacklogRunner.at(spark, place(spark, old, root=root)).run_increment()
    append_version(spark, f"{root}/source", versions[5])
    LiveRunner.at(spark, place(spark, old, root=root)).start(available_now=True)
    where = place(spark, old, root=root)
    assert_results_equal(sink_rows(spark, where.sink_path), _expected_old(_upto(versions, 5)))

    # A redeploy of the changed definition, its live phase, then the rollback to the old one.
    assert Redeploy.at(spark, place(spark, new, root=root)).run(reason="wider").swapped
    append_version(spark, f"{root}/source", versions[6])
    LiveRunner.at(spark, place(spark, new, root=root)).start(available_now=True)
    assert_results_equal(sink_rows(spark, where.sink_path), _expected_new(versions))
    assert Redeploy.at(spark, place(spark, old, root=root)).run(reason="roll back").swapped
    LiveRunner.at(spark, place(spark, old, root=root)).start(available_now=True)
    assert_results_equal(sink_rows(spark, where.sink_path), _expected_old(versions))

    assert copies == [] and old.sink.path == "engine/sink" and old.source.path == "source"
