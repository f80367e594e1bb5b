"""A throwaway PostgreSQL server on 127.0.0.1 for a production-like Dagster instance (Debian's PostgreSQL).

``LocalPostgres(folder).start()`` makes a fresh data directory with ``initdb``, starts ``postgres`` on a free
loopback port and creates the ``dagster`` database; ``stop()`` stops it. Trust authentication on loopback only:
this is a test and demo server, not a deployment (docs/dagster.md, "The instance" shows a production ``dagster.yaml``).

PostgreSQL refuses to run as root; as root, the server runs as the ``postgres`` user the Debian package creates,
with its data directory in a folder that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

USER = "dagster"
DATABASE = "dagster"


class PostgresError(RuntimeError):
    pass


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise PostgresError(
        f"PostgreSQL's {name} is not installed; scripts/setup.sh installs Debian's 'postgresql' package "
        "(apt-get install postgresql)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    def __init__(self, folder: str | Path, port: int | None = None):
        self.folder = Path(folder)
        self.port = port or _free_port()
        self.proc: subprocess.Popen | None = None
        self._as_root = os.geteuid() == 0
        self.data: Path | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _run_as(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if self._as_root else []

    def start(self, timeout_s: float = 60) -> LocalPostgres:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresError("running as root needs the 'postgres' user of Debian's package") from exc
            # A folder of the postgres user's own, outside root-only parents (pytest's tmp dirs are 0700).
            base = Path(tempfile.mkdtemp(prefix="phases-pg-"))
            os.chmod(base, 0o755)
            os.chown(base, owner.pw_uid, owner.pw_gid)
            self.data = base / "data"
        else:
            self.data = self.folder / "data"
        log = self.folder / "postgres.log"
        out = subprocess.run(
            [*self._run_as(), _bin("initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise PostgresError(f"initdb failed ({out.returncode}): {out.stderr[-2000:]}")
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                *self._run_as(),
                _bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.data),  # the Unix socket next to the data, not /var/run/postgresql
            ],
            stdout=open(log, "ab"),  # noqa: SIM115 - the server's log for its whole life
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while True:
            if self.proc.poll() is not None:
                raise PostgresError(f"postgres exited with {self.proc.returncode}; see {log}")
            ready = subprocess.run(
                [_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER], capture_output=True
            )
            if ready.returncode == 0:
                break
            if time.monotonic() - started > timeout_s:
                raise PostgresError(f"postgres not ready after {timeout_s:.0f} s; see {log}")
            time.sleep(0.2)
        create = subprocess.run(
            [_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, DATABASE],
            capture_output=True,
            text=True,
        )
        if create.returncode != 0:
            raise PostgresError(f"createdb failed: {create.stderr}")
        return self

    def dagster_yaml(self, *, pooled: bool = True) -> str:
        """The instance configuration of a DAGSTER_HOME whose storage is this server: Dagster's PostgreSQL storage,
        whose connections each process keeps open (:mod:`scripts.pooled_postgres`; the project folder must be on
        the stack's ``PYTHONPATH``, as :class:`scripts.dagster_stack.DagsterStack` puts it), or, not ``pooled``,
        ``storage: postgres:`` as it comes (a new connection for every query)."""
        database = (
            "postgres_db:\n"
            f"  username: {USER}\n"
            "  password: ''\n"
            "  hostname: 127.0.0.1\n"
            f"  db_name: {DATABASE}\n"
            f"  port: {self.port}\n"
            "  scheme: postgresql+psycopg2\n"
        )
        if not pooled:
            return "storage:\n  postgres:\n" + textwrap.indent(database, "    ")
        return (
            "storage:\n"
            "  custom:\n"
            "    module: scripts.pooled_postgres\n"
            "    class: PooledPostgresStorage\n"
            "    config:\n" + textwrap.indent(database, "      ")
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        if self._as_root and self.data is not None:
            shutil.rmtree(self.data.parent, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
