"""The base of every user-facing definition and settings model: pydantic validation, with its errors raised
as :class:`phases._internal.errors.DefinitionError` (``except PhasesError`` catches them; the field paths are kept in
the message and in ``.errors``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from phases._internal.definition.secrets import HIDDEN, hidden, is_secret
from phases._internal.errors import DefinitionError

_URL_USER_INFO = re.compile(r"(\w+://)[^/@\s'\"]+@")


def definition_error(exc: ValidationError, model: str) -> DefinitionError:
    """A DefinitionError naming each failing field path, its rule and what was given."""
    lines = []
    for e in exc.errors(include_url=False):
        path = ".".join(str(part) for part in e["loc"]) or "(the model)"
        given = e.get("input")
        if any(isinstance(part, str) and is_secret(part) for part in e["loc"]):
            shown = HIDDEN
        else:
            shown = "{...}" if isinstance(given, dict) else "[...]" if isinstance(given, list | tuple) else repr(given)
            shown = _URL_USER_INFO.sub(r"\1" + HIDDEN + "@", shown)  # a URL's user:password@
        lines.append(f"  {path}: {e['msg']} (given: {shown[:120]})")
    count = len(lines)
    error = DefinitionError(f"invalid {model}: {count} error{'s' if count > 1 else ''}\n" + "\n".join(lines))
    error.errors = exc.errors(include_url=False)
    return error


_DEPTH: ContextVar[int] = ContextVar("settings_model_depth", default=0)


@contextmanager
def _outermost(model: str) -> Iterator[None]:
    """Raises pydantic's error as DefinitionError only at the outermost validation: nested models (which
    pydantic validates through their ``__init__`` too) keep raising ValidationError, so the outer error
    holds every field path."""
    token = _DEPTH.set(_DEPTH.get() + 1)
    try:
        yield
    except ValidationError as exc:
        if _DEPTH.get() > 1:
            raise
        raise definition_error(exc, model) from exc
    finally:
        _DEPTH.reset(token)


class SettingsModel(BaseModel):
    """Frozen, no unknown fields; an invalid value raises DefinitionError (from pydantic's ValidationError)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, /, **data: Any) -> None:
        with _outermost(type(self).__name__):
            super().__init__(**data)

    def __repr_args__(self):
        """pydantic's fields for ``repr`` and ``str``, with the value of every secret setting of an option map hidden
        (:mod:`phases._internal.definition.secrets`)."""
        for name, value in super().__repr_args__():
            yield name, (hidden(value) if isinstance(value, Mapping) else value)

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any):
        with _outermost(cls.__name__):
            return super().model_validate(obj, *args, **kwargs)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False):
        """A copy; with ``update``, a new definition validated like one built by hand (pydantic's own copy skips
        validation, so a windowed pipeline could be given a sink mode it refuses). Fields left at their defaults
        stay defaults, so rules that derive them apply to the new values."""
        if not update:
            return super().model_copy(deep=deep)
        copied = super().model_copy(deep=deep)
        fields = type(self).model_fields
        data = {name: getattr(copied, name) for name in copied.model_fields_set if name in fields}
        return type(self).model_validate({**data, **update})

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, *args: Any, **kwargs: Any):
        with _outermost(cls.__name__):
            return super().model_validate_json(json_data, *args, **kwargs)
