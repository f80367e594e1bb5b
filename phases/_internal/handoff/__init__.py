"""The handoff from the backlog to the live phase, which both phases build on: its manifest, the live run's folders
beside it (``live_folders``), and the intents of catch-up increments that must finish before a live phase starts from
a handoff (``intents``). Neither phase imports the other: both import this."""
