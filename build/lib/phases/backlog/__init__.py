"""The backlog phase: the blocking batch job over versions 0..V (:mod:`~phases.backlog.runner`), catch-up increments
and daily slices (:mod:`~phases.backlog.slices`), and a long run's progress (:mod:`~phases.backlog.progress`)."""
