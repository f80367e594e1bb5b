"""The backlog assets of a pipeline: the backlog phase (state + handoff manifest) and its daily slices."""

import json
from datetime import date
from enum import Enum

import dagster as dg
from pydantic import Field

from assets import catalog
from assets.progress import reporting
from assets.settings import Names, Orchestration
from phases.backlog.runner import BacklogRunner
from phases.backlog.slices import SliceRunner
from phases.definition import Pipeline
from phases.storage.manifest import HandoffManifest
from resources.spark import SparkResource
from resources.storage import StorageResource


class BacklogMode(Enum):
    full = "full"
    increment = "increment"
    slices = "slices"


class BacklogConfig(dg.Config):
    mode: BacklogMode | None = Field(
        None,
        description="full: versions 0..head in one batch job; increment: catch up from the last handoff to the "
        "head; slices: combine the finished daily slices. Default: slices when the pipeline has a daily "
        "backfill, else full.",
    )
    end_version: int | None = Field(None, ge=0, description="Last source version to read (full/increment).")
    reset: bool = Field(False, description="full: start over even though the live phase already started.")
    progress_interval_seconds: float = Field(
        5.0, gt=0, description="How often the run logs its progress (step, Spark stage, tasks, rows read)."
    )
    take_over_dead_lease: bool = Field(
        True,
        description="Take the pipeline's backlog lease over from a backlog run whose process is gone (a crashed or "
        "killed run): re-running is how a crashed backlog recovers. A holder that is alive is never taken over.",
    )


def delay_us(handoff: HandoffManifest) -> int:
    """The watermark delay the handoff was made with (its final watermark = its max event time - delay)."""
    if handoff.final_watermark_us is None or handoff.backlog_max_event_time_us is None:
        return json.loads(handoff.state_spec)["watermark_delay_us"]
    return handoff.backlog_max_event_time_us - handoff.final_watermark_us


def handoff_machine_fields(handoff: HandoffManifest) -> dict:
    """What the switch sensor reads back (:mod:`assets.handoff_events`): exact integers, in one JSON entry so that
    GraphQL never truncates them and the UI does not plot ids."""
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
            "Per-key state of the handoff: what the backlog computed, then kept up to date by the live phase.",
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
            "Records the pipeline did not apply, each with its reason (late, invalid, future, undecodable, ...).",
            "quarantine",
            {"delta"},
        ),
    ]


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
        p = storage.resolve(pipeline)
        mode = config.mode.value if config.mode is not None else default_mode
        session = spark.session()
        if mode == "slices":
            if settings.backfill is None:
                raise dg.Failure(
                    f"mode 'slices' needs a daily backfill for pipeline {pipeline.name!r}; valid modes here: "
                    "'full', 'increment'"
                )
            runner = SliceRunner(session, p, settings.backfill.start_date, take_over=config.take_over_dead_lease)
            with reporting(context, session, config.progress_interval_seconds):
                handoff = runner.combine()
            timings = runner.backlog.timings
        else:
            runner = BacklogRunner(session, p, take_over=config.take_over_dead_lease)
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
                **catalog.table_metadata(p, p.locations.manifests, "manifests"),
            },
        )
        yield dg.MaterializeResult(
            asset_key=names.state,
            metadata={**written, **catalog.table_metadata(p, handoff.state_path, "state")},
        )
        yield dg.MaterializeResult(
            asset_key=names.sink,
            metadata={**written, **catalog.table_metadata(p, p.sink.path, "sink")},
        )
        yield dg.MaterializeResult(
            asset_key=names.quarantine,
            metadata={
                **written,
                "quarantined_by_backlog": handoff.quarantined_rows,
                **catalog.table_metadata(p, p.locations.quarantine, "quarantine"),
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
            runner = SliceRunner(session, storage.resolve(pipeline), start, take_over=True)
            days = [date.fromisoformat(k) for k in context.partition_keys]

            def done(record) -> None:
                if record.first_version is None:
                    context.log.warning(
                        f"slice {record.slice}: no source version was committed on that day (UTC), so the slice is "
                        "empty. If data for that day exists, its commits carry other dates"
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
            records = result.records.values()
            empty = sorted(r.slice for r in records if r.first_version is None)
            has_data = dg.AssetCheckResult(
                check_name=names.slices_have_data,
                passed=not empty,
                severity=dg.AssetCheckSeverity.WARN,
                description=(
                    f"days with no source version: {', '.join(empty)}" if empty else "every day found source versions"
                ),
                metadata={"empty_days": ", ".join(empty) or "none", "empty_day_count": len(empty)},
            )
            return dg.MaterializeResult(
                check_results=[has_data],
                metadata={
                    "executed": ", ".join(result.executed) or "none",
                    "recovered": ", ".join(result.recovered) or "none",
                    "executed_count": len(result.executed),
                    "recovered_count": len(result.recovered),
                    "keys": sum(r.keys for r in records),
                    "aggregated_rows": sum(r.aggregated_rows for r in records),
                    "quarantined_rows": sum(r.quarantined_rows for r in records),
                },
            )

        out.append(slices)
    return out
