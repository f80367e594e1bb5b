"""A client of a Confluent-compatible schema registry (:class:`phases.SchemaRegistry`), over HTTP with the standard
library: the subjects' versions, a schema by id, registering a schema, and the subject's compatibility rule.

Every call is bounded by the registry's ``connect_timeout``. A registry that does not answer, refuses the credentials,
or answers with an error is reported as the ``error`` class the caller names (a source's :class:`SourceError`, a
sink's :class:`SinkError`), naming the field that holds the registry (``source.registry``, ``sink.registry``), never
the credentials.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from phases._internal.definition.registry import SchemaRegistry
from phases._internal.errors import PhasesError, RegistryAnswered

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
# Confluent's error codes: the subject, the version, the schema not found.
SUBJECT_NOT_FOUND, VERSION_NOT_FOUND, SCHEMA_NOT_FOUND = 40401, 40402, 40403


@dataclass(frozen=True)
class SubjectVersion:
    """One version of a subject: its number, the schema's global id, the schema (Avro JSON text; Protobuf: a .proto
    text or a base64 FileDescriptorProto), its type, and the schemas it imports as (import name, subject, version)."""

    version: int
    id: int
    schema: str
    schema_type: str = "AVRO"
    references: tuple[tuple[str, str, int], ...] = ()


def _version_of(body: dict) -> SubjectVersion:
    refs = tuple((r["name"], r["subject"], int(r["version"])) for r in body.get("references") or ())
    return SubjectVersion(
        int(body["version"]), int(body["id"]), body["schema"], str(body.get("schemaType") or "AVRO"), refs
    )


class RegistryClient:
    """Calls of one registry. ``field``: where the definition names it (for messages); ``error``: the engine error a
    failure becomes."""

    def __init__(self, registry: SchemaRegistry, field: str, error: type[PhasesError]):
        self.registry, self.field, self.error = registry, field, error
        self.timeout_s = registry.connect_timeout.total_seconds()
        self._schemas: dict[int, str] = {}  # ids are immutable: a schema by id is cached for good

    @property
    def url(self) -> str:
        return self.registry.url

    # --- the calls ---------------------------------------------------------------------------------
    def versions(self, subject: str) -> list[SubjectVersion]:
        """Every version of ``subject``, oldest first (none when the subject does not exist)."""
        try:
            numbers = self._call("GET", f"/subjects/{_quote(subject)}/versions")
        except RegistryAnswered as exc:
            if exc.code == SUBJECT_NOT_FOUND or exc.status == 404:
                return []
            raise self._failed(f"listing the versions of subject {subject!r}", exc) from None
        out = []
        for number in sorted(numbers):
            try:
                body = self._call("GET", f"/subjects/{_quote(subject)}/versions/{number}")
            except RegistryAnswered as exc:
                if exc.code in (SUBJECT_NOT_FOUND, VERSION_NOT_FOUND):
                    continue  # deleted meanwhile
                raise self._failed(f"reading version {number} of subject {subject!r}", exc) from None
            self._schemas[int(body["id"])] = body["schema"]
            out.append(_version_of(body))
        return out

    def version(self, subject: str, number: int) -> SubjectVersion:
        """Version ``number`` of ``subject`` (a schema's reference)."""
        try:
            return _version_of(self._call("GET", f"/subjects/{_quote(subject)}/versions/{number}"))
        except RegistryAnswered as exc:
            raise self._failed(f"reading version {number} of subject {subject!r}", exc) from None

    def schema(self, schema_id: int) -> str | None:
        """The schema with the global id ``schema_id`` (None: the registry has none)."""
        if schema_id in self._schemas:
            return self._schemas[schema_id]
        try:
            body = self._call("GET", f"/schemas/ids/{schema_id}")
        except RegistryAnswered as exc:
            if exc.code == SCHEMA_NOT_FOUND or exc.status == 404:
                return None
            raise self._failed(f"reading schema id {schema_id}", exc) from None
        self._schemas[schema_id] = body["schema"]
        return body["schema"]

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """Registers ``schema`` (Avro JSON; ``schema_type="PROTOBUF"``: a .proto text) under ``subject`` (a schema it
        holds already keeps its version) and returns its global id. A schema the subject's compatibility rule refuses
        is an error naming the rule."""
        try:
            body = self._call("POST", f"/subjects/{_quote(subject)}/versions", _schema_body(schema, schema_type))
        except RegistryAnswered as exc:
            if exc.status == 409:
                rule = self.compatibility(subject)
                raise self.error(
                    f"{self.field} ({self.url}): subject {subject!r} refuses the schema of the results under its "
                    f"compatibility rule {rule}: {exc.message}. Nothing was written. Change the definition so that "
                    f"its results stay {rule}-compatible, or change the subject's rule in the registry "
                    f"(PUT /config/{subject}), then run again"
                ) from None
            raise self._failed(f"registering a schema under subject {subject!r}", exc) from None
        self._schemas[int(body["id"])] = schema
        return int(body["id"])

    def compatible(self, subject: str, schema: str, schema_type: str = "AVRO") -> bool:
        """Whether ``subject``'s compatibility rule takes ``schema`` as its next version (true for a new subject)."""
        if not self.versions(subject) or self.compatibility(subject) == "NONE":
            return True
        try:
            path = f"/compatibility/subjects/{_quote(subject)}/versions/latest"
            body = self._call("POST", path, _schema_body(schema, schema_type))
        except RegistryAnswered as exc:
            raise self._failed(f"checking a schema against subject {subject!r}", exc) from None
        return bool(body.get("is_compatible"))

    def compatibility(self, subject: str) -> str:
        """The compatibility rule of ``subject`` (its own, else the registry's: ``defaultToGlobal``, as Confluent's API
        and Apicurio's name it; without it Apicurio answers NONE for a subject with no rule of its own)."""
        for path in (f"/config/{_quote(subject)}?defaultToGlobal=true", "/config"):
            try:
                body = self._call("GET", path)
            except RegistryAnswered:
                continue
            level = body.get("compatibilityLevel") or body.get("compatibility")
            if level:
                return str(level)
        return "BACKWARD"

    def probe(self) -> None:
        """Asks the registry for its subjects: an engine error naming the field when it does not answer."""
        try:
            self._call("GET", "/subjects")
        except RegistryAnswered as exc:
            raise self._failed("listing its subjects", exc) from None

    # --- HTTP --------------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", CONTENT_TYPE)
        if data is not None:
            request.add_header("Content-Type", CONTENT_TYPE)
        auth = self.registry.client_options.get("basic.auth.user.info")
        if auth:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        deadline = time.monotonic() + self.timeout_s
        last: BaseException | None = None
        while True:
            try:
                with urllib.request.urlopen(request, timeout=max(1.0, deadline - time.monotonic())) as answer:
                    return json.loads(answer.read() or b"null")
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403):
                    raise self.error(
                        f"{self.field} ({self.url}): the registry refused the credentials (HTTP {exc.code}). Nothing "
                        f"was read or written. Set the right 'basic.auth.user.info' in {self.field}.client_options, "
                        "then run again"
                    ) from None
                if exc.code >= 500 and time.monotonic() < deadline:
                    last = exc
                    time.sleep(0.5)
                    continue
                raise _answered(exc) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = exc
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        cause = getattr(last, "reason", None) or last
        raise self.error(
            f"{self.field} ({self.url}) did not answer within {self.timeout_s:g} s ({self.field}.connect_timeout): "
            f"{cause}. Nothing was read or written. Check that the registry runs and that {self.field}.url is "
            "right, then run again"
        )

    def _failed(self, what: str, exc: RegistryAnswered) -> PhasesError:
        return self.error(
            f"{self.field} ({self.url}) failed {what}: HTTP {exc.status}"
            + (f", error {exc.code}" if exc.code is not None else "")
            + f": {exc.message}"
        )


def _answered(exc: urllib.error.HTTPError) -> RegistryAnswered:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    code = body.get("error_code") if isinstance(body, dict) else None
    message = body.get("message") if isinstance(body, dict) else None
    return RegistryAnswered(exc.code, int(code) if code is not None else None, str(message or exc.reason))


def _schema_body(schema: str, schema_type: str) -> dict:
    return {"schema": schema} if schema_type == "AVRO" else {"schema": schema, "schemaType": schema_type}


def _quote(subject: str) -> str:
    from urllib.parse import quote

    return quote(subject, safe="")
