"""The backlog phase: the blocking batch job over versions 0..V (:mod:`~phases._internal.backlog.runner`), catch-up
increments and daily slices (:mod:`~phases._internal.backlog.slices`), and a long run's progress
(:mod:`~phases._internal.backlog.progress`)."""
