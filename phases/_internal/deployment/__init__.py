"""A definition bound to where it runs (:mod:`phases._internal.deployment.binding`), the generations a redeploy builds
and the log that says which one serves (:mod:`phases._internal.deployment.generations`), and a definition's relative
paths resolved under a storage root (:mod:`phases._internal.deployment.paths`). The redeploy
(:mod:`phases._internal.redeploy`) builds on it."""

from phases._internal.deployment.binding import Deployment, bind, deploy, maintain, require_serving, under_way_error

__all__ = ["Deployment", "bind", "deploy", "maintain", "require_serving", "under_way_error"]
