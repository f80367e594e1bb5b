"""The topic sink's administration and its clients' settings: the settings every engine client of the sink's brokers
starts from, the error for brokers that do not answer before anything is written, and a redeploy's new result topic
made like the serving one."""

from __future__ import annotations

import time

from phases._internal.errors import SinkError
from phases._internal.runtime import kafka_client_log


def unanswered(where: str, servers: str, timeout_s: float, exc: Exception, settings: dict | None = None) -> SinkError:
    """The SinkError for brokers that did not answer before anything was written, or that refused the credentials
    of a client of ``settings``."""
    refused = kafka_client_log.refusal(settings or {})
    if refused is not None:
        return SinkError(
            f"{where}: the brokers at {servers} refused the credentials in sink.client_options ({refused}). Nothing "
            "was written. Set the right sasl.username and sasl.password (or the security settings the brokers ask "
            "for) in sink.client_options, then run again"
        )
    cause = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
    return SinkError(
        f"{where}: the brokers at {servers} (sink.bootstrap_servers) did not answer within {timeout_s:g} s "
        f"(sink.connect_timeout): {cause}. Nothing was written. Check that the brokers run and that "
        "sink.bootstrap_servers and sink.client_options (security, credentials) are right, then run again: a backlog "
        "starts over, a live phase resumes from its checkpoint and publishes nothing twice"
    )


def client_settings(servers: str, extra: dict[str, str] | None) -> dict:
    return kafka_client_log.quiet({"bootstrap.servers": servers, **(extra or {})})


def create_topic_like(
    servers: str, model: str, name: str, *, client_config: dict[str, str] | None = None, timeout_s: float = 30.0
) -> bool:
    """Creates topic ``name`` with the partition count, the replication and the settings set on topic ``model`` (its
    ``cleanup.policy``, retention, ...), unless ``name`` exists; returns whether it created it. A SinkError naming
    both topics when ``model`` does not exist or the broker refuses (for example without the right to create
    topics)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

    settings = client_settings(servers, client_config)
    admin = AdminClient(settings)
    try:
        topics = kafka_client_log.list_topics(admin, settings, None, timeout_s).topics
    except KafkaException as exc:
        where = f"topic {name!r} (to be created like {model!r})"
        raise unanswered(where, servers, timeout_s, exc, settings) from exc
    if name in topics and topics[name].error is None:
        return False
    found = topics.get(model)
    if found is None or found.error is not None or not found.partitions:
        raise SinkError(f"topic {name!r} is to be created like topic {model!r}, which does not exist on {servers}")
    partitions = len(found.partitions)
    replication = len(next(iter(found.partitions.values())).replicas)
    resource = ConfigResource(ResourceType.TOPIC, model)
    described = admin.describe_configs([resource])[resource].result(timeout_s)
    configs = {
        key: entry.value
        for key, entry in described.items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and not entry.is_sensitive
    }
    new = NewTopic(name, partitions, replication, config=configs)
    futures = admin.create_topics([new], operation_timeout=timeout_s)
    try:
        futures[name].result(timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise SinkError(
            f"topic {name!r} could not be created on {servers} like topic {model!r}: {exc}. Create it ({partitions} "
            f"partitions, replication {replication}, settings {configs}) and run again"
        ) from exc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        made = admin.list_topics(name, timeout=timeout_s).topics.get(name)
        ready = made is not None and made.error is None and len(made.partitions) == partitions
        if ready and all(p.leader >= 0 for p in made.partitions.values()):
            return True
        time.sleep(0.2)
    raise SinkError(f"topic {name!r} was created on {servers} but its partitions got no leader in {timeout_s:.0f} s")
