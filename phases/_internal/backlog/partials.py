"""A range of source versions validated, tagged and merged per key into a piece of the state (:class:`Partial`):
what a catch-up increment and a daily slice build on."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from phases._internal.operators.base import Pieces
from phases._internal.placement import Placement
from phases._internal.sources.reader import SourceReader
from phases._internal.tagging import tag_version_range


@dataclass(frozen=True)
class Partial:
    """What a version range lo..hi contributes: per-key merged buffers, quarantine rows, maxima."""

    buffers: DataFrame  # the range's piece of the state (the kind's Pieces): one row per state key
    quarantine: DataFrame
    range_max_us: int | None  # max event time of the range's valid records
    running_max_us: int | None  # max event time of all valid records in versions 0..hi
    has_quarantine: bool = True  # whether ``quarantine`` can hold any row


def version_range_partial(
    spark: SparkSession,
    where: Placement,
    source: SourceReader,
    pieces: Pieces,
    versions: tuple[int, int],
    prior_max_us: int | None,
    timings: dict[str, float] | None = None,
) -> Partial:
    """Validates, tags late records and merges per key (``pieces``: the kind's) the changes of versions lo..hi
    (inclusive).

    ``prior_max_us`` is the max event time of the valid records of all versions before ``lo``: it
    continues the version watermark, so a range's late records are the same whether it runs alone, as a
    slice, as a catch-up increment or as part of one backlog job.
    """
    tagged = tag_version_range(spark, where, source, versions, prior_max_us, timings, per_record_watermarks=False)
    buffers = pieces.of(tagged.prepared)
    return Partial(
        buffers, tagged.quarantine, tagged.range_max_us, tagged.running_max_us, has_quarantine=tagged.has_quarantine
    )
