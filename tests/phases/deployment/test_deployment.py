"""Where a definition runs is a value of its own (:class:`phases.Placement`), placed once at each entry point
(:func:`phases.place`): the definition carries no engine state and is never copied, a placement is immutable and
derives every path from the declaration, and a runner given a placement reads the redeploy log no more before its
start."""

from __future__ import annotations

import dataclasses

import pytest

from phases import Placement, place
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Locations, Pipeline, fingerprint_of
from phases._internal.deployment import generations
from phases._internal.errors import PhaseStateError
from phases._internal.live.runner import LiveRunner
from tests.conftest import make_pipeline
from tests.helpers import write_source
from tests.phases.backlog.test_backlog import DELAY_S, VERSIONS, S


def _engine_fields(model: type) -> list[str]:
    """Fields of a definition model documented as set by the engine (none may be)."""
    found = []
    for name, f in model.model_fields.items():
        if "engine" in (f.description or "").lower() and "set" in (f.description or "").lower():
            found.append(f"{model.__name__}.{name}")
    return found


def test_the_definition_carries_no_engine_state():
    assert set(Locations.model_fields) == {"root"}
    assert _engine_fields(Pipeline) == [] and _engine_fields(Locations) == []


def test_a_placement_derives_every_path_from_the_declaration_and_never_changes_it(tmp_path):
    p = make_pipeline("rel/source", "engine").model_copy(update={"sink": make_pipeline("x", "y").sink})
    where = place(None, p, root=str(tmp_path))  # no redeploy log: generation 0 serves
    assert where.definition is p and p.locations.root == "engine" and p.source.path == "rel/source"
    assert (where.generation, where.serving, where.redeployed) == (0, True, False)
    assert where.source_path(p.source) == f"{tmp_path}/rel/source"
    assert where.quarantine == f"{tmp_path}/engine/quarantine" and where.sink_path == f"{tmp_path}/y/sink"
    assert where.redeploy_log == f"{tmp_path}/engine/redeploys"
    with pytest.raises(dataclasses.FrozenInstanceError):
        where.generation = 1  # type: ignore[misc]
    built = where.at(2, serving=False)
    assert built.engine_root == f"{tmp_path}/engine/generations/2" and built.definition is p
    assert built.sink_path == f"{tmp_path}/engine/generations/2/sink"
    assert built.consumer_sink == where.sink_path and built.redeploy_log == where.redeploy_log
    assert built.lease("live") == f"{tmp_path}/engine/generations/2/leases/events.live.json"
    with pytest.raises(TypeError, match="takes a phases.Pipeline"):
        place(None, where)  # type: ignore[arg-type]


def test_the_fingerprint_is_the_declarations_wherever_it_runs(tmp_path):
    p = make_pipeline("rel/source", "engine")
    here, there = place(None, p, root=str(tmp_path / "a")), place(None, p, root=str(tmp_path / "b"))
    assert here.fingerprint() == there.fingerprint() == p.fingerprint()
    assert here.at(3, serving=False).fingerprint() == p.fingerprint()
    # What the engine wrote before: the fingerprint of the definition with its source path resolved. Accepted.
    spec = p.state_spec()
    spec["source"] = {**spec["source"], "path": f"{tmp_path}/a/rel/source"}
    assert here.is_fingerprint(fingerprint_of(spec)) and not there.is_fingerprint(fingerprint_of(spec))
    assert here.fingerprints[0] == p.fingerprint()


def test_a_handoff_named_by_the_resolved_definition_still_starts_its_live_phase(spark, tmp_path):
    """A manifest written before the placement was a value of its own carries the fingerprint of the definition
    with its relative paths resolved: its live phase starts, and the sink equals the reference."""
    from phases._internal.handoff import manifest
    from tests import reference
    from tests.helpers import append_version, assert_results_equal, sink_rows

    write_source(spark, f"{tmp_path}/rel/source", VERSIONS)
    p = make_pipeline("rel/source", "engine", delay_s=DELAY_S).model_copy(
        update={"sink": make_pipeline("x", "out").sink}
    )
    where = place(spark, p, root=str(tmp_path))
    BacklogRunner.at(spark, where).run()
    handoff = manifest.latest(spark, where.manifests, p.name)
    legacy = where.placed_fingerprint()
    assert legacy != p.fingerprint() and handoff.fingerprint == p.fingerprint()
    spark.sql(f"UPDATE delta.`{where.manifests}` SET fingerprint = '{legacy}'")  # as the earlier engine wrote it
    more = [("a", 70 * S, 10), ("e", 66 * S, 11)]
    append_version(spark, f"{tmp_path}/rel/source", more)
    LiveRunner.at(spark, place(spark, p, root=str(tmp_path))).start(available_now=True)
    expected, _ = reference.run({**VERSIONS, 4: more}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, where.sink_path), expected)


def test_a_runner_given_a_placement_reads_the_log_no_more_until_its_start(spark, tmp_path, monkeypatch):
    write_source(spark, f"{tmp_path}/source", VERSIONS)
    p = make_pipeline(f"{tmp_path}/source", str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    where = place(spark, p)
    reads = []
    real_read = generations.read

    def counting_read(spark_, placed):
        assert isinstance(placed, Placement)
        reads.append(placed.name)
        return real_read(spark_, placed)

    monkeypatch.setattr(generations, "read", counting_read)
    runner = LiveRunner.at(spark, where)
    assert runner.placement is where and reads == []
    BacklogRunner.at(spark, where)
    assert reads == []
    # A definition is placed once at the entry: one read of the log.
    LiveRunner.from_manifest(spark, p)
    assert reads == ["events"]
    # The start checks again that the generation still serves (a swap since would refuse it).
    reads.clear()
    runner.start(available_now=True)
    assert reads == ["events"]


def test_a_redeploy_log_written_with_a_step_column_is_read_and_appended_to_as_it_is(spark, tmp_path):
    """Logs written before the column was named ``kind`` name it ``step``: their rows are read by kind, and a new
    row goes under the column the table has (no schema change)."""
    from pyspark.sql import types as T

    from phases._internal.storage import table_stats

    p = make_pipeline(f"{tmp_path}/source", str(tmp_path / "run"))
    where = place(None, p)
    legacy = T.StructType(
        [T.StructField("step", f.dataType, f.nullable) if f.name == "kind" else f for f in generations.SCHEMA.fields]
    )
    blank = {f.name: None for f in legacy.fields}
    rows = [
        {**blank, "pipeline": "events", "redeploy_id": "r1", "step": kind, "generation": 1, "at_us": at}
        for kind, at in (("started", 1), ("swapping", 2), ("swapped", 3), ("started", 4))
    ]
    rows[2]["from_generation"] = 0
    rows[3].update(redeploy_id="r2", generation=2)
    spark.createDataFrame(rows, legacy).write.format("delta").save(where.redeploy_log)

    assert place(spark, p).generation == 1  # the newest swapped row, read from the step column
    generations.write(spark, where, "abandoned", 2, "r2", reason="test")
    gens = generations.read(spark, where)
    assert [r.kind for r in gens.rows] == ["started", "swapping", "swapped", "started", "abandoned"]
    assert gens.serving == 1 and gens.gone == {2}
    assert "kind" not in table_stats.column_types(where.redeploy_log)
    with pytest.raises(PhaseStateError, match="not one of started, amended"):
        generations.write(spark, where, "swept", 2, "r2")

    fresh = place(None, make_pipeline(f"{tmp_path}/source", str(tmp_path / "new")))
    generations.write(spark, fresh, "started", 1, "r3")
    assert "kind" in table_stats.column_types(fresh.redeploy_log)
    assert [r.kind for r in generations.read(spark, fresh).rows] == ["started"]


def test_relative_paths_without_a_storage_root_resolve_under_the_working_directory_through_backlog_and_live(
    spark, tmp_path, monkeypatch
):
    """Run from Python with relative paths and no storage root, a definition's paths are under the process's working
    directory, for Spark's writes, its SQL (``ALTER TABLE delta.`path```, which takes an absolute path only) and the
    Python reads alike. (The live start used to fail: the sink's ``ALTER TABLE delta.`out/sink``` named no table, and
    Spark's writes went under the JVM's working directory, not the process's.)"""
    from tests import reference
    from tests.helpers import append_version, assert_results_equal, sink_rows

    monkeypatch.chdir(tmp_path)
    write_source(spark, f"{tmp_path}/source", VERSIONS)
    p = make_pipeline("source", "run", delay_s=DELAY_S).model_copy(update={"sink": make_pipeline("x", "out").sink})
    where = place(spark, p)
    assert where.sink_path == f"{tmp_path}/out/sink" and where.engine_root == f"{tmp_path}/run"
    assert where.definition is p and p.sink.path == "out/sink"
    BacklogRunner(spark, p).run()
    more = [("a", 70 * S, 10), ("e", 66 * S, 11)]
    append_version(spark, f"{tmp_path}/source", more)
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    expected, _ = reference.run({**VERSIONS, 4: more}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, f"{tmp_path}/out/sink"), expected)
