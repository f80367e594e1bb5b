"""A demo source: a Delta table of ``(key, ts, value)`` events with the change data feed on from its first version,
appended to one commit at a time (one commit = one source version = one arrival). Any table with the change data
feed on from version 0 is a source; these helpers make one for trying the engine out.

- :data:`EVENT_SCHEMA`: ``key string, ts timestamp, value long``;
- :func:`create_source`: an empty source table at a path, of that schema or another;
- :func:`append`: rows appended as one new version.
"""

from phases._internal.sources.feed import EVENT_SCHEMA, append, create_source

__all__ = ["EVENT_SCHEMA", "append", "create_source"]
