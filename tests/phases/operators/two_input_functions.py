"""User co-group functions for the two-input tests (importable by Spark's Python workers)."""

from __future__ import annotations


def match_summary(key, window_start, window_end, left, right):
    """Counts and an order-sensitive trace of both inputs' records of one key and window."""
    present = [r["value"] for r in left if r["value"] is not None]
    yield {
        "left_n": len(left),
        "right_n": len(right),
        "left_total": sum(present) if present else None,
        "trace": ",".join(str(r["value"]) for r in left) + "|" + ",".join(str(r["value"]) for r in right),
    }
