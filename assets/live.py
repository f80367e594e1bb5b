"""The live asset: a long-running materialization that runs the seeded live phase and reports what it does.

While it runs, the ``<name>_live`` asset is materialized at every report interval with the interval's
measurements (:mod:`phases.live.report`) and ``state`` = running, and the sink asset each time the live phase
committed a new sink version (row count, version, schema). Its lifecycle is visible on the asset:

* terminating the run from the UI makes Dagster send SIGINT; once a SparkContext exists PySpark turns it into
  ``KeyboardInterrupt`` (``DagsterExecutionInterruptedError`` before that). The asset stops the query, records
  ``state`` = stopped with the reason and ends without a failure: a terminate is a clean stop;
* any other error records ``state`` = failed with the error, then fails the step; the health sensor
  (:mod:`assets.health`) relaunches it from its checkpoint.

Launching the job again for the same manifest resumes the query from its checkpoint.
"""

import time

import dagster as dg
from pydantic import Field

from assets import catalog
from assets.settings import Names, Orchestration
from phases.definition import Pipeline
from phases.live.report import LiveMeter, LiveReport
from phases.live.runner import LiveRunner
from phases.storage import table_stats
from resources.spark import SparkResource
from resources.storage import StorageResource

RUNNING, STOPPED, FAILED = "running", "stopped", "failed"


class LiveConfig(dg.Config):
    manifest_id: str | None = Field(
        None, description="Handoff to start from (the switch sensor sets it); default: the newest manifest."
    )
    report_interval_seconds: float | None = Field(None, gt=0, description="Default: the pipeline's setting.")
    take_over_dead_lease: bool = Field(
        False,
        description="Take the pipeline's live lease over from a live run whose process is gone (killed, machine "
        "lost). A live holder is never taken over.",
    )
    max_runtime_seconds: float | None = Field(
        None,
        gt=0,
        description="After this long, process what is available and stop (default: run until terminated).",
    )


def report_metadata(report: LiveReport, manifest_id: str) -> dict:
    """One report as the live asset's materialization: measurements as numbers (plotted), ids and positions as
    text, times as timestamps. A measurement with no value in the interval (no row arrived: no processing rate) is
    left out, so its plot has a gap rather than a made-up zero."""
    measured = {
        "processed_rows_per_s": report.processed_rows_per_s,
        "batch_duration_s": report.batch_duration_s,
        "behind": report.behind,
        "event_time_lag_s": report.event_time_lag_s,
        "watermark_age_s": report.watermark_age_s,
    }
    return {
        "state": RUNNING,
        "manifest_id": manifest_id,
        "input_rows": report.input_rows,
        "input_rows_per_s": round(report.input_rows_per_s, 3),
        "batches": report.batches,
        "data_batches": report.data_batches,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in measured.items() if v is not None},
        "behind_unit": report.behind_unit,
        "watermark": catalog.timestamp(report.watermark),
        "applied_max_event_time": catalog.timestamp(report.applied_max_event_time),
        "head_max_event_time": catalog.timestamp(report.head_max_event_time),
        "applied_position": report.applied_position,
        "head_position": report.head_position or "unknown",
        "last_batch_id": str(report.last_batch_id) if report.last_batch_id is not None else "none",
    }


def _interrupted(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | dg.DagsterExecutionInterruptedError)


def build_live_asset(pipeline: Pipeline, settings: Orchestration) -> dg.AssetsDefinition:
    names = Names(pipeline)
    live_key, sink_key = dg.AssetKey(names.live_asset), dg.AssetKey(names.sink)

    @dg.asset(
        name=names.live_asset,
        deps=[names.backlog, names.state],
        code_version=pipeline.fingerprint(),
        op_tags={"phases/pipeline": pipeline.name},
        **catalog.spec_kwargs(
            pipeline,
            f"Live phase of {pipeline.name!r}: one Structured Streaming query seeded from the handoff, keeping the "
            "state and the sink up to date until it is stopped. Materialized at every report with its measurements "
            "and its state (running, stopped, failed).",
            kinds={"spark", "delta"},
        ),
    )
    def live(context: dg.AssetExecutionContext, config: LiveConfig, spark: SparkResource, storage: StorageResource):
        p = storage.resolve(pipeline)
        interval = config.report_interval_seconds or settings.live.report_interval_seconds
        runner = LiveRunner.from_manifest(spark.session(), p, config.manifest_id, take_over=config.take_over_dead_lease)
        mid = runner.run_name
        context.log.info(f"starting the live phase of {p.name!r} from manifest {mid}")
        sink_version = None
        reason = None

        def sink_update() -> None:
            nonlocal sink_version
            stats = table_stats.stats(p.sink.path)
            if stats is None or stats.version == sink_version:
                return
            sink_version = stats.version
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=sink_key,
                    metadata={
                        "written_by": "live",
                        "manifest_id": mid,
                        **catalog.table_metadata(p, p.sink.path, "sink"),
                    },
                )
            )

        meter = LiveMeter(runner)  # before the start: the rows its first micro-batch applies are reported too
        try:
            start = runner.start()
            started = time.monotonic()
            context.log.info(
                f"live phase running: first checkpoint committed {start.start_seconds:.1f} s after the query "
                f"started (manifest {mid}); reporting every {interval:g} s"
            )
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=live_key,
                    metadata={"state": RUNNING, "event": "started", "manifest_id": mid, "start_s": start.start_seconds},
                )
            )
            sink_update()
            while True:
                time.sleep(interval)
                runner.raise_if_failed()
                report = meter.report()
                context.log.info(f"live progress: {report.describe()}")
                context.log_event(dg.AssetMaterialization(asset_key=live_key, metadata=report_metadata(report, mid)))
                sink_update()
                if config.max_runtime_seconds is not None and time.monotonic() - started >= config.max_runtime_seconds:
                    context.log.info(
                        f"max_runtime_seconds={config.max_runtime_seconds:g} reached; processing what is "
                        "available, then stopping"
                    )
                    runner.process_available()
                    sink_update()
                    reason = f"max_runtime_seconds={config.max_runtime_seconds:g} reached"
                    break
        except BaseException as exc:
            if not _interrupted(exc):
                context.log.error(f"live phase failed: {type(exc).__name__}: {exc}")
                context.log_event(
                    dg.AssetObservation(
                        asset_key=live_key,
                        metadata={
                            "state": FAILED,
                            "manifest_id": mid,
                            "error": f"{type(exc).__name__}: {str(exc)[:2000]}",
                        },
                    )
                )
                raise
            reason = "terminated: the run was asked to stop (SIGINT from Dagster)"
        finally:
            runner.stop()
            context.log.info("live phase query stopped; a new run resumes from its checkpoint")
        context.log.info(f"live phase stopped cleanly: {reason}")
        return dg.MaterializeResult(metadata={"state": STOPPED, "reason": reason, "manifest_id": mid})

    return live


def build_live_job(pipeline: Pipeline):
    names = Names(pipeline)
    return dg.define_asset_job(
        names.live_job,
        selection=dg.AssetSelection.assets(names.live_asset),
        executor_def=dg.in_process_executor,
        description=f"Live phase of {pipeline.name!r} (long-running; terminate it to stop).",
        tags={"phases/pipeline": pipeline.name},
    )
