"""Who runs and how far a run got: the pipeline's leases (one backlog, one live phase, one redeploy at a time) and
the live phase's progress log (what each micro-batch applied)."""
