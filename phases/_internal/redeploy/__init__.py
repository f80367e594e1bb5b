"""Changing a running pipeline without taking its results down: a changed definition is built beside the one that
serves (a new generation, :mod:`phases._internal.deployment.generations`) and swapped in with one commit on the sink
consumers read (:mod:`phases._internal.redeploy.swap`); :mod:`phases._internal.redeploy.runner` drives it. A rollback is
a redeploy of the previous definition, whose generation is kept."""
