"""The live job: a long-running run that starts the seeded live phase and reports its progress.

Terminating the run from the UI makes Dagster send SIGINT to the run's process; once a SparkContext
exists PySpark turns it into ``KeyboardInterrupt`` (``DagsterExecutionInterruptedError`` before that), both
``BaseException``s: the ``finally`` stops the streaming queries cleanly. Launching the job again for the
same manifest resumes both queries from their checkpoints.
"""

import time
from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from assets.settings import Names, Orchestration
from phases.definition import Pipeline
from phases.live import LiveRunner
from phases.source_lag import InputLag
from resources.spark import SparkResource
from resources.storage import StorageResource


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


def _lag_seconds(watermark: str | None) -> float | None:
    if not watermark:
        return None
    at = datetime.fromisoformat(watermark.replace("Z", "+00:00"))
    return round((datetime.now(UTC) - at).total_seconds(), 3)


def progress_metadata(status: dict, lag: InputLag | None) -> dict:
    agg, tag = status["aggregate"], status["tagger"]
    processed = tag.get("source_version")
    behind = lag.behind if lag is not None and lag.behind is not None else -1
    meta = {
        "manifest_id": status["run"],
        "batch_id": agg["batch_id"] if agg["batch_id"] is not None else -1,
        "tagger_batch_id": tag["batch_id"] if tag["batch_id"] is not None else -1,
        "input_rows_per_s": round(float(tag["input_rows_per_second"] or 0.0), 3),
        "processed_rows_per_s": round(float(agg["processed_rows_per_second"] or 0.0), 3),
        "watermark": agg["watermark"] or "none",
        "watermark_lag_s": _lag_seconds(agg["watermark"]) if agg["watermark"] else -1.0,
        "source_version": processed if processed is not None else -1,
        # versions (Delta) or records (Kafka) the source has after what the live phase applied
        "behind": behind,
        "behind_unit": lag.unit if lag is not None else "versions",
    }
    return meta


def build_live_job(pipeline: Pipeline, settings: Orchestration) -> dg.JobDefinition:
    names = Names(pipeline)
    asset_key = dg.AssetKey(names.live_asset)

    @dg.op(name=names.live_op, description=f"Runs the live phase of {pipeline.name!r} until terminated.")
    def live_phase(context: dg.OpExecutionContext, config: LiveConfig, spark: SparkResource, storage: StorageResource):
        p = storage.resolve(pipeline)
        interval = config.report_interval_seconds or settings.live.report_interval_seconds
        runner = LiveRunner.from_manifest(spark.session(), p, config.manifest_id, take_over=config.take_over_dead_lease)
        context.log.info(f"starting the live phase of {p.name!r} from manifest {runner.run_name}")
        try:
            start = runner.start()
            started = time.monotonic()
            context.log.info(
                f"live phase running: first checkpoint committed {start.start_seconds:.1f} s after the queries "
                f"started (state replay of manifest {runner.run_name}); reporting every {interval:g} s"
            )
            context.log_event(
                dg.AssetObservation(
                    asset_key=asset_key,
                    metadata={"event": "started", "manifest_id": runner.run_name, "start_s": start.start_seconds},
                )
            )
            while True:
                time.sleep(interval)
                runner.raise_if_failed()
                meta = progress_metadata(runner.status(), runner.lag())
                context.log.info(
                    "live progress: " + ", ".join(f"{k}={v}" for k, v in meta.items() if k != "manifest_id")
                )
                context.log_event(dg.AssetObservation(asset_key=asset_key, metadata={"event": "progress", **meta}))
                if config.max_runtime_seconds is not None and time.monotonic() - started >= config.max_runtime_seconds:
                    context.log.info(
                        f"max_runtime_seconds={config.max_runtime_seconds:g} reached; processing what is "
                        "available, then stopping"
                    )
                    runner.process_available()
                    meta = progress_metadata(runner.status(), runner.lag())
                    context.log_event(dg.AssetObservation(asset_key=asset_key, metadata={"event": "stopped", **meta}))
                    break
        except BaseException as exc:  # termination arrives as KeyboardInterrupt / DagsterExecutionInterruptedError
            context.log.info(f"live phase stopping on {type(exc).__name__}")
            raise
        finally:
            runner.stop()
            context.log.info("live phase queries stopped; a new run resumes from their checkpoints")

    @dg.job(
        name=names.live_job,
        executor_def=dg.in_process_executor,
        description=f"Live phase of {pipeline.name!r} (long-running; terminate it to stop).",
        tags={"phases/pipeline": pipeline.name},
    )
    def live_job():
        live_phase()

    return live_job
