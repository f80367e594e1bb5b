"""How `make test` spreads the test modules over its pytest processes: two lanes for the modules that keep a core
busy, and a third lane for the few that mostly wait.

The suite is CPU-bound on two cores, except for a few modules that spend most of their time waiting for processes
of their own: the Dagster stacks (a webserver, a daemon and a run per phase, driven through a browser) and the
topic sink's kill matrix. Their pytest process used about a sixth of a core while they ran
(benchmarks/profiles/suite-lanes-2026-12-02.txt), so a third process just for them takes their time off the two
busy lanes without a third CPU-bound process competing for the cores (three processes that all take any module are
slower than two: docs/history.md).

With three workers or more, the last one is the waiting lane: it takes only :data:`WAITING_MODULES` and then
stops. The others take the remaining modules whole, in collection order (``--dist loadfile``), and a waiting module
only when nothing else is left. With fewer workers this is ``--dist loadfile`` unchanged.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

# The modules whose pytest process mostly waits (its CPU over its time, from a full run's per-test CPU: under 1/3).
WAITING_MODULES = (
    "tests/test_redeploy_end_to_end.py",
    "tests/test_end_to_end.py",
    "tests/phases/topics/test_kafka_sink.py",
)


class WaitingLaneScheduling(LoadFileScheduling):
    """``--dist loadfile`` with the last of three or more workers kept for :data:`WAITING_MODULES`."""

    def _lane(self):
        nodes = self.nodes
        return nodes[-1] if len(nodes) >= 3 else None

    def _next_scope(self, node) -> str | None:
        """The module ``node`` takes next: the waiting lane only a waiting module; another worker the first other
        module, else a waiting one (the lane may still be busy with the first)."""
        waiting = [scope for scope in self.workqueue if scope.split("::")[0] in WAITING_MODULES]
        if node is self._lane():
            return waiting[0] if waiting else None
        others = [scope for scope in self.workqueue if scope not in waiting]
        if others:
            return others[0]
        return waiting[0] if waiting else None

    def _assign_work_unit(self, node) -> None:
        scope = self._next_scope(node)
        if scope is None:  # nothing this worker takes: it finishes what it holds, then stops
            node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if self._next_scope(node) is None:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:  # xdist's heuristic: keep two units queued
            return
        self._assign_work_unit(node)
