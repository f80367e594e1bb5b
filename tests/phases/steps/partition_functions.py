"""User functions for the full-partition operator tests (importable by Spark's Python workers)."""

from __future__ import annotations

import pandas as pd


def running_total(partition: pd.DataFrame) -> pd.DataFrame:
    """Order-sensitive: the running sum of ``value`` in the partition's (sorted) order."""
    values = partition["value"].fillna(0).astype("int64")
    return pd.DataFrame({"key": partition["key"], "value": values, "running": values.cumsum()})


def by_value_then_key(row: dict) -> tuple:
    return (row["value"] if row["value"] is not None and row["value"] == row["value"] else 0, row["key"])


def key_tier(partition: pd.DataFrame) -> pd.DataFrame:
    """One row per key of the partition: 'big' when the key has at least 3 records."""
    counts = partition.groupby("key").size()
    return pd.DataFrame({"key": counts.index, "tier": ["big" if n >= 3 else "small" for n in counts.to_numpy()]})
