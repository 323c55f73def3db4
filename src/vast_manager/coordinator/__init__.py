"""The coordinator: the aiohttp server, the SQLite store, the decisions, the providers and
the operator's CLI (docs/architecture.md shows its rooms)."""
