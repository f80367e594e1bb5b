"""Where a definition runs (:mod:`phases._internal.deployment.placement`), placed once at each entry point
(:mod:`phases._internal.deployment.binding`), and the generations a redeploy builds with the log that says which one
serves (:mod:`phases._internal.deployment.generations`). The redeploy (:mod:`phases._internal.redeploy`) builds on
it."""

from phases._internal.deployment.binding import (
    maintain,
    maintain_placed,
    place,
    require_serving,
    settle,
    under_way_error,
)
from phases._internal.placement import Placement

__all__ = ["Placement", "maintain", "maintain_placed", "place", "require_serving", "settle", "under_way_error"]
