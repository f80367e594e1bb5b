"""A SparkSession as a swappable Dagster resource: built lazily, stopped after the run."""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from phases import SparkSettings, build_session


class SparkResource(dg.ConfigurableResource):
    """Local Spark by default; ``master`` takes a cluster URL. Use with the in-process executor."""

    master: str = "local[2]"
    shuffle_partitions: int = 8
    driver_memory: str = "2g"
    state_store: str = "rocksdb"
    ui_enabled: bool = False
    python: str | None = Field(
        default=None, description="The executors' Python interpreter on a cluster (see SparkSettings.python)."
    )
    py_files: list[str] = Field(
        default_factory=list,
        description="Archives shipped to the executors' Python path (see SparkSettings.py_files; "
        "phases.package_archive builds one).",
    )
    s3a: bool = Field(default=False, description="Load the S3A connector for s3a:// tables (see SparkSettings.s3a).")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")
    stop_after_run: bool = Field(
        default=True, description="Stop the session when the run ends (False: leave a shared session, e.g. in tests)."
    )

    _session: SparkSession | None = PrivateAttr(default=None)

    def settings(self) -> SparkSettings:
        return SparkSettings(
            master=self.master,
            shuffle_partitions=self.shuffle_partitions,
            driver_memory=self.driver_memory,
            state_store=self.state_store,  # pyright: ignore[reportArgumentType]
            ui_enabled=self.ui_enabled,
            python=self.python,
            py_files=list(self.py_files),
            s3a=self.s3a,
            extra_conf=dict(self.conf),
        )

    def session(self) -> SparkSession:
        if self._session is None:
            self._session = build_session(self.settings())
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None and self.stop_after_run:
            self._session.stop()
            self._session = None
