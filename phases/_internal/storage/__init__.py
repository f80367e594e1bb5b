"""Delta table and file I/O under everything else: tables (create, append, write marks), their figures read with
delta-rs (``table_stats``), the file systems (``fs``), the quarantine, the changelog sink, a live micro-batch's
idempotent writes (``live_writes``) and maintenance (compaction, vacuum)."""
