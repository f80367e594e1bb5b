"""Credentials in a definition's option maps are never shown: not in its repr or str, a validation error, its state
spec (so neither its fingerprint, the handoff manifest nor the redeploy log), nor in a Spark plan of the source it
reads; the clients still get them."""

from __future__ import annotations

import pytest

from phases import DefinitionError, KafkaSink, KafkaSource
from phases._internal.definition.secrets import HIDDEN, is_secret
from phases._internal.sources.kafka import client_conf
from tests.conftest import make_pipeline

PLANTED = {
    "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
    'password="planted-jaas-7f3a";',
    "kafka.ssl.key.password": "planted-ssl-key-19c2",
}
CLIENT = {"sasl.password": "planted-sasl-5d8e", "sasl.username": "team", "security.protocol": "SASL_SSL"}
SINK_CLIENT = {"ssl.key.password": "planted-sink-key-2b41", "basic.auth.user.info": "team:planted-registry-88aa"}
SECRETS = (
    "planted-jaas-7f3a",
    "planted-ssl-key-19c2",
    "planted-sasl-5d8e",
    "planted-sink-key-2b41",
    "planted-registry",
)


def _pipeline(tmp_path):
    source = KafkaSource(
        topic="events",
        bootstrap_servers="127.0.0.1:9",
        value_schema="key string, ts timestamp, value bigint",
        options=PLANTED,
        client_options=CLIENT,
    )
    sink = KafkaSink(topic="results", bootstrap_servers="127.0.0.1:9", path="results", client_options=SINK_CLIENT)
    return make_pipeline(source, str(tmp_path / "run"), sink=sink)


@pytest.mark.parametrize(
    "setting",
    [
        "sasl.password",
        "kafka.sasl.jaas.config",
        "ssl.key.password",
        "ssl.keystore.key",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "basic.auth.user.info",
        "schema.registry.basic.auth.user.info",
    ],
)
def test_credential_settings_are_secret(setting):
    assert is_secret(setting)


@pytest.mark.parametrize("setting", ["security.protocol", "sasl.mechanism", "sasl.username", "ssl.ca.location"])
def test_other_settings_are_shown(setting):
    assert not is_secret(setting)


def test_a_definitions_repr_and_str_hide_every_credential_and_show_the_rest(tmp_path):
    p = _pipeline(tmp_path)
    for shown in (repr(p), str(p), repr(p.source), f"{p!r}"):
        assert not [s for s in SECRETS if s in shown], shown
        assert HIDDEN in shown and "SASL_SSL" in shown and "team" in shown
    assert HIDDEN in str(p.sink) and not [s for s in SECRETS if s in str(p.sink)], str(p.sink)
    assert p.source.options == PLANTED and p.sink.client_options == SINK_CLIENT  # the values themselves are kept
    assert client_conf(p.source, p.source.bootstrap_servers)["sasl.password"] == CLIENT["sasl.password"]


def test_the_state_spec_and_fingerprint_hold_no_option_map(tmp_path):
    p = _pipeline(tmp_path)
    bare = p.model_copy(
        update={
            "source": p.source.model_copy(update={"options": {}, "client_options": {}}),
            "sink": p.sink.model_copy(update={"client_options": {}}),
        }
    )
    assert not [s for s in SECRETS if s in str(p.state_spec())]
    assert p.fingerprint() == bare.fingerprint()


def test_a_validation_error_never_quotes_a_credential():
    with pytest.raises(DefinitionError) as bad_type:
        KafkaSource(
            topic="events",
            bootstrap_servers="127.0.0.1:9",
            value_schema="key string",
            options={"kafka.sasl.jaas.config": ["planted-jaas-7f3a"]},
        )
    assert "options.kafka.sasl.jaas.config" in str(bad_type.value) and "planted" not in str(bad_type.value)
    with pytest.raises(DefinitionError) as owned:
        KafkaSource(
            topic="events",
            bootstrap_servers="127.0.0.1:9",
            value_schema="key string",
            options={"subscribe": "other", **PLANTED},
        )
    assert "subscribe" in str(owned.value) and not [s for s in SECRETS if s in str(owned.value)], owned.value


def test_the_engines_session_redacts_the_same_settings_in_sparks_plans_and_ui(spark):
    """Spark shows a data source's options in some plans and its settings in the UI and event log, redacting those
    whose name matches its regexes (its defaults: 'url'; secret, password, token, access key): the engine's session
    sets both to the engine's rule, so a JAAS configuration or basic-auth user info is redacted too. The Java
    regexes are checked in the JVM, where Spark applies them."""
    pattern = spark._jvm.java.util.regex.Pattern
    for conf in ("spark.sql.redaction.options.regex", "spark.redaction.regex"):
        regex = pattern.compile(spark.conf.get(conf))
        for setting in (*PLANTED, *CLIENT, *SINK_CLIENT):
            assert regex.matcher(setting).find() == is_secret(setting.removeprefix("kafka.")), (conf, setting)


def _avro_pipeline(tmp_path, user_info: str = "team:planted-registry-source-31ef"):
    from phases import SchemaRegistry

    registry = SchemaRegistry(url="http://127.0.0.1:9", client_options={"basic.auth.user.info": user_info})
    source = KafkaSource(topic="events", bootstrap_servers="127.0.0.1:9", value_format="avro", registry=registry)
    sink = KafkaSink(
        topic="results", bootstrap_servers="127.0.0.1:9", path="results", value_format="avro", registry=registry
    )
    return make_pipeline(source, str(tmp_path / "run"), sink=sink)


def test_a_schema_registrys_credentials_are_hidden_and_outside_the_fingerprint(tmp_path):
    p = _avro_pipeline(tmp_path)
    for shown in (repr(p), str(p), repr(p.source), str(p.sink)):
        assert "planted-registry-source-31ef" not in shown and HIDDEN in shown, shown
    assert "planted" not in str(p.state_spec())
    assert p.fingerprint() == _avro_pipeline(tmp_path, "other:credentials").fingerprint()
    with pytest.raises(DefinitionError) as bad:
        from phases import SchemaRegistry

        SchemaRegistry(url="http://127.0.0.1:9", client_options={"basic.auth.user.info": "no-colon-planted-77"})
    assert "basic.auth.user.info" in str(bad.value) and "planted" not in str(bad.value)
    with pytest.raises(DefinitionError) as in_url:
        SchemaRegistry(url="http://team:planted-in-url-4e@127.0.0.1:9")
    assert "registry.url holds credentials" in str(in_url.value) and "planted" not in str(in_url.value)


def test_a_registry_that_does_not_answer_is_named_without_its_credentials():
    from datetime import timedelta

    from phases import SchemaRegistry, SourceError
    from phases._internal.runtime.schema_registry import RegistryClient
    from phases.local import free_port

    registry = SchemaRegistry(
        url=f"http://127.0.0.1:{free_port()}",
        client_options={"basic.auth.user.info": "team:planted-registry-dead-5c1"},
        connect_timeout=timedelta(seconds=1),
    )
    with pytest.raises(SourceError) as dead:
        RegistryClient(registry, "source.registry", SourceError).versions("events-value")
    text = str(dead.value)
    assert "source.registry" in text and "did not answer within 1 s" in text and "connect_timeout" in text
    assert "planted" not in text
