"""The backlog assets of a pipeline: the backlog phase (state + handoff manifest) and its daily slices."""

import json
from datetime import date
from enum import Enum

import dagster as dg
from pydantic import Field

from phases import BacklogRunner, HandoffManifest, Pipeline, PipelineSource, SliceRunner
from phases.inspect import SliceRecord, newest_handoff_row
from phases_dagster import catalog
from phases_dagster.progress import reporting
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration

NOT_RUN_TAG = "phases/not_run"  # on a run whose backlog step did nothing, and why


class BacklogMode(Enum):
    full = "full"
    increment = "increment"
    slices = "slices"


class BacklogConfig(dg.Config):
    mode: BacklogMode | None = Field(
        default=None,
        description="full: versions 0..head in one batch job; increment: catch up from the last handoff to the "
        "head; slices: combine the finished daily slices. Default: slices when the pipeline has a daily "
        "backfill, else full.",
    )
    end_version: int | None = Field(default=None, ge=0, description="Last source version to read (full/increment).")
    reset: bool = Field(default=False, description="full: start over even though the live phase already started.")
    progress_interval_seconds: float = Field(
        default=5.0, gt=0, description="How often the run logs its progress (step, Spark stage, tasks, rows read)."
    )
    take_over_dead_lease: bool = Field(
        default=True,
        description="Take the pipeline's backlog lease over from a backlog run whose process is gone (a crashed or "
        "killed run): re-running is how a crashed backlog recovers. A holder that is alive is never taken over.",
    )


def delay_us(handoff: HandoffManifest) -> int:
    """The watermark delay the handoff was made with (its final watermark = its max event time - delay)."""
    if handoff.final_watermark_us is None or handoff.backlog_max_event_time_us is None:
        return json.loads(handoff.state_spec)["watermark_delay_us"]
    return handoff.backlog_max_event_time_us - handoff.final_watermark_us


def handoff_machine_fields(handoff: HandoffManifest) -> dict:
    """What the switch sensor reads back (:mod:`phases_dagster.handoff_events`): exact integers, in one JSON entry
    so that GraphQL never truncates them and the UI does not plot ids."""
    right_wm = None
    if handoff.right_source_version is not None and handoff.right_max_event_time_us is not None:
        right_wm = handoff.right_max_event_time_us - delay_us(handoff)
    return {
        "manifest_id": handoff.manifest_id,
        "fingerprint": handoff.fingerprint,
        "source_version": handoff.source_version,
        "source_position": handoff.source_position,
        "final_watermark_us": handoff.final_watermark_us,
        "backlog_max_event_time_us": handoff.backlog_max_event_time_us,
        "right_source_version": handoff.right_source_version,
        "right_final_watermark_us": right_wm,
        "right_source_position": handoff.right_source_position,
    }


def handoff_metadata(handoff: HandoffManifest, timings: dict[str, float]) -> dict:
    """The handoff manifest asset's materialization: counts and durations (plotted), ids and positions (text),
    the final watermark (a timestamp) and the exact fields for machines (``handoff``, JSON)."""
    seconds = max(handoff.backlog_seconds, 1e-9)
    meta: dict = {
        "handoff": dg.MetadataValue.json(handoff_machine_fields(handoff)),
        "manifest_id": handoff.manifest_id,
        "kind": handoff.kind,
        "base_manifest_id": handoff.base_manifest_id or "",
        "fingerprint": handoff.fingerprint,
        "source_path": catalog.uri(handoff.source_path),
        "source_version": str(handoff.source_version),
        "source_position": handoff.source_position or "",
        "input_rows": handoff.input_rows,
        "keys": handoff.state_rows,
        "aggregated_rows": handoff.aggregated_rows,
        "late_rows": handoff.late_rows,
        "invalid_rows": handoff.invalid_rows,
        "future_rows": handoff.future_rows or 0,
        "quarantined_rows": handoff.quarantined_rows,
        "final_watermark": catalog.timestamp(handoff.final_watermark),
        "duration_s": round(handoff.backlog_seconds, 3),
        "rows_per_s": round(handoff.input_rows / seconds, 1),
        "state_path": catalog.uri(handoff.state_path),
    }
    if handoff.right_source_version is not None:
        meta["right_source_version"] = str(handoff.right_source_version)
    meta.update({f"timing_{k}": round(v, 3) for k, v in timings.items()})
    return meta


def slice_metadata(record: SliceRecord, executed: bool) -> dict:
    """One day's slice as its partition's materialization: its own versions and counts."""
    versions = "none" if record.first_version is None else f"{record.first_version}..{record.last_version}"
    if record.first_version is None:
        contents = "empty: no source version was committed on that day (UTC)"
    elif record.aggregated_rows + record.quarantined_rows == 0:
        contents = "empty: the day's source versions hold no record"
    else:
        contents = f"{record.aggregated_rows + record.quarantined_rows} source records"
    return {
        "contents": contents,
        "dagster/row_count": record.keys,
        "versions": versions,
        "keys": record.keys,
        "aggregated_rows": record.aggregated_rows,
        "quarantined_rows": record.quarantined_rows,
        "slice_seconds": round(record.seconds, 3),
        "executed_by": "this run" if executed else "an earlier run (not executed again)",
    }


def backlog_specs(pipeline: Pipeline, settings: Orchestration) -> list[dg.AssetSpec]:
    """The tables the backlog phase makes: the handoff manifest (``<name>_backlog``, upstream of the others),
    the per-key state, the sink and the quarantine."""
    names = Names(pipeline)
    fingerprint = pipeline.fingerprint()
    inputs = [names.source] + ([names.right_source] if pipeline.inputs.two else [])
    if settings.backfill is not None:
        inputs.append(names.slices)

    def spec(key: str, deps: list[str], about: str, table: str, kinds: set[str]) -> dg.AssetSpec:
        return dg.AssetSpec(
            key,
            deps=deps,
            code_version=fingerprint,
            # A backlog asked for after the switch (by "Materialize all", say) materializes nothing: the live phase
            # owns these tables, and a refused step would mark them failed.
            skippable=True,
            metadata={"dagster/table_name": f"{pipeline.name}.{table}"},
            **catalog.spec_kwargs(pipeline, about, kinds=kinds),
        )

    return [
        spec(
            names.backlog,
            inputs,
            f"Backlog phase of {pipeline.name!r}: the source's versions 0..V (or its offsets up to the end) as one "
            "sorted batch job, handed over to the live phase by this manifest, written last (its final watermark, "
            "positions and counts).",
            "manifests",
            {"spark", "delta"},
        ),
        spec(
            names.state,
            [names.backlog],
            "Per-key state of the handoff: what the backlog computed up to its final version, the live phase's "
            "starting point. It does not change after the handoff: the live phase keeps its state in Spark's state "
            "store (RocksDB, under the live run's folder), whose newest version the live run records as an "
            "observation of this asset (live_store_version, live_state_store).",
            "state",
            {"delta"},
        ),
        spec(
            names.sink,
            [names.backlog],
            f"The sink of {pipeline.name!r}: overwritten by the backlog, then updated by the live phase (its "
            "materializations come from both).",
            "sink",
            {"delta"},
        ),
        spec(
            names.quarantine,
            [names.backlog],
            "Records the pipeline did not apply, each with its reason (late, invalid, future, undecodable, ...): "
            "written by the backlog, then appended to by the live phase, whose run materializes it again with its "
            "row count and rows_by_reason whenever it adds rows.",
            "quarantine",
            {"delta"},
        ),
    ]


def _waiting_for(storage: StorageResource, pipeline: Pipeline) -> str | None:
    """Why the backlog cannot start yet: a pipeline whose results it reads (a PipelineSource) has no handoff (read
    from that pipeline's manifests, not from Dagster's event log: it may have run outside Dagster); None: it can."""
    for spec in (i.spec for i in pipeline.inputs if isinstance(i.spec, PipelineSource)):
        if newest_handoff_row(storage.placement(spec.upstream)) is None:
            return f"pipeline {spec.upstream.name!r}, whose results it reads, has not handed off"
    return None


def build_backlog_assets(pipeline: Pipeline, settings: Orchestration) -> list[dg.AssetsDefinition]:
    names = Names(pipeline)
    partitioned = settings.backfill is not None
    default_mode = "slices" if partitioned else "full"
    out: list[dg.AssetsDefinition] = []

    @dg.multi_asset(
        name=names.backlog_op,
        specs=backlog_specs(pipeline, settings),
        description=f"Backlog phase of {pipeline.name!r} (full, catch-up increment or combined daily slices).",
    )
    def backlog(
        context: dg.AssetExecutionContext, config: BacklogConfig, spark: SparkResource, storage: StorageResource
    ):
        where = storage.placement(pipeline)
        mode = config.mode.value if config.mode is not None else default_mode
        session = spark.session()
        switched = None if config.reset else BacklogRunner.at(session, where).switched_to_live()
        if switched is not None:
            context.log.warning(
                f"{mode} backlog of {pipeline.name!r} not run: the pipeline has switched to live from manifest "
                f"{switched}, and its live phase (running or stopped) keeps the state, the sink and the quarantine "
                "current. Nothing was materialized; these tables keep their status. To resume a stopped live phase, "
                f"launch {names.live_job}; to rebuild from the source after a definition change, stop the live phase "
                "and run this job with reset: true."
            )
            context.instance.add_run_tags(context.run_id, {NOT_RUN_TAG: f"backlog: switched to live ({switched})"})
            return
        waiting = None if switched is not None else _waiting_for(storage, pipeline)
        if waiting is not None:
            context.log.warning(
                f"{mode} backlog of {pipeline.name!r} not run: {waiting}. Nothing was materialized; these tables keep "
                f"their status. Materialize the upstream's backlog first (its group's Materialize all); the switch "
                f"sensor of {pipeline.name!r} then starts this backlog."
            )
            context.instance.add_run_tags(context.run_id, {NOT_RUN_TAG: f"backlog: {waiting}"})
            return
        if mode == "slices":
            if settings.backfill is None:
                raise dg.Failure(
                    f"mode 'slices' needs a daily backfill for pipeline {pipeline.name!r}; valid modes here: "
                    "'full', 'increment'"
                )
            runner = SliceRunner.at(session, where, settings.backfill.start_date, take_over=config.take_over_dead_lease)
            with reporting(context, session, config.progress_interval_seconds):
                handoff = runner.combine()
            timings = runner.backlog.timings
        else:
            runner = BacklogRunner.at(session, where, take_over=config.take_over_dead_lease)
            with reporting(context, session, config.progress_interval_seconds):
                if mode == "full":
                    handoff = runner.run(config.end_version, reset=config.reset)
                else:
                    handoff = runner.run_increment(config.end_version)
            timings = runner.timings
        context.log.info(
            f"{mode} backlog of {pipeline.name!r}: versions 0..{handoff.source_version}, {handoff.input_rows} rows, "
            f"{handoff.state_rows} keys, final watermark {handoff.final_watermark}, manifest {handoff.manifest_id}"
        )
        written = {"written_by": f"backlog ({mode})", "manifest_id": handoff.manifest_id}
        yield dg.MaterializeResult(
            asset_key=names.backlog,
            metadata={
                "mode": mode,
                **handoff_metadata(handoff, timings),
                **catalog.table_metadata(pipeline, where.manifests, "manifests"),
            },
        )
        yield dg.MaterializeResult(
            asset_key=names.state,
            metadata={**written, **catalog.table_metadata(pipeline, handoff.state_path, "state")},
        )
        yield dg.MaterializeResult(
            asset_key=names.sink,
            metadata={**written, **catalog.sink_metadata(where)},
        )
        yield dg.MaterializeResult(
            asset_key=names.quarantine,
            metadata={
                **written,
                "quarantined_by_backlog": handoff.quarantined_rows,
                **catalog.table_metadata(pipeline, where.quarantine, "quarantine"),
                **catalog.quarantine_metadata(where),
            },
        )

    out.append(backlog)

    if settings.backfill is not None:
        start = settings.backfill.start_date

        @dg.asset(
            name=names.slices,
            deps=[names.source],
            check_specs=[
                dg.AssetCheckSpec(
                    names.slices_have_data,
                    asset=names.slices,
                    description="Every day of the run found at least one source version committed on it: a day "
                    "with none (a gap in the feed, or commit times that are not the days they claim) warns.",
                )
            ],
            partitions_def=dg.DailyPartitionsDefinition(start_date=start.isoformat()),
            backfill_policy=dg.BackfillPolicy.single_run(),
            code_version=pipeline.fingerprint(),
            **catalog.spec_kwargs(
                pipeline,
                f"Daily backlog slices of {pipeline.name!r}: the source versions committed on each UTC day, "
                "merged per key into a partial state. Idempotent per day; a re-run of a range executes only "
                "the days not finished yet.",
                kinds={"spark", "delta"},
            ),
        )
        def slices(context: dg.AssetExecutionContext, spark: SparkResource, storage: StorageResource):
            # A re-run of a range is how a crashed backfill recovers (FLIP-383): it takes over the backlog lease of
            # a run whose process is gone; a holder that is alive is never taken over.
            session = spark.session()
            runner = SliceRunner.at(session, storage.placement(pipeline), start, take_over=True)
            days = [date.fromisoformat(k) for k in context.partition_keys]

            def done(record) -> None:
                if record.first_version is None:
                    context.log.warning(
                        f"slice {record.slice}: no source version was committed on that day (UTC), so the slice is "
                        "empty. If data for that day exists, its commits carry other dates"
                    )
                    return
                if record.aggregated_rows + record.quarantined_rows == 0:
                    context.log.warning(
                        f"slice {record.slice}: versions {record.first_version}..{record.last_version} were "
                        "committed on that day but hold no record (a table's creation, say), so the slice is empty"
                    )
                    return
                context.log.info(
                    f"slice {record.slice} finished: versions {record.first_version}..{record.last_version}, "
                    f"{record.keys} keys, {record.aggregated_rows} rows, {record.seconds:.1f} s"
                )

            with reporting(context, session):
                result = runner.run_range(days, on_done=done)
            if result.recovered:
                context.log.info(f"slices finished by an earlier run, not executed again: {result.recovered}")
            records = result.records
            # Each day's partition carries its own figures (a range runs in one run, whose result would otherwise
            # give every day the whole range's totals).
            for day, record in records.items():
                context.add_asset_metadata(slice_metadata(record, day in result.executed), partition_key=day)
            empty = sorted(r.slice for r in records.values() if r.aggregated_rows + r.quarantined_rows == 0)
            has_data = dg.AssetCheckResult(
                check_name=names.slices_have_data,
                passed=not empty,
                severity=dg.AssetCheckSeverity.WARN,
                description=(
                    f"days with no source record: {', '.join(empty)}" if empty else "every day found source records"
                ),
                metadata={"empty_days": ", ".join(empty) or "none", "empty_day_count": len(empty)},
            )
            return dg.MaterializeResult(
                check_results=[has_data],
                metadata={
                    "run_range": f"{min(records)}..{max(records)}" if records else "none",
                    "run_executed_days": ", ".join(result.executed) or "none",
                    "run_recovered_days": ", ".join(result.recovered) or "none",
                },
            )

        out.append(slices)  # pyright: ignore[reportArgumentType]
    return out
