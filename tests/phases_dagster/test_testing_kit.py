"""The Dagster half of the pytest kit (:mod:`phases_dagster.testing`): a user's pipeline materialized with its
checks."""

from __future__ import annotations

from phases_dagster.testing import materialize_backlog
from tests.helpers import write_source
from tests.phases.backlog.test_backlog import DELAY_S, S
from tests.phases_dagster.conftest import relative_pipeline


def test_materialize_backlog_runs_the_backlog_and_its_checks_on_a_throwaway_instance(spark, tmp_path):
    write_source(spark, str(tmp_path / "src"), {1: [("a", 10 * S, 1), ("b", 20 * S, 2)], 2: [("a", 30 * S, 3)]})
    result = materialize_backlog(spark, relative_pipeline(delay_s=DELAY_S), root=tmp_path)
    assert result.success and result.checks and all(result.checks.values()), result.checks
    assert result.metadata["keys"] == 2 and result.metadata["input_rows"] == 3
    assert result.metadata["handoff"]["source_version"] == 2
