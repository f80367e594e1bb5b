"""Why a backlog cannot run: in pieces (catch-up increments, :func:`refuse_increments`; daily slices,
:func:`refuse_pieces`), or again after the switch (:func:`refuse_after_switch`), each refusal saying what to run
instead."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal.definition import DeltaSource, Pipeline
from phases._internal.errors import PhaseStateError
from phases._internal.operators.base import OperatorKind
from phases._internal.placement import Placement
from phases._internal.storage import tables
from phases._internal.topics import sink as topic_sinks


def refuse_increments(pipeline: Pipeline, what: str) -> None:
    """Raises PhaseStateError, saying why and what to do instead, when the pipeline's backlog cannot take
    catch-up increments (:attr:`phases._internal.definition.Pipeline.no_increments_because`)."""
    because = pipeline.no_increments_because
    if because is not None:
        raise PhaseStateError(
            f"{what} is not available for pipeline {pipeline.name!r}: {because}; run the full backlog instead"
        )


def refuse_pieces(pipeline: Pipeline, kind: OperatorKind, what: str) -> None:
    """Raises PhaseStateError unless the backlog can be built from independent pieces (daily slices): a mergeable
    state, one Delta source, no end-of-stream steps."""
    refuse_increments(pipeline, what)
    topic_sinks.refuse(pipeline, what)
    if not isinstance(pipeline.source, DeltaSource):
        raise PhaseStateError(
            f"{what} is not available for pipeline {pipeline.name!r}: its source is a "
            f"{pipeline.source.kind} source (Kafka topic), which has no commit days; catch it up with "
            "increments instead (BacklogRunner(spark, pipeline).run_increment())"
        )
    if not kind.supports_increments:
        raise PhaseStateError(
            f"{what} is not available for pipeline {pipeline.name!r}: its {kind.name} operator "
            f"{kind.no_increments_because}; run the full backlog, or catch it up with increments "
            "(BacklogRunner(spark, pipeline).run_increment(), checkpoint_interval_during_backlog), instead"
        )
    if pipeline.end_of_stream:
        raise PhaseStateError(
            f"{what} is not available for pipeline {pipeline.name!r}: its end_of_stream steps "
            f"({[s.name for s in pipeline.end_of_stream]}) consume the whole backlog 0..V in one run; "
            "run the full backlog instead"
        )


def refuse_after_switch(spark: SparkSession, where: Placement, switched: str | None, reset: bool) -> None:
    """Raises PhaseStateError once the live phase of the latest manifest (``switched``) has started, unless ``reset``
    (which then removes the live phase's quarantined rows: the reset's backlog quarantines every version again)."""
    if switched is None:
        return
    if not reset:
        raise PhaseStateError(
            f"pipeline {where.name!r} has switched to live from manifest {switched} (checkpoint "
            f"{where.live_checkpoint(switched)}): the live phase owns the state and the sink now, whether it "
            "runs or is stopped, and keeps them current from where the backlog ended. A new backlog is needed only "
            "for a changed definition: stop the live phase, then run the backlog with reset=True, which rebuilds "
            "the state and the sink from the source."
        )
    if tables.exists(spark, where.quarantine):
        spark.sql(f"DELETE FROM delta.`{where.quarantine}` WHERE pipeline = '{where.name}' AND phase = 'live'")
