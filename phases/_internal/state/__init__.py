"""The live phase's per-key state: Spark's state store reached through the JVM helper (``keyed_store``)."""
