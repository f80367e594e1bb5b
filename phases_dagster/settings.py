"""Settings of a pipeline's Dagster definitions (pydantic, validated when the definitions are built)."""

from __future__ import annotations

from datetime import date, timedelta
from enum import StrEnum

from pydantic import Field, field_validator

from phases import Pipeline, PipelineSource, SettingsModel


class _Model(SettingsModel):
    """A Dagster-side setting (invalid values raise DefinitionError)."""


class SwitchPolicy(_Model):
    """When the switch sensor hands the backlog over to the live phase (FLIP-309's watermark-lag rule)."""

    lag_threshold: timedelta = Field(
        default=timedelta(minutes=10),
        description="Caught up when now - final backlog watermark <= this (or the source has no newer version).",
    )
    max_records_behind: int = Field(
        default=0,
        ge=0,
        description="A Kafka input with at most this many records after the handoff's end offsets counts as caught "
        "up (FLIP-328's 'offsets behind' rule), whatever its watermark.",
    )
    minimum_interval_seconds: int = Field(default=30, ge=1, description="How often the daemon evaluates the sensor.")
    running_by_default: bool = Field(
        default=False,
        description="Start the sensor with the daemon, no click needed. Off by default: the sensor launches Spark "
        "runs, and a new instance launches nothing until it is turned on (the UI's Automation page, or this field).",
    )

    @field_validator("lag_threshold")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v < timedelta(0):
            raise ValueError(f"lag_threshold must be >= 0; got {v}")
        return v


class CheckPolicy(_Model):
    max_quarantine_fraction: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="Blocking check: quarantined / input rows of the backlog at most this.",
    )


class DailyBackfill(_Model):
    """Backlog slices by commit day (UTC), materialized by a daily schedule and by partition backfills."""

    start_date: date = Field(description="First slice; it also takes every source version committed before it.")
    hour_of_day: int = Field(
        default=1, ge=0, le=23, description="When the schedule runs the previous day's slice (UTC)."
    )


class LiveReporting(_Model):
    report_interval_seconds: float = Field(default=10.0, gt=0, description="Progress events and observations cadence.")


class WhenLiveDown(StrEnum):
    """What the sink's freshness check says while the live phase that owns the sink is stopped or failed, though no
    source data waits yet: the sink is current, but nothing keeps it so."""

    WARN = "warn"  # the check fails with severity WARN
    FAIL = "fail"  # the check fails with severity ERROR
    PASS = "pass"  # the check passes (a live phase stopped on purpose, e.g. outside business hours)


class LiveHealth(_Model):
    """The health sensor: the sink's freshness check, source observations, and relaunching a dead live run."""

    max_lag: timedelta = Field(
        default=timedelta(minutes=10),
        description="The sink's freshness check fails when the oldest source data the live phase has not applied "
        "was committed longer ago than this.",
    )
    when_live_down: WhenLiveDown = Field(
        default=WhenLiveDown.WARN,
        description="The freshness check while the live phase is stopped or failed and nothing waits yet: 'warn' "
        "(fails, severity WARN), 'fail' (fails, severity ERROR) or 'pass'. Data waiting longer than max_lag always "
        "fails it (ERROR).",
    )
    minimum_interval_seconds: int = Field(
        default=30, ge=1, description="How often the daemon evaluates the health sensor."
    )
    relaunch: bool = Field(default=True, description="Relaunch a failed live run from its checkpoint.")
    max_relaunches: int = Field(
        default=5, ge=0, description="Consecutive relaunches of one handoff's live phase, at most."
    )
    backoff_seconds: float = Field(
        default=30.0, ge=0, description="Wait after the first failure; doubled after each further one (capped below)."
    )
    max_backoff_seconds: float = Field(default=600.0, ge=0, description="The longest wait between relaunches.")
    running_by_default: bool = Field(
        default=False,
        description="Start the sensor with the daemon, no click needed. Off by default: the sensor launches Spark "
        "runs, and a new instance launches nothing until it is turned on (the UI's Automation page, or this field).",
    )


class Orchestration(_Model):
    switch: SwitchPolicy = SwitchPolicy()
    checks: CheckPolicy = CheckPolicy()
    backfill: DailyBackfill | None = Field(default=None, description="None: one unpartitioned backlog asset.")
    live: LiveReporting = LiveReporting()
    health: LiveHealth = LiveHealth()


class Names:
    """Dagster names of one pipeline's definitions (asset keys, jobs, sensor, schedule)."""

    def __init__(self, pipeline: Pipeline):
        n = pipeline.name
        self.group = n
        # Another pipeline's results as an input: that pipeline's sink asset (one lineage), not a source of its own.
        source, right = pipeline.source, pipeline.right_source
        self.source = Names(source.upstream).sink if isinstance(source, PipelineSource) else f"{n}_source"
        self.right_source = Names(right.upstream).sink if isinstance(right, PipelineSource) else f"{n}_right_source"
        self.backlog = f"{n}_backlog"  # the handoff manifest
        self.backlog_op = f"{n}_backlog_phase"
        self.state = f"{n}_state"
        self.sink = f"{n}_sink"
        self.quarantine = f"{n}_quarantine"
        self.source_op = f"{n}_source_heads"
        self.health = f"{n}_live_health"
        self.fresh = "sink_fresh"
        self.live_running = "live_phase_running"
        self.slices = f"{n}_backlog_slices"
        self.slices_have_data = "slices_have_data"
        self.live_asset = f"{n}_live"
        self.backlog_job = f"{n}_backlog_job"
        self.slices_job = f"{n}_backlog_slices_job"
        self.live_job = f"{n}_live_job"
        self.switch = f"{n}_switch"
        self.schedule = f"{n}_slices_schedule"
        self.checks = f"{n}_backlog_checks"
        self.next_generation = f"{n}_next_generation"  # a redeploy's new generation
        self.next_generation_checks = f"{n}_next_generation_checks"
        self.swap = f"{n}_swap"
        # The redeploy's assets have a group of their own: the pipeline group's "Materialize all" never runs them.
        self.redeploy_group = f"{n}_redeploy"
        self.redeploy_job = f"{n}_redeploy_job"
