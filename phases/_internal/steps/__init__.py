"""Steps around the stream operator: record steps (filter, derive) in both phases, and end-of-stream steps over the
backlog (:mod:`~phases._internal.steps.end_of_stream`, :mod:`~phases._internal.steps.partition_ops`)."""
