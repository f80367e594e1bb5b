"""What the parts of a definition share: their base model, and the rules several fields check (column names,
import paths, durations), each written once with the messages the fields give."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator

from phases._internal.definition.model import SettingsModel

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Column names the engine adds to its own tables; a user column may not start with this.
RESERVED_PREFIX = "_"
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class _Model(SettingsModel):
    """A part of a pipeline definition (invalid values raise DefinitionError)."""


def user_column(value: str, what: str) -> str:
    """``value`` as a column of the user's records: an identifier, not starting with the engine's prefix."""
    if not IDENTIFIER.match(value) or value.startswith(RESERVED_PREFIX):
        raise ValueError(f"{what} {value!r} is not a column identifier without a leading '_'")
    return value


def name(value: str, what: str) -> str:
    """``value`` as the name of a pipeline or a step: an identifier."""
    if not IDENTIFIER.match(value):
        raise ValueError(f"{value!r} is not a valid {what} (letters, digits, '_'; not a digit first)")
    return value


def _import_path(example: str):
    def check(value: str) -> str:
        if not _IMPORT_PATH.match(value):
            raise ValueError(f"function {value!r} is not an import path like 'package.module:{example}'")
        return value

    return check


ClassImportPath = Annotated[str, AfterValidator(_import_path("Class"))]
FunctionImportPath = Annotated[str, AfterValidator(_import_path("function"))]


def whole_ms(value: timedelta, what: str) -> timedelta:
    if value % timedelta(milliseconds=1):
        raise ValueError(f"{what} must be a whole number of milliseconds; got {value}")
    return value


def positive(value: timedelta, what: str) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"{what} must be > 0; got {value}")
    return value


def not_negative(value: timedelta, what: str, none: str = "") -> timedelta:
    """``none``: what None means, when the field takes it (said in the message)."""
    if value < timedelta(0):
        raise ValueError(f"{what} must be >= 0{f' or None ({none})' if none else ''}; got {value}")
    return value
