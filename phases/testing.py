"""Testing your own pipelines: two-phase against one streaming job, for any cut-off.

The helpers need no test framework; the fixtures that go with them (``phases_spark``, ``delta_source``,
``phases_kafka``) are the pytest plugin :mod:`phases.pytest_plugin`, which pytest loads by itself once the package
is installed with its ``testing`` extra (``pip install "two-phase-pipelines[testing]"``: pytest and hypothesis).

- :func:`run_two_phase`: your pipeline moved under a scratch folder, the first ``cutoff`` versions through the
  backlog, the rest through the live phase; returns the sink and the quarantine (a topic sink: what a read_committed
  consumer reads of a topic made for the run, :func:`phases.read_topic`);
- :func:`run_streaming`: the same pipeline as one streaming job over all versions (the reference the
  two-phase run must equal);
- :func:`assert_equivalent`: both, for every cut-off (or the ones you name), with a readable diff of the rows
  that differ;
- :func:`event_versions`: a hypothesis strategy of versions of ``(key, ts, value)`` rows (the shape of
  :data:`phases._internal.sources.feed.EVENT_SCHEMA`), for property tests (needs ``hypothesis``).

A Dagster-level helper (materialize a pipeline's assets and run their checks in pytest) is in
:mod:`phases_dagster.testing` (this module never imports Dagster).
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from phases._internal.definition import KafkaSink, Pipeline
from phases._internal.errors import DefinitionError, SetupError
from phases._internal.placement import Placement
from phases._internal.runtime.local_kafka import create_topic
from phases._internal.sources import feed as sources
from phases._internal.storage import tables
from phases._internal.topics.sink import read_topic

Version = Sequence[tuple] | Sequence[dict] | pd.DataFrame


@dataclass(frozen=True)
class RunResult:
    """What a run left: the sink's rows and the quarantine's (source version, record JSON, reason) rows, both
    as pandas frames sorted by every column so that two runs compare row by row."""

    sink: pd.DataFrame
    quarantine: pd.DataFrame


__all__ = [
    "EPOCH",
    "RunResult",
    "append_versions",
    "assert_equivalent",
    "event_versions",
    "frame_diff",
    "relocate",
    "run_streaming",
    "run_two_phase",
    "write_versions",
]


# --- sources -------------------------------------------------------------------------------------------


def _frame(spark: SparkSession, version: Version, schema: T.StructType) -> DataFrame:
    if isinstance(version, pd.DataFrame):
        return spark.createDataFrame(version, schema)
    rows = list(version)
    if rows and isinstance(rows[0], dict):
        rows = [tuple(r.get(f.name) for f in schema.fields) for r in rows]  # pyright: ignore[reportAttributeAccessIssue]
    return spark.createDataFrame(rows, schema)


def write_versions(
    spark: SparkSession, path: str, versions: Sequence[Version], schema: T.StructType | str = sources.EVENT_SCHEMA
) -> None:
    """A fresh source table at ``path`` (version 0 empty) whose versions 1..n hold ``versions``."""
    sources.create_source(spark, path, schema)
    append_versions(spark, path, versions)


def append_versions(spark: SparkSession, path: str, versions: Sequence[Version]) -> None:
    """Appends ``versions`` to the source table at ``path``, one commit each."""
    struct = spark.read.format("delta").load(path).schema
    for version in versions:
        sources.append(spark, path, _frame(spark, version, struct))


# --- runs ----------------------------------------------------------------------------------------------


def relocate(pipeline: Pipeline, root: str | Path, source: str) -> Placement:
    """Where the kit runs ``pipeline``: reading ``source``, writing its sink and every engine table under ``root`` (a
    topic sink: into a topic of the run's own, beside the one the definition names). The definition itself is
    untouched: its fingerprint is the declared one."""
    if pipeline.inputs.two:
        raise DefinitionError(
            f"pipeline {pipeline.name!r} has two inputs; phases.testing runs one-input pipelines. Test a two-input "
            "pipeline with its own source tables: write the versions of each input yourself, then run "
            "BacklogRunner(spark, pipeline).run() and LiveRunner.from_manifest(spark, pipeline)"
        )
    if not hasattr(pipeline.source, "path"):
        raise DefinitionError(
            f"pipeline {pipeline.name!r} reads a {pipeline.source.kind} source; phases.testing writes the versions "
            "into a Delta table of the run's own: give the pipeline a DeltaSource (any path: the kit reads its own)"
        )
    root = str(root).rstrip("/")
    topic = None
    if isinstance(pipeline.sink, KafkaSink):  # a topic of the run's own, beside the one the definition names
        topic = f"{pipeline.sink.topic}.{hashlib.sha1(root.encode()).hexdigest()[:12]}"
    return Placement(
        pipeline, source_path_at=source, engine_root_at=root, sink_path_at=f"{root}/sink", sink_topic_at=topic
    )


def _create_topic(where: Placement) -> None:
    """A topic sink's topic for a run of the kit (three partitions, on the sink's brokers)."""
    sink = where.definition.sink
    if isinstance(sink, KafkaSink):
        create_topic(where.sink_brokers, where.topic(), 3, client_config=sink.client_options)


def _result(spark: SparkSession, where: Placement) -> RunResult:
    exists = tables.exists(spark, where.sink_path)
    if isinstance(where.definition.sink, KafkaSink):  # what a read_committed consumer reads, folded as its mode says
        sink = read_topic(spark, where).toPandas() if exists else None
    else:
        sink = spark.read.format("delta").load(where.sink_path).toPandas() if exists else None
    q_path = where.quarantine
    columns = ["source_version", "record", "reason"]
    if tables.exists(spark, q_path):
        quarantine = spark.read.format("delta").load(q_path).select(*columns).toPandas()
    else:
        quarantine = pd.DataFrame(columns=columns)  # pyright: ignore[reportArgumentType]
    return RunResult(_sorted(sink if sink is not None else pd.DataFrame()), _sorted(quarantine))


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame.reset_index(drop=True)
    keys = [c for c in frame.columns if frame[c].map(lambda v: isinstance(v, (list, dict))).sum() == 0]
    return frame.sort_values(keys, kind="stable", na_position="first").reset_index(drop=True)


def run_two_phase(
    spark: SparkSession,
    pipeline: Pipeline,
    versions: Sequence[Version],
    cutoff: int,
    *,
    work: str | Path,
    schema: T.StructType | str = sources.EVENT_SCHEMA,
) -> RunResult:
    """Versions ``1..cutoff`` through the backlog, the switch, then the rest through the live phase (one
    ``availableNow`` run), all under ``work``; returns the sink and the quarantine."""
    from phases._internal.backlog.runner import BacklogRunner
    from phases._internal.live.runner import LiveRunner

    if not 0 <= cutoff <= len(versions):
        raise DefinitionError(
            f"run_two_phase: cutoff {cutoff} is not in 0..{len(versions)} (0: everything through the live phase; "
            f"{len(versions)}, the number of versions: everything through the backlog)"
        )
    work = str(work).rstrip("/")
    source = f"{work}/source"
    write_versions(spark, source, versions[:cutoff], schema)
    where = relocate(pipeline, f"{work}/run", source)
    _create_topic(where)
    BacklogRunner.at(spark, where).run()
    append_versions(spark, source, versions[cutoff:])
    LiveRunner.at(spark, where).start(available_now=True)
    return _result(spark, where)


def run_streaming(
    spark: SparkSession,
    pipeline: Pipeline,
    versions: Sequence[Version],
    *,
    work: str | Path,
    schema: T.StructType | str = sources.EVENT_SCHEMA,
) -> RunResult:
    """One streaming job over every version from the first (no backlog), under ``work``."""
    from phases._internal.live.runner import LiveRunner

    work = str(work).rstrip("/")
    source = f"{work}/source"
    write_versions(spark, source, versions, schema)
    where = relocate(pipeline, f"{work}/run", source)
    _create_topic(where)
    LiveRunner.streaming_only_at(spark, where).start(available_now=True)
    return _result(spark, where)


def frame_diff(expected: pd.DataFrame, actual: pd.DataFrame, what: str) -> str:
    """'' when the frames hold the same rows (as multisets; floats to 9 decimals); otherwise the rows that only
    one side has, readably (at most 50)."""
    columns = list(expected.columns if len(expected.columns) else actual.columns)

    def bag(frame: pd.DataFrame) -> Counter:
        if frame.empty:
            return Counter()
        frame = frame.reindex(columns=columns)
        return Counter(tuple(_comparable(v) for v in row) for row in frame.itertuples(index=False, name=None))

    want, have = bag(expected), bag(actual)
    missing, extra = want - have, have - want
    if not missing and not extra:
        return ""
    lines = [f"{what}: {sum(missing.values())} row(s) only in the reference, {sum(extra.values())} only in two-phase"]
    for side, rows in (("reference (one streaming job)", missing), ("two-phase", extra)):
        for row, n in sorted(rows.items(), key=repr):
            shown = ", ".join(f"{c}={v!r}" for c, v in zip(columns, row, strict=True))
            lines.append(f"  only in {side}{f' ({n}x)' if n > 1 else ''}: {shown}")
    return "\n".join(lines[:51]) + ("\n  ..." if len(lines) > 51 else "")


def _comparable(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return repr(value)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if isinstance(value, float):
        return round(value, 9)
    return value


def assert_equivalent(
    spark: SparkSession,
    pipeline: Pipeline,
    versions: Sequence[Version],
    *,
    work: str | Path,
    cutoffs: Sequence[int] | None = None,
    schema: T.StructType | str = sources.EVENT_SCHEMA,
) -> None:
    """Raises AssertionError unless, for every cut-off (default: each of 0..len(versions)), the two-phase run
    leaves the same sink and quarantine as one streaming job over all the versions; the message lists the
    rows that differ."""
    work = Path(work)
    reference = run_streaming(spark, pipeline, versions, work=work / f"streaming-{uuid.uuid4().hex[:6]}", schema=schema)
    problems = []
    for cutoff in range(len(versions) + 1) if cutoffs is None else cutoffs:
        got = run_two_phase(
            spark, pipeline, versions, cutoff, work=work / f"cutoff-{cutoff}-{uuid.uuid4().hex[:6]}", schema=schema
        )
        for what, want, have in (
            ("sink", reference.sink, got.sink),
            ("quarantine", reference.quarantine, got.quarantine),
        ):
            diff = frame_diff(want, have, f"cut-off after version {cutoff}, {what}")
            if diff:
                problems.append(diff)
    if problems:
        raise AssertionError(f"pipeline {pipeline.name!r}: two-phase != one streaming job\n" + "\n".join(problems))


# --- hypothesis ----------------------------------------------------------------------------------------

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def event_versions(
    *,
    keys: Sequence[str] = ("a", "b", "c", "d"),
    max_versions: int = 4,
    max_rows: int = 6,
    max_seconds: int = 120,
    values: tuple[int, int] = (-5, 50),
    nulls: bool = True,
):
    """A hypothesis strategy of versions: lists of ``(key, ts, value)`` rows, ``ts`` within ``max_seconds`` of
    2026-01-01 (so records arrive out of order and some late), ``value`` possibly null when ``nulls``."""
    st = _extra_module("hypothesis.strategies", "event_versions")

    value = st.integers(*values)
    row = st.tuples(
        st.sampled_from(list(keys)),
        st.integers(0, max_seconds * 1000).map(lambda ms: EPOCH + timedelta(milliseconds=ms)),
        st.one_of(st.none(), value) if nulls else value,
    )
    return st.lists(st.lists(row, max_size=max_rows), min_size=1, max_size=max_versions)


def _extra_module(name: str, needed_by: str):
    """``name`` imported, or SetupError saying which extra installs it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SetupError(
            f"{needed_by} needs {name.split('.')[0]}, which the package's testing extra installs: "
            'pip install "two-phase-pipelines[testing]"'
        ) from exc
