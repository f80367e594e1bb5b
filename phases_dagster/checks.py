"""Blocking asset checks on the backlog's handoff: a bad state is never handed to the live phase.

The switch sensor launches the live phase only for a materialization whose checks all passed.
"""

import operator
from collections.abc import Iterator
from functools import reduce

import dagster as dg
from pyspark.sql import functions as F

from phases import HandoffManifest, ManifestError, Pipeline, Placement, inspect
from phases_dagster.handoff_events import read_handoff
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration

STATE_MATCHES_MANIFEST = "state_matches_manifest"
KEYS_UNIQUE = "state_keys_unique"
WATERMARK_BOUND = "watermark_not_after_max_event_time"
QUARANTINE_BOUND = "quarantine_within_bound"
SINK_CONSISTENT = "sink_row_count_consistent"
CHECK_NAMES = (STATE_MATCHES_MANIFEST, KEYS_UNIQUE, WATERMARK_BOUND, QUARANTINE_BOUND, SINK_CONSISTENT)
NO_FAR_FUTURE = "no_far_future_events"  # a warning, not blocking: those records are quarantined, not lost

DESCRIPTIONS = {
    STATE_MATCHES_MANIFEST: "The manifest matches the pipeline definition, and its state table's version and "
    "row count are the ones recorded.",
    KEYS_UNIQUE: "Each key appears once in the handed-over state.",
    WATERMARK_BOUND: "Final watermark <= max event time, and that max equals the state's max event time.",
    QUARANTINE_BOUND: "Quarantined (late + invalid) rows are within the configured fraction of the input.",
    SINK_CONSISTENT: "The sink holds the rows the manifest recorded (keyed: one per key of the state; windowed: "
    "the emitted windows).",
    NO_FAR_FUTURE: "No backlog record was more than max_future after its version's commit (such records are "
    "quarantined with reason 'future' and do not move the watermark). A warning: it never blocks the switch.",
}


def build_backlog_checks(pipeline: Pipeline, settings: Orchestration) -> dg.AssetChecksDefinition:
    names = Names(pipeline)
    key = dg.AssetKey(names.backlog)
    bound = settings.checks.max_quarantine_fraction
    specs = [dg.AssetCheckSpec(n, asset=key, blocking=True, description=DESCRIPTIONS[n]) for n in CHECK_NAMES]
    specs.append(dg.AssetCheckSpec(NO_FAR_FUTURE, asset=key, description=DESCRIPTIONS[NO_FAR_FUTURE]))

    @dg.multi_asset_check(specs=specs, name=names.checks)
    def backlog_checks(context: dg.AssetCheckExecutionContext, spark: SparkResource, storage: StorageResource):
        where = storage.placement(pipeline)
        session = spark.session()
        latest = read_handoff(context.instance, key)
        manifest_id = latest.manifest_id if latest is not None else None
        try:
            handoff = inspect.latest_handoff(session, where, manifest_id)
        except ManifestError as exc:
            for n in (*CHECK_NAMES, NO_FAR_FUTURE):
                yield dg.AssetCheckResult(asset_key=key, check_name=n, passed=False, metadata={"error": str(exc)})
            return
        yield from handoff_check_results(session, where, handoff, key, bound)

    return backlog_checks


def handoff_check_results(
    session, where: Placement, handoff: HandoffManifest, key: dg.AssetKey, bound: float
) -> Iterator[dg.AssetCheckResult]:
    """The checks of one handoff (:data:`CHECK_NAMES`, then the :data:`NO_FAR_FUTURE` warning) on asset ``key``: the
    backlog's, and a redeploy's new generation's (whose live phase may have run on its own sink since: its sink
    then holds more rows than the handoff, one per key for an upserting kind)."""

    p = where.definition
    try:
        inspect.check_handoff_matches(session, handoff, where)
        yield dg.AssetCheckResult(asset_key=key, check_name=STATE_MATCHES_MANIFEST, passed=True)
    except ManifestError as exc:
        yield dg.AssetCheckResult(
            asset_key=key, check_name=STATE_MATCHES_MANIFEST, passed=False, metadata={"error": str(exc)}
        )

    state = session.read.format("delta").load(handoff.state_path)
    keys = p.state_keys
    event_time = inspect.state_event_time(p)  # the state's greatest event time per row, if it keeps one
    row = state.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_distinct(*[F.col(k) for k in keys]).alias("distinct"),
        F.count(F.when(reduce(operator.or_, [F.col(k).isNull() for k in keys]), 1)).alias("null_keys"),
        (F.max(F.unix_micros(F.col(event_time))) if event_time else F.lit(None)).alias("max_us"),
    ).collect()[0]
    # count_distinct skips keys with a null part; count those separately (the engine never aggregates them).
    dupes = int(row["rows"]) - int(row["distinct"]) - int(row["null_keys"])
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=KEYS_UNIQUE,
        passed=dupes == 0 and int(row["null_keys"]) == 0,
        metadata={"rows": int(row["rows"]), "duplicate_rows": dupes, "null_key_rows": int(row["null_keys"])},
    )

    wm, max_us, state_max = handoff.final_watermark_us, handoff.backlog_max_event_time_us, row["max_us"]
    # Filter steps may drop the records that set the maximum before they reach the state; a two-input
    # operator keeps only the rows that can still match (and its manifest max is the left input's).
    partial = any(step.kind == "filter" for step in p.steps) or p.inputs.two
    inputs_max = max((m for m in (max_us, handoff.right_max_event_time_us) if m is not None), default=None)
    state_ok = state_max == max_us or (
        partial and (state_max is None or (inputs_max is not None and state_max <= inputs_max))
    )
    ok = (wm is None and max_us is None and state_max is None) or (
        wm is not None and max_us is not None and wm <= max_us and state_ok
    )
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=WATERMARK_BOUND,
        passed=ok,
        metadata={
            "final_watermark_us": wm if wm is not None else -1,
            "manifest_max_event_time_us": max_us if max_us is not None else -1,
            "state_max_event_time_us": int(state_max) if state_max is not None else -1,
        },
    )

    q_total = inspect.quarantined_rows(session, where, "backlog")
    fraction = handoff.quarantined_rows / handoff.input_rows if handoff.input_rows else 0.0
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=QUARANTINE_BOUND,
        passed=fraction <= bound and q_total >= handoff.quarantined_rows,
        metadata={
            "quarantined_rows": handoff.quarantined_rows,
            "quarantine_table_backlog_rows": q_total,
            "fraction": round(fraction, 6),
            "bound": bound,
        },
    )

    # Keyed: one sink row per key of the state. Windowed: the emitted windows the manifest counted. Once the live
    # phase wrote the sink (a redeploy's generation is checked after it caught up): an upserting kind still has one
    # row per key, and an appending kind at least the handoff's rows.
    expected_sink = handoff.sink_rows if handoff.sink_rows is not None else handoff.state_rows
    sink_rows, distinct = -1, -1
    if inspect.table_exists(session, where.sink_path):
        sink = session.read.format("delta").load(where.sink_path)
        keyed = [F.count_distinct(*[F.col(k) for k in p.state_keys])] if p.operator.upserts else [F.lit(-1)]
        counted = sink.agg(F.count(F.lit(1)), *keyed).collect()[0]
        sink_rows, distinct = int(counted[0]), int(counted[1])
    if not inspect.live_started(session, where, handoff.manifest_id):
        passed = sink_rows == expected_sink
    elif p.operator.upserts and p.sink.mode == "upsert":
        passed = sink_rows == distinct and sink_rows >= expected_sink
    else:
        passed = sink_rows >= expected_sink
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=SINK_CONSISTENT,
        passed=passed,
        metadata={
            "sink_rows": sink_rows,
            "distinct_sink_keys": distinct,
            "expected_sink_rows": expected_sink,
            "state_rows": handoff.state_rows,
        },
    )

    future = handoff.future_rows or 0
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=NO_FAR_FUTURE,
        passed=future == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "future_rows": future,
            "max_future": str(p.max_future) if p.max_future is not None else "off",
        },
    )
