"""A user's ``reduce`` as a Spark SQL aggregate: the one fold both phases and the record steps use.

A leaf of the package (it imports nothing of the engine), so that a step that folds does not load the operator
kinds with it."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T


def fold(column: str, dtype: T.DataType, reduce_sql: str) -> Column:
    """An aggregate folding ``column``'s non-null values with ``reduce_sql`` over ``acc`` and ``x``."""
    sql_type = dtype.simpleString()
    return F.expr(
        f"aggregate(collect_list(`{column}`), CAST(NULL AS {sql_type}), "
        f"(acc, x) -> CASE WHEN acc IS NULL THEN x ELSE CAST(({reduce_sql}) AS {sql_type}) END)"
    )
