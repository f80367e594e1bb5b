"""A single-node Apache Kafka broker in KRaft mode (no ZooKeeper) on 127.0.0.1, for the demo and the tests.

The broker runs from the jars the setup step fetched from Maven Central
(:data:`phases._internal.runtime.jvm_deps.KAFKA_BROKER`), in a JVM of its own, with a fresh data directory:
``kafka.tools.StorageTool format`` then ``kafka.Kafka``. It is one process that is both controller and broker.
:meth:`LocalKafka.stop` and :meth:`LocalKafka.start` on the same data directory stop it and bring it back with its
topics and offsets (the tests' broker restart).

    with LocalKafka(data_dir) as kafka:
        kafka.create_topic("events", partitions=3)
        ... kafka.bootstrap_servers ...
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from phases._internal.errors import SetupError
from phases._internal.runtime import jvm_deps, watchdog

_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners={protocol}://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map={protocol}:{protocol},CONTROLLER:PLAINTEXT
inter.broker.listener.name={protocol}
log.dirs={log_dir}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
log.retention.bytes=-1
"""

# SASL/PLAIN on the client listener with Kafka's ACL authorizer: only the admin (a super user) may do anything
# without an ACL. The controller listener stays plain on loopback: its principal, ANONYMOUS, is a super user too.
_SASL_PROPERTIES = """\
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{admin};User:ANONYMOUS
allow.everyone.if.no.acl.found=false
"""
ADMIN_USER = "admin"

_LOG4J = """\
<Configuration status="WARN">
  <Appenders><File name="file" fileName="{log_file}"><PatternLayout pattern="[%d] %p %m (%c)%n"/></File></Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="file"/></Root></Loggers>
</Configuration>
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalKafka:
    """One KRaft broker+controller on loopback ports, its data under ``data_dir`` (made fresh unless
    ``keep_data``)."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        port: int | None = None,
        heap: str = "384m",
        keep_data: bool = False,
        users: dict[str, str] | None = None,
    ):
        """``users``: user -> password. Given, the broker takes SASL/PLAIN connections only (``SASL_PLAINTEXT``) and
        authorizes by ACL: a user may do nothing until :meth:`allow` grants it (the broker's own admin user, with a
        generated password, may do everything: :attr:`admin_settings`)."""
        self.data_dir = Path(data_dir)
        self.users = dict(users or {})
        self._admin_password = uuid.uuid4().hex if users else None
        self.port = port or free_port()
        self.controller_port = free_port()
        self.heap = heap
        self.keep_data = keep_data
        self.process: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self._formatted = False

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def _java(self, main: str, *args: str, **popen) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise SetupError("Java is needed to run the Kafka broker and is not on PATH; run `make setup`")
        classpath = os.pathsep.join(jvm_deps.jar_paths(bundle=jvm_deps.KAFKA_BROKER))
        return [
            java,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # a test broker: quick start beats peak throughput
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.xml'}",
            "-cp",
            classpath,
            main,
            *args,
        ]

    def _format(self) -> None:
        if not self.keep_data and self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = self.data_dir / "server.properties"
        protocol = "SASL_PLAINTEXT" if self.users else "PLAINTEXT"
        text = _PROPERTIES.format(
            port=self.port, controller_port=self.controller_port, log_dir=self.data_dir / "logs", protocol=protocol
        )
        if self.users:
            accounts = {ADMIN_USER: self._admin_password, **self.users}
            jaas = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{ADMIN_USER}" password="{self._admin_password}" '
                + " ".join(f'user_{user}="{password}"' for user, password in accounts.items())
                + ";"
            )
            text += _SASL_PROPERTIES.format(jaas=jaas, admin=ADMIN_USER)
        props.write_text(text)
        (self.data_dir / "log4j2.xml").write_text(_LOG4J.format(log_file=self.log_file))
        if (self.data_dir / "logs" / "meta.properties").exists():
            self._formatted = True
            return
        cluster_id = _cluster_id()
        cmd = self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(props))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise SetupError(
                f"formatting the Kafka data directory {self.data_dir} failed: {proc.stderr or proc.stdout}"
            )
        self._formatted = True

    def start(self, timeout: float = 90.0) -> LocalKafka:
        """Starts the broker (formatting its data directory the first time) and waits until it answers."""
        if self.process is not None and self.process.poll() is None:
            return self
        if not self._formatted:
            self._format()
        out = open(self.data_dir / "broker.out", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(self.data_dir / "server.properties")),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        # The broker is in its own session: without the watchdog it would outlive a parent that gets SIGTERM.
        self._watchdog = watchdog.guard(self.process.pid)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SetupError(
                    f"the Kafka broker exited with code {self.process.returncode} while starting; see "
                    f"{self.data_dir / 'broker.out'} and {self.log_file}"
                )
            if _accepts(self.port):  # then the client, which would log every refused connection
                try:
                    if self.admin().list_topics(timeout=5).brokers:
                        return
                except Exception:  # noqa: BLE001 - not up yet
                    pass
            time.sleep(0.3)
        self.stop()
        raise SetupError(f"the Kafka broker did not answer on {self.bootstrap_servers} within {timeout:.0f} s")

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the broker (SIGTERM: a controlled shutdown; SIGKILL after ``timeout``). Its data stays."""
        watchdog.stop(self.process, self._watchdog, timeout)
        self.process, self._watchdog = None, None

    @property
    def admin_settings(self) -> dict[str, str]:
        """librdkafka settings of the broker's admin (empty for a broker without users)."""
        return client_settings(ADMIN_USER, self._admin_password) if self._admin_password else {}

    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers, **self.admin_settings})

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> None:
        """Creates ``name`` and waits until every partition has a leader."""
        create_topic(self.bootstrap_servers, name, partitions, client_config=self.admin_settings, **config)

    def allow(self, user: str, *, topics: tuple[str, ...] = (), prefixes: tuple[str, ...] = ()) -> None:
        """Grants ``user`` every operation on the ``topics`` named, and on every topic, consumer group and
        transactional id whose name starts with one of ``prefixes`` (a broker with users only)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        if not self.users:
            raise SetupError("this broker has no users: it authorizes nothing")
        grant = [(ResourceType.TOPIC, t, ResourcePatternType.LITERAL) for t in topics] + [
            (kind, prefix, ResourcePatternType.PREFIXED)
            for prefix in prefixes
            for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
        ]
        bindings = [
            AclBinding(kind, name, pattern, f"User:{user}", "*", AclOperation.ALL, AclPermissionType.ALLOW)
            for kind, name, pattern in grant
        ]
        admin = self.admin()  # alive until the futures resolve
        for future in admin.create_acls(bindings).values():
            future.result(30)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def client_settings(user: str, password: str) -> dict[str, str]:
    """librdkafka settings of ``user`` on a local broker with users (SASL/PLAIN over plain TCP on loopback)."""
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": password}  # fmt: skip


def spark_options(user: str, password: str) -> dict[str, str]:
    """The same as options of Spark's Kafka source and writer (``kafka.``-prefixed Java client settings)."""
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" password="{password}";'
    return {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": jaas,
    }


def create_topic(
    servers: str, name: str, partitions: int = 1, *, client_config: dict[str, str] | None = None, **config: str
) -> None:
    """Creates topic ``name`` (replication 1: a local broker) on ``servers`` and waits until every partition has a
    leader; SetupError when it does not get them within 30 s."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers, **(client_config or {})})  # alive until the future resolves
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config)], operation_timeout=30)
    futures[name].result(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        ready = topic and topic.error is None and len(topic.partitions) == partitions
        if ready and all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.2)
    raise SetupError(f"topic {name!r} did not get leaders for its {partitions} partitions in 30 s")


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (what ``random-uuid`` prints), and,
    like Kafka's own ``Uuid.randomUuid``, never starting with '-' (a command line would read it as an option)."""
    import base64

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
