"""The engine's own tables and files: the handoff manifest, the quarantine, leases, the live progress log and the
live run's layout, maintenance, and the Delta, file-system and URI helpers under them."""
