"""A PostgreSQL store that falls silent under a waiter ends its wait at the timeout."""

from __future__ import annotations

import uuid

import psycopg2
import pytest
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.postgres import PostgresBackend

from tests.support.postgres_server import PostgresServer
from tests.support.silent_wait import check_a_silent_store_ends_a_wait_as_an_outage


@pytest.mark.parametrize("direct", [False, True], ids=["announced", "direct hand-off"])
def test_a_silent_server_ends_a_wait_at_its_timeout_as_an_outage(postgres_server: PostgresServer, direct: bool) -> None:
    # The waiter reaches the server through a proxy that then holds every byte back, with the
    # URL's default libpq timeouts: its idle pooled connections would wait for ever, and a new
    # one for connect_timeout, each attempt. The attempts of the wait must end with it.
    table = f"sw_{uuid.uuid4().hex[:12]}"
    key = f"test:silent:{uuid.uuid4().hex}"
    proxy = TcpProxy(postgres_server.host, postgres_server.port)
    silent = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/", 1)
    holder = PostgresBackend.from_url(postgres_server.url, table=table)
    waiter = PostgresBackend.from_url(silent, table=table, direct_handoff=direct)
    try:
        check_a_silent_store_ends_a_wait_as_an_outage(
            holder, waiter, key, proxy.stall, proxy.resume, psycopg2.Error
        )
    finally:
        waiter.close()
        proxy.close()
        holder.force_release(key)
        holder.close()
