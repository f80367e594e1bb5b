"""What the engine starts on this machine stays on it and ends with it: a local Spark session listens on loopback
only, and a local broker stops when the process that started it gets SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

LOOPBACK4 = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
LOOPBACK6 = ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")  # ::1, ::ffff:127.0.0.1


def _listening(pid: int) -> list[tuple[str, int]]:
    """(local address in /proc/net hex, port) of every TCP socket of ``pid`` in state LISTEN."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                address, port = fields[1].split(":")
                if fields[3] == "0A" and fields[9] in inodes:
                    out.append((address, int(port, 16)))
    return out


def test_a_local_session_listens_on_loopback_only(spark):
    """The driver's RPC and block manager ports used to bind to the machine's network address."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    sockets = _listening(pid)
    assert len(sockets) >= 2, f"expected the driver's RPC, block manager and py4j ports, found {sockets}"
    exposed = [(a, p) for a, p in sockets if a != LOOPBACK4 and a not in LOOPBACK6]
    assert not exposed, f"the session's JVM listens beyond loopback: {exposed}"
    assert spark.conf.get("spark.driver.bindAddress") == "127.0.0.1"


_PARENT = """
import sys, time
from phases._internal.runtime.local_kafka import LocalKafka
broker = LocalKafka(sys.argv[1]).start()
print(broker.process.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_a_local_broker_stops_when_its_parent_gets_sigterm(tmp_path):
    """The broker runs in its own session: it used to keep running after its parent got SIGTERM."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "kafka")], stdout=subprocess.PIPE, text=True
    )
    broker = None
    try:
        broker = int(parent.stdout.readline())
        parent.send_signal(signal.SIGTERM)
        parent.wait(30)
        assert _gone(broker, 45), f"the broker (pid {broker}) outlived its parent"
    finally:
        parent.kill()
        if broker is not None and not _gone(broker, 0.1):
            os.killpg(broker, signal.SIGKILL)


def test_a_local_postgres_instance_keeps_each_process_connections_open(tmp_path):
    """The instance of a local PostgreSQL server (scripts.local_postgres) is Dagster's PostgreSQL storage with a pool
    in every part (scripts.pooled_postgres), as the webserver gives itself: queries reuse one connection."""
    import psycopg2
    from dagster import DagsterInstance, DagsterRun
    from sqlalchemy.pool import NullPool, QueuePool

    from scripts.local_postgres import DATABASE, USER, LocalPostgres

    server = LocalPostgres(tmp_path / "postgres").start()
    try:
        home = tmp_path / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(server.dagster_yaml())
        with DagsterInstance.from_config(str(home)) as instance:
            parts = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
            engines = [p._engine for p in parts]  # noqa: SLF001 - the engine each storage queries through
            assert all(isinstance(e.pool, QueuePool) for e in engines), [type(e.pool) for e in engines]

            def sessions() -> int:
                with psycopg2.connect(host="127.0.0.1", port=server.port, user=USER, dbname=DATABASE) as c:
                    cur = c.cursor()
                    cur.execute("select sessions from pg_stat_database where datname = %s", (DATABASE,))
                    return cur.fetchone()[0]

            before = sessions()
            for i in range(20):
                instance.add_run(DagsterRun(job_name="j", run_id=f"run-{i:02d}"))
            assert len(instance.get_runs()) == 20
            assert sessions() - before <= 3  # its own probe and at most one new connection of the pool
        (home / "dagster.yaml").write_text(server.dagster_yaml(pooled=False))
        with DagsterInstance.from_config(str(home)) as instance:
            assert isinstance(instance.run_storage._engine.pool, NullPool)  # noqa: SLF001 - dagster-postgres as it comes
    finally:
        server.stop()


def test_the_public_local_broker_command_serves_its_topics_until_sigterm_then_stops_the_broker(tmp_path):
    """``python -m phases.local kafka``, the documented way to run a broker for a trial or one's own tests: it says
    where it listens once the broker answers, with the topics asked for (one compacted); a record goes in and comes
    out; SIGTERM stops it cleanly (exit 0) and its port is closed."""
    from confluent_kafka import Consumer, Producer

    from phases.local import free_port

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "phases.local",
        "kafka",
        "--data-dir",
        str(tmp_path / "broker"),
        "--port",
        str(port),
    ]
    server = subprocess.Popen(
        [*command, "--topic", "events:2", "--topic", "results:3:compact"], stdout=subprocess.PIPE, text=True
    )
    try:
        said = server.stdout.readline()
        assert said.startswith(f"kafka: 127.0.0.1:{port} "), said
        servers = f"127.0.0.1:{port}"
        consumer = Consumer({"bootstrap.servers": servers, "group.id": "trial", "auto.offset.reset": "earliest"})
        topics = consumer.list_topics(timeout=30).topics
        assert len(topics["events"].partitions) == 2 and len(topics["results"].partitions) == 3
        producer = Producer({"bootstrap.servers": servers})
        producer.produce("events", b"hello", partition=1)
        assert producer.flush(30) == 0
        consumer.subscribe(["events"])
        message = None
        for _ in range(60):
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                break
        consumer.close()
        assert message is not None and message.value() == b"hello"
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the broker still listens"
    finally:
        server.kill()
