"""The live phase: the runner (:mod:`~phases._internal.live.runner`), the plan it hands to the micro-batch driver
(:mod:`~phases._internal.live.plan`, :mod:`~phases._internal.live.micro_batch`), where a restart resumes
(:mod:`~phases._internal.live.resume`) and its measurements (:mod:`~phases._internal.live.report`)."""
