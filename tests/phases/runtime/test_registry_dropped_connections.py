"""A registry that closes a connection without an answer (Apicurio Registry does, about once in ten thousand calls on
this machine): the engine's registry client and the kit's :class:`phases.local.LocalRegistry` each try the call again
and get the answer; a registry that drops every call is reported, once the engine's timeout is spent, as the engine's
error naming the field."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest

from phases import SchemaRegistry
from phases._internal.errors import SourceError
from phases._internal.runtime.schema_registry import RegistryClient
from phases.local import LocalRegistry

VERSIONS = [1, 2]


@contextmanager
def dropping_server(drops: int | None) -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on loopback that reads each request and closes the first ``drops`` connections (None: every one)
    without a byte of answer, then answers every request with the JSON ``VERSIONS``; yields its port and the request
    lines it read."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    seen: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                seen.append(request.split(b"\r\n", 1)[0].decode())
                if drops is None or len(seen) <= drops:
                    continue  # closed without an answer
                body = json.dumps(VERSIONS).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_the_engines_registry_client_tries_a_dropped_connection_again():
    with dropping_server(drops=2) as (port, seen):
        registry = SchemaRegistry(url=f"http://127.0.0.1:{port}")
        client = RegistryClient(registry, "sink.registry", SourceError)
        assert client._call("GET", "/subjects/events-value/versions") == VERSIONS
    assert seen == ["GET /subjects/events-value/versions HTTP/1.1"] * 3


def test_the_engines_registry_client_names_the_field_when_every_connection_is_dropped():
    with dropping_server(drops=None) as (port, _):
        registry = SchemaRegistry(url=f"http://127.0.0.1:{port}", connect_timeout=timedelta(seconds=2))
        with pytest.raises(SourceError, match=r"source\.registry .* did not answer within 2 s .*connect_timeout"):
            RegistryClient(registry, "source.registry", SourceError)._call("GET", "/subjects")


def test_the_local_registrys_own_calls_try_a_dropped_connection_again(tmp_path):
    with dropping_server(drops=2) as (port, seen):
        registry = LocalRegistry(tmp_path, port=port)  # not started: its calls go to the dropping server
        assert registry._call("GET", "/subjects/events-value/versions") == VERSIONS
    assert seen == ["GET /apis/ccompat/v7/subjects/events-value/versions HTTP/1.1"] * 3
