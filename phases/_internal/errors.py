"""The engine's exception hierarchy: every error the engine raises on purpose is a PhasesError."""


class PhasesError(Exception):
    """Base class of every error raised on purpose by the engine."""


class SetupError(PhasesError):
    """The environment is not usable: JVM dependencies missing or not fetchable, no Java, ..."""


class SparkInternalsChanged(SetupError):
    """Something of Spark or Delta the engine reads past their public API (:mod:`phases._internal.spark_internals`: a
    checkpoint file's format, an internal class) is not what the pinned releases have: the message names it."""


class DefinitionError(PhasesError, ValueError):
    """A pipeline definition or setting is invalid. The message names the field and the rule; for a model
    that failed validation, ``errors`` holds pydantic's error list (field paths, rules, inputs)."""

    errors: list = []


class SourceError(PhasesError):
    """A source cannot be read as the pipeline needs it (missing table, change feed off, ...)."""


class SinkError(PhasesError):
    """A sink cannot be written as the pipeline needs it: a topic missing, a transaction aborted or fenced by a newer
    writer, a marker another client moved."""


class ManifestError(PhasesError):
    """The handoff manifest is missing, partial, or does not match the pipeline."""


class PhaseStateError(PhasesError):
    """A phase was asked to run in a state that would break the backlog/live contract."""


class LeaseHeld(PhaseStateError):
    """Another run holds the pipeline's backlog or live lease (:mod:`phases._internal.coordination.leases`): the message
    names the holder, and whether taking the lease over (``take_over=True``) is safe."""


class SchemaChangeError(PhasesError):
    """The source's schema changed in a way the pipeline's operator or sink cannot take."""


class NewSchemaVersion(SchemaChangeError):
    """A live micro-batch met a Kafka record whose Avro schema version was registered after the query started: the
    micro-batch stops before it writes anything, and the live runner starts the query again with that version
    (:mod:`phases._internal.sources.avro_values`). Handled by the engine; a user sees it only in a log."""


class RegistryAnswered(PhasesError):
    """Internal: a schema registry answered a call with an error (``status``, Confluent's ``code``, its message). The
    registry client turns it into the caller's SourceError or SinkError, naming the registry's field."""

    def __init__(self, status: int, code: int | None, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class ProcessFunctionError(PhasesError):
    """User process-function code broke a rule (bad state value, unknown output column, ...)."""


class LiveQueryStopped(PhaseStateError):
    """The running live query stopped with an error of its own (a broker gone, the JVM out of memory, a task that
    kept failing): the cause may be transient, and a restart resumes from the checkpoint."""


class LiveResumeError(PhaseStateError):
    """The live phase cannot resume exactly from what its checkpoint, its progress log and its tables say (a
    folder removed by hand, a record damaged): the message names what is missing and the way out."""


class ProgressRecordDamaged(PhaseStateError):
    """A live progress record's file is not a whole record (``path``). A restart sets it aside and replays its
    micro-batch when the checkpoint still has that micro-batch's offsets, or refuses with a LiveResumeError."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


class StateStoreError(PhaseStateError):
    """A version of the live phase's state store (Spark's state store, :mod:`phases._internal.state.keyed_store`) could
    not be read or written."""
