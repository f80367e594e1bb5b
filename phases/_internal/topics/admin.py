"""The topic sink's administration and its clients' settings: the settings every engine client of the sink's brokers
starts from, the error for brokers that do not answer before anything is written, and which client errors are worth
asking again (a broker away, a group coordinator moving)."""

from __future__ import annotations

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


def broker_away(error) -> bool:
    """Whether a client error says a broker did not answer (down, restarting, a partition without a leader): asked
    again, it may answer."""
    from confluent_kafka import KafkaError

    codes = {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._NOENT,  # "no leaders found" while a restarted broker takes its partitions up
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.FENCED_LEADER_EPOCH,  # a client's leader epoch from before the broker restarted
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
    return getattr(error, "code", lambda: None)() in codes or bool(getattr(error, "retriable", lambda: False)())


def coordinator_moving(error) -> bool:
    """A group coordinator that is moving or still loading its offsets: the same request succeeds shortly."""
    from confluent_kafka import KafkaError

    return error.code() in (
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    )
