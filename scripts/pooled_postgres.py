"""Dagster's PostgreSQL storage, each process keeping its connections open.

``dagster-postgres`` opens a new connection for every query in every process but the webserver (SQLAlchemy's
``NullPool``): a local stack whose daemon evaluates four sensors every 2 seconds opened about 30 connections a second,
each a new server process, and PostgreSQL spent half a core on them while nothing ran. This is the same storage
(``DagsterPostgresStorage``: its tables, queries and migrations) with the pool the webserver gives itself
(``optimize_for_webserver``) in every process that loads the instance: the daemon, the code servers and the runs.
Statements have no time limit, as in Dagster's own processes (the webserver's 15 s limit is for its queries only).
The instance configuration of :class:`scripts.local_postgres.LocalPostgres` names this class."""

from __future__ import annotations

from typing import Any

from dagster_postgres import DagsterPostgresStorage

NO_STATEMENT_TIMEOUT = 0
# The webserver's pool (dagster-webserver's --db-pool-recycle, --db-pool-max-overflow defaults).
POOL_RECYCLE_S = 3_600
POOL_MAX_OVERFLOW = 20


class PooledPostgresStorage(DagsterPostgresStorage):
    """``storage: custom: {module: scripts.pooled_postgres, class: PooledPostgresStorage, config: <postgres>}``
    takes the configuration of ``storage: postgres:`` and gives Dagster's own storage, pooled."""

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> DagsterPostgresStorage:
        storage = super().from_config_value(inst_data, config_value)
        for part in (storage.run_storage, storage.event_log_storage, storage.schedule_storage):
            part.optimize_for_webserver(
                statement_timeout=NO_STATEMENT_TIMEOUT, pool_recycle=POOL_RECYCLE_S, max_overflow=POOL_MAX_OVERFLOW
            )
        return storage
