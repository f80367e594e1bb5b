"""The live phase: the runner (:mod:`~phases.live.runner`), the plan it hands to the micro-batch driver
(:mod:`~phases.live.plan`, :mod:`~phases.live.micro_batch`), where a restart resumes (:mod:`~phases.live.resume`) and
its measurements (:mod:`~phases.live.report`)."""
