"""The live asset: a long-running step that runs the seeded live phase and reports what it does.

The live phase's state is what the asset's *materialization status* shows, in the lineage graph and the catalog:

* while the live phase runs, its run has the asset planned and not materialized yet, so Dagster shows it
  **materializing** (a run in progress);
* a clean stop (terminate from the UI: Dagster sends SIGINT, which PySpark turns into ``KeyboardInterrupt`` once a
  SparkContext exists; or ``max_runtime_seconds``) ends the step with the asset's one materialization, ``state`` =
  stopped and the reason: **materialized**, with the ``live_phase_running`` check warning that nothing runs;
* an error fails the step, and a run whose process was killed is marked failed by run monitoring: either way the
  run that planned the asset failed without materializing it, so Dagster shows it **failed** (red), and the
  ``live_phase_running`` check fails with severity ERROR (:mod:`phases_dagster.health`, which also relaunches it).

The step reports from the query's first micro-batch on: what waited at the start (a relaunch after an outage, a
busy source) is applied by the running query while the reports show its rows and the lag shrinking.
The measurements go out as observations of the live asset at every report interval (:func:`report_metadata`: the
plotted figures first), so they never turn the running asset green. While it runs the live step also keeps the
tables it writes current in the catalog: a materialization of the sink and of the quarantine (row count, reasons)
whenever the live phase committed a new version of them, and an observation of the state asset with the live state
store's version.

Any run that runs this step is the live phase, whatever launched it (the live job, this asset's own
"Materialize", "Materialize all"): the step tags its run with :data:`phases_dagster.live_status.LIVE_RUN_TAG`, so
the health sensor watches and relaunches it like the live job's. A new run resumes from the live run's checkpoint.
"""

import time
from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from phases import LiveRunner, Pipeline, Placement, inspect
from phases.inspect import LiveMeter, LiveReport
from phases_dagster import catalog
from phases_dagster.handoff_events import of_manifest
from phases_dagster.health import check_evaluation
from phases_dagster.live_status import LIVE_RUN_TAG, sink_freshness
from phases_dagster.redeploy import RedeployConfig, not_in_the_redeploy_job, run_swap, swap_spec
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration

RUNNING, STOPPED, FAILED = "running", "stopped", "failed"


class LiveConfig(dg.Config):
    manifest_id: str | None = Field(
        default=None, description="Handoff to start from (the switch sensor sets it); default: the newest manifest."
    )
    report_interval_seconds: float | None = Field(default=None, gt=0, description="Default: the pipeline's setting.")
    take_over_dead_lease: bool = Field(
        default=False,
        description="Take the pipeline's live lease over from a live run whose process is gone (killed, machine "
        "lost). A live holder is never taken over.",
    )
    max_runtime_seconds: float | None = Field(
        default=None,
        gt=0,
        description="After this long, process what is available and stop (default: run until terminated).",
    )
    # The swap's settings: read only in the redeploy job, whose swap is this step's first part.
    reason: str = Field(
        default="", description="The redeploy job: why the pipeline is redeployed (the redeploy log, tags)."
    )
    stop_timeout_seconds: float = Field(
        default=600.0, gt=0, description="The redeploy job: how long the swap waits for the serving live phase to stop."
    )


def when(at: datetime | None) -> str:
    """A time as a person reads it, year included (the UI's timestamps leave the year out)."""
    return at.strftime("%Y-%m-%d %H:%M:%S UTC") if at is not None else "none"


# The plotted figures, named so that the UI, which orders plots by name, shows them in the order they are read: how
# long the oldest data not applied has waited, how much waits, rows per second taken in and while processing, and the
# mean micro-batch time.
PLOTTED = ("lag_s", "lag_to_head_{unit}", "rows_in_per_s", "rows_processed_per_s", "time_per_micro_batch_s")


def report_metadata(report: LiveReport, manifest_id: str) -> dict:
    """One report as an observation of the live asset. The numbers, which the UI plots, are what says whether the
    live phase keeps up (:data:`PLOTTED`): ``lag_s`` (how long the oldest source data not applied has waited; 0 when
    nothing waits), ``lag_to_head_versions`` or ``lag_to_head_records`` (how much waits), rows per second taken in
    and while processing, and the mean micro-batch time. The rest is text. A figure with no value in the interval
    (no row arrived: no processing rate) is left out, so its plot has a gap rather than a made-up zero."""
    values = (
        report.lag_s,
        report.behind,
        report.input_rows_per_s,
        report.processed_rows_per_s,
        report.batch_duration_s,
    )
    plotted = {name.format(unit=report.behind_unit): value for name, value in zip(PLOTTED, values, strict=True)}
    lag = report.event_time_lag_s
    return {
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in plotted.items() if v is not None},
        "state": RUNNING,
        "input_rows": f"{report.input_rows:,} in {report.data_batches} of {report.batches} micro-batches"
        + (" (one is running)" if report.running_batch else ""),
        "applied_position": report.applied_position,
        "head_position": report.head_position or "unknown",
        "watermark": when(report.watermark),
        "applied_max_event_time": when(report.applied_max_event_time),
        "head_max_event_time": when(report.head_max_event_time),
        "event_time_lag": f"{lag:.3f} s" if lag is not None else "unknown",
        "last_batch_id": str(report.last_batch_id) if report.last_batch_id is not None else "none",
        "manifest_id": manifest_id,
    }


def _interrupted(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | dg.DagsterExecutionInterruptedError)


class _Tables:
    """Keeps the catalog's view of the tables the live phase writes current: a materialization of the sink and of
    the quarantine each time the live phase committed a new version of it (read from the Delta logs, no Spark)."""

    def __init__(
        self, context: dg.AssetExecutionContext, where: Placement, manifest_id: str, settings: Orchestration, handoff
    ):
        p = where.definition
        names = Names(p)
        self.context, self.where, self.mid, self.settings = context, where, manifest_id, settings
        self.handoff = of_manifest(handoff, p.delay_us) if handoff is not None else None
        self.fresh = names.fresh
        self.sink_key, self.quarantine_key = dg.AssetKey(names.sink), dg.AssetKey(names.quarantine)
        self.state_key = dg.AssetKey(names.state)
        self.versions: dict[str, int | None] = {}
        self.state_position: tuple | None = None

    def _changed(self, name: str, path: str) -> bool:
        version = inspect.table_version(path)
        if version is None or self.versions.get(name) == version:
            return False
        self.versions[name] = version
        return True

    def update(self, runner: LiveRunner) -> None:
        where, written = self.where, {"written_by": "live", "manifest_id": self.mid}
        if self._changed("sink", where.sink_path):
            self.context.log_event(
                dg.AssetMaterialization(asset_key=self.sink_key, metadata={**written, **catalog.sink_metadata(where)})
            )
            if self.handoff is not None:
                # sink_fresh for this materialization at once: the health sensor re-evaluates it only on a change
                # or once a minute, and the UI shows a check not evaluated for the latest materialization as not
                # passed ("0 / 1") after every commit.
                health = self.settings.health
                verdict = sink_freshness(
                    where, self.handoff, health.max_lag, RUNNING, datetime.now(UTC), health.when_live_down
                )
                self.context.log_event(check_evaluation(self.sink_key, self.fresh, verdict))  # pyright: ignore[reportArgumentType]
        if self._changed("quarantine", where.quarantine):
            self.context.log_event(
                dg.AssetMaterialization(
                    asset_key=self.quarantine_key,
                    metadata={
                        **written,
                        **catalog.table_metadata(where.definition, where.quarantine, "quarantine"),
                        **catalog.quarantine_metadata(where),
                    },
                )
            )
        latest = runner.latest_progress()
        position = (latest.state_layout, latest.state_version)
        if latest.state_layout is not None and position != self.state_position:
            self.state_position = position
            store = inspect.state_store_folder(where, self.mid, latest.state_layout)
            self.context.log_event(
                dg.AssetObservation(
                    asset_key=self.state_key,
                    metadata={
                        "live_state_store": catalog.uri(store),
                        "live_store_version": str(latest.state_version),
                        # Its files: the snapshots and changelogs Spark keeps of its recent versions.
                        "live_store_bytes": inspect.folder_bytes(runner.spark, store),
                        "live_store_layout": latest.state_layout,
                        "live_batch_id": str(latest.batch_id),
                        "manifest_id": self.mid,
                    },
                )
            )


def build_live_asset(pipeline: Pipeline, settings: Orchestration) -> dg.AssetsDefinition:
    """The live asset, and the redeploy's swap as the first part of the same step (a subset of one multi-asset): the
    redeploy job runs the swap, then the live phase of the generation it made serve, in one process; the live asset
    itself depends only on the backlog's tables, so its own "Materialize" asks about nothing upstream."""
    names = Names(pipeline)
    live_key, swap_key = dg.AssetKey(names.live_asset), dg.AssetKey(names.swap)
    live_spec = dg.AssetSpec(
        names.live_asset,
        deps=[names.backlog, names.state],
        code_version=pipeline.fingerprint(),
        **catalog.spec_kwargs(
            pipeline,
            f"Live phase of {pipeline.name!r}: one Structured Streaming query seeded from the handoff, keeping its "
            "state (in Spark's state store) and the sink up to date until it is stopped.\n\n"
            "Status: materializing while the live phase runs; failed (red) when its run failed or its process was "
            "lost; materialized once it stopped cleanly, with the live_phase_running check warning that nothing "
            "runs. Its measurements (lag, rows/s, micro-batch time) are observations: see Plots.\n\n"
            f"To resume after a stop: launch {names.live_job}, or Materialize this asset; either resumes from the "
            "checkpoint. To stop: terminate its run.",
            kinds={"spark", "delta"},
        ),
    )

    @dg.multi_asset(
        name=names.live_asset,
        specs=[live_spec, swap_spec(pipeline)],
        can_subset=True,
        op_tags={"phases/pipeline": pipeline.name},
    )
    def live(context: dg.AssetExecutionContext, config: LiveConfig, spark: SparkResource, storage: StorageResource):
        if swap_key in context.selected_asset_keys and not_in_the_redeploy_job(context, pipeline, "the swap") is None:
            swap_config = RedeployConfig(
                reason=config.reason,
                take_over_dead_lease=config.take_over_dead_lease,
                stop_timeout_seconds=config.stop_timeout_seconds,
            )
            yield run_swap(context, pipeline, swap_config, spark, storage)
        if live_key not in context.selected_asset_keys:
            return
        where = storage.placement(pipeline)
        p = pipeline
        interval = config.report_interval_seconds or settings.live.report_interval_seconds
        runner = LiveRunner.at(spark.session(), where, config.manifest_id, take_over=config.take_over_dead_lease)
        mid = runner.run_name
        # Whatever launched this run, it is now the live phase: the health sensor finds it by this tag.
        context.instance.add_run_tags(context.run_id, {LIVE_RUN_TAG: pipeline.name, "phases/manifest_id": mid})
        context.log.info(f"starting the live phase of {p.name!r} from manifest {mid}")
        tables = _Tables(context, where, mid, settings, runner.handoff)
        reason = None

        meter = LiveMeter(runner)  # before the start: the rows its first micro-batch applies are reported too
        try:
            # Returns after the first micro-batch, not after a drain of everything waiting: the reports below show
            # the rows applied and the lag while the rest is applied (under steady arrivals a drain never ends soon).
            start = runner.start(drain=False)
            started = time.monotonic()
            context.log.info(
                f"live phase running: first checkpoint committed {start.start_seconds:.1f} s after the query "
                f"started (manifest {mid}); reporting every {interval:g} s"
            )
            context.log_event(
                dg.AssetObservation(
                    asset_key=live_key,
                    metadata={
                        "state": RUNNING,
                        "event": "started",
                        "manifest_id": mid,
                        "start_s": start.start_seconds,
                        "first_checkpoint_at": dg.MetadataValue.timestamp(start.first_checkpoint_at_us / 1e6),
                        # what waited at the start is applied from then on (a redeploy measures its gap so)
                        "first_batch_at": dg.MetadataValue.timestamp(
                            (start.first_batch_at_us or start.first_checkpoint_at_us) / 1e6
                        ),
                    },
                )
            )
            tables.update(runner)
            while True:
                time.sleep(interval)
                runner.raise_if_failed()
                if runner.stopped_for is not None:  # a redeploy asked it to stop before its swap
                    tables.update(runner)
                    reason = runner.stopped_for
                    break
                report = meter.report()
                context.log.info(f"live progress: {report.describe()}")
                context.log_event(dg.AssetObservation(asset_key=live_key, metadata=report_metadata(report, mid)))
                tables.update(runner)
                if config.max_runtime_seconds is not None and time.monotonic() - started >= config.max_runtime_seconds:
                    context.log.info(
                        f"max_runtime_seconds={config.max_runtime_seconds:g} reached; processing what is "
                        "available, then stopping"
                    )
                    runner.process_available()
                    tables.update(runner)
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
        yield dg.MaterializeResult(
            asset_key=live_key, metadata={"state": STOPPED, "reason": reason, "manifest_id": mid}
        )

    return live


def build_live_job(pipeline: Pipeline):
    names = Names(pipeline)
    return dg.define_asset_job(
        names.live_job,
        # live_phase_running is the health sensor's (and the UI's) to evaluate: inside this run it could only say
        # what the run itself was doing.
        selection=dg.AssetSelection.assets(names.live_asset)
        - dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey(names.live_asset), names.live_running)),
        executor_def=dg.in_process_executor,
        description=f"Live phase of {pipeline.name!r} (long-running; terminate it to stop).",
        tags={"phases/pipeline": pipeline.name, LIVE_RUN_TAG: pipeline.name},
    )
