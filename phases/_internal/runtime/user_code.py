"""The user's code, loaded by import path (``package.module:name``): process functions, co-group functions,
partition functions and sort keys. On a cluster the executors import it from the archives the session ships
(:mod:`phases._internal.runtime.shipping`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from phases._internal.errors import DefinitionError


def load_function(path: str) -> Callable:
    """The object at ``path`` (``package.module:name``); a DefinitionError naming the path when it does not import."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DefinitionError(f"cannot import {path!r}: {exc}") from exc
