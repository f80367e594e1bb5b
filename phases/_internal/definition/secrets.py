"""Which settings carry credentials, and how they are shown: never.

A definition's option maps (``KafkaSource.options`` and ``client_options``, ``KafkaSink.client_options``, a Delta
source's ``options``) hold client settings as the client names them, credentials among them: SASL passwords and JAAS
configurations, SSL key and store passwords, PEM keys, OAuth client secrets, a schema registry's basic-auth user
info. A setting whose name matches :data:`SECRET_SETTING` is a secret: a definition's ``repr`` and ``str``, its
validation errors and every message of the engine show it as :data:`HIDDEN`. The value itself still reaches the
client that needs it (Spark's Kafka source, librdkafka). The state spec, and so the fingerprint, the handoff manifest
and the redeploy log, never holds an option map at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

HIDDEN = "**********"

# Spark's own redaction regex (``spark.redaction.regex``: secret, password, token, access key) and what Kafka's and
# the registry clients' credentials are called besides: JAAS configurations (which hold a password), PEM keys
# ("ssl.key.pem", "ssl.keystore.key"), basic-auth user info ("basic.auth.user.info", "user:password").
SECRET_SETTING = re.compile(
    r"(?i)(secret|password|passwd|token|access[._-]?key|credential|jaas[._]config|user[._]info|\.key\.pem|"
    r"keystore\.key|private[._-]?key|api[._-]?key)"
)

# What the engine sets on its Spark session so that Spark's plans and logs hide the same settings:
# ``spark.sql.redaction.options.regex`` (a data source's options in a plan; Spark's default covers only "url").
SPARK_OPTIONS_REDACTION = "(?i)url|" + SECRET_SETTING.pattern.removeprefix("(?i)")
# ``spark.redaction.regex``: the session's settings and environment in the UI and the event log.
SPARK_REDACTION = SECRET_SETTING.pattern


def is_secret(setting: str) -> bool:
    """True when ``setting`` (a client setting's name, e.g. ``sasl.password``) carries a credential."""
    return bool(SECRET_SETTING.search(setting))


def hidden(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the value of every secret setting replaced by :data:`HIDDEN`."""
    return {k: (HIDDEN if isinstance(k, str) and is_secret(k) else v) for k, v in options.items()}


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every occurrence of each value in ``secrets`` replaced by :data:`HIDDEN` (for a client's error
    message, which may quote a setting back)."""
    for value in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(value, HIDDEN)
    return text


def secret_values(*option_maps: Mapping[str, Any]) -> list[str]:
    """The values of every secret setting in ``option_maps``."""
    return [str(v) for options in option_maps for k, v in options.items() if is_secret(str(k)) and v]
