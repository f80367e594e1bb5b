"""What the engine's confluent-kafka (librdkafka) clients log: each kind of message once per client.

librdkafka retries a broker that does not answer every few tens of milliseconds and, left to itself, prints a line
to stderr for each attempt (over 2,000 in 90 s). The engine's clients log through the Python logger
``phases.kafka_client`` instead (librdkafka's ``logger`` setting), each client letting each kind of message through
once: its first occurrence, marked "(its repeats are not logged)"; a message differs in kind from another when it
differs in more than its numbers (timestamps, timings, counters, ports). What the engine does about a broker that
does not answer is said by its own error, which names the field to check and the way out. (librdkafka hands a
client's messages over when the client is polled or closed.)

The same object is the client's ``error_cb``: it keeps the first authentication failure the brokers sent
(:func:`refusal`), so that a caller tells credentials the brokers refused from brokers that did not answer. librdkafka
says the first only as a transport error and retries until its timeout; :func:`list_topics` asks in slices of a
second and stops at a refusal.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

LOGGER_NAME = "phases.kafka_client"
_MAX_KINDS = 200  # kinds one client remembers; past this many, its new kinds are no longer logged
_NUMBERS = re.compile(r"\d+")


class ClientLog:
    """The ``logger`` of one librdkafka client: each kind of message once, to :data:`LOGGER_NAME`."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.logger = logging.getLogger(LOGGER_NAME)
        self.refused: str | None = None

    def error(self, err: Any) -> None:
        """librdkafka's ``error_cb``: an authentication failure is kept (the first). Not logged: librdkafka's log
        says each error already."""
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._AUTHENTICATION and self.refused is None:
            self.refused = err.str()

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        text = msg % args if args else msg
        kind = _NUMBERS.sub("#", text)
        with self._lock:
            if kind in self._seen or len(self._seen) >= _MAX_KINDS:
                return
            self._seen.add(kind)
        self.logger.log(level, "%s (its repeats are not logged)", text)


def quiet(settings: dict[str, Any]) -> dict[str, Any]:
    """librdkafka ``settings`` with a logger of its own for the client (unless they name one), the same as its
    ``error_cb``, and, unless they set it, only errors logged (``log_level`` 3)."""
    log = settings.get("logger")
    if not isinstance(log, ClientLog):
        log = ClientLog()
    return {"log_level": 3, "logger": log, "error_cb": log.error, **settings}


def refusal(settings: dict[str, Any]) -> str | None:
    """The authentication failure the brokers sent a client of ``settings`` (None: none so far)."""
    log = settings.get("logger")
    return log.refused if isinstance(log, ClientLog) else None


def list_topics(client: Any, settings: dict[str, Any], topic: str | None, timeout_s: float) -> Any:
    """``client.list_topics(topic)`` within ``timeout_s``, asked in slices of a second: the client is polled between
    them (librdkafka hands its errors over then), and a refusal of the credentials stops the asking. Raises the
    client's last KafkaException at the timeout or the refusal; a caller reads :func:`refusal` to tell them apart."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.1, min(1.0, left)))
        except KafkaException:
            client.poll(0)
            if refusal(settings) is not None or time.monotonic() >= deadline:
                raise
