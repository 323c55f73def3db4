"""Fixtures of the operations tests: a throwaway PostgreSQL with Curio's tables."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from support.postgres import PostgresServer, postgres_server


@pytest.fixture
async def pg() -> AsyncIterator[PostgresServer]:
    """A PostgreSQL server of its own, Curio's tables made by Curio's migrations (skipped,
    saying why, where the server's programs are missing)."""
    with postgres_server() as server:
        await server.prepare()
        yield server
