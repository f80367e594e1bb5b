"""What the engine's confluent-kafka (librdkafka) clients log: each kind of message once per client.

librdkafka retries a broker that does not answer every few tens of milliseconds and, left to itself, prints a line
to stderr for each attempt (over 2,000 in 90 s). The engine's clients log through the Python logger
``phases.kafka_client`` instead (librdkafka's ``logger`` setting), each client letting each kind of message through
once: its first occurrence, marked "(its repeats are not logged)"; a message differs in kind from another when it
differs in more than its numbers (timestamps, timings, counters, ports). What the engine does about a broker that
does not answer is said by its own error, which names the field to check and the way out. (librdkafka hands a
client's messages over when the client is polled or closed.)
"""

from __future__ import annotations

import logging
import re
import threading
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

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        text = msg % args if args else msg
        kind = _NUMBERS.sub("#", text)
        with self._lock:
            if kind in self._seen or len(self._seen) >= _MAX_KINDS:
                return
            self._seen.add(kind)
        self.logger.log(level, "%s (its repeats are not logged)", text)


def quiet(settings: dict[str, Any]) -> dict[str, Any]:
    """librdkafka ``settings`` with a logger of its own for the client (unless they name one) and, unless they set
    it, only errors logged (``log_level`` 3)."""
    return {"log_level": 3, "logger": ClientLog(), **settings}
