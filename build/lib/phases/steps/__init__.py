"""Steps around the stream operator: record steps (filter, derive) in both phases, and end-of-stream steps over the
backlog (:mod:`~phases.steps.end_of_stream`, :mod:`~phases.steps.partition_ops`)."""
