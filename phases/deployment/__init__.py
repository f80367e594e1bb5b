"""A definition bound to where it runs (:mod:`phases.deployment.binding`), the generations a redeploy builds and the
log that says which one serves (:mod:`phases.deployment.generations`), and a definition's relative paths resolved
under a storage root (:mod:`phases.deployment.paths`). The redeploy (:mod:`phases.redeploy`) builds on it."""

from phases.deployment.binding import Deployment, bind, deploy, maintain, require_serving, under_way_error

__all__ = ["Deployment", "bind", "deploy", "maintain", "require_serving", "under_way_error"]
