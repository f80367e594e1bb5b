"""A schema registry, as a Kafka source or a topic sink names it: where the schemas of a topic's Avro or Protobuf
records are kept.

The framework speaks the Confluent Schema Registry API (``/subjects``, ``/schemas/ids``, ``/compatibility``,
``/config``), which Confluent's registry, Apicurio Registry (its ``/apis/ccompat/v7`` path), Karapace and Redpanda
serve. Records are in the Confluent wire format: a zero magic byte, the schema's id (4 bytes, big-endian), for
Protobuf the message indexes, then the binary encoding. A topic's value schemas live under the subject
``<topic>-value`` and its key schemas under ``<topic>-key`` (the TopicNameStrategy), unless the definition names
another subject.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from phases._internal.definition.fields import _Model

# The settings the registry client takes in ``client_options`` (as Confluent's clients name them).
REGISTRY_SETTINGS = ("basic.auth.user.info",)


class SchemaRegistry(_Model):
    """Where the schemas of a topic's records are: a Confluent-compatible schema registry's base URL. Not part of a
    pipeline's fingerprint (a registry may move; what a record means is its schema, named by the record itself)."""

    url: str = Field(
        min_length=1,
        description="The registry's base URL, e.g. 'http://127.0.0.1:8081' (Confluent) or "
        "'http://127.0.0.1:8080/apis/ccompat/v7' (Apicurio).",
    )
    client_options: dict[str, str] = Field(
        default_factory=dict,
        description="The registry client's settings, as Confluent's clients name them: one of "
        f"{list(REGISTRY_SETTINGS)} ('user:password', sent as HTTP basic authentication). Never shown.",
    )
    connect_timeout: timedelta = Field(
        default=timedelta(seconds=30),
        description="How long the engine waits for the registry to answer before it stops, naming the registry's "
        "url (nothing read or written).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        if not v.startswith(("http://", "https://")):
            raise ValueError("registry.url must start with http:// or https://")
        if "@" in urlsplit(v).netloc:  # a URL's user info would be printed wherever the URL is
            raise ValueError(
                "registry.url holds credentials (user info before '@'); give the URL without them and the "
                "credentials in registry.client_options['basic.auth.user.info'] ('user:password'), which is never shown"
            )
        return v.rstrip("/")

    @field_validator("client_options")
    @classmethod
    def _client_options(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(k for k in v if k not in REGISTRY_SETTINGS)
        if unknown:
            raise ValueError(f"registry.client_options {unknown} are not registry settings; the valid ones: "
                             f"{list(REGISTRY_SETTINGS)}")  # fmt: skip
        if "basic.auth.user.info" in v and ":" not in v["basic.auth.user.info"]:
            raise ValueError("registry.client_options['basic.auth.user.info'] must be 'user:password'")
        return v

    @field_validator("connect_timeout")
    @classmethod
    def _timeout(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("registry.connect_timeout must be positive")
        return v
