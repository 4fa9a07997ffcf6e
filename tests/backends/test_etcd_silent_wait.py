"""An etcd store that falls silent under a waiter ends its wait at the timeout."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests
from benchmarks.chaos_harness.proxy import TcpProxy
from lease_lock.backends.base import CALL_MARGIN
from lease_lock.backends.etcd import EtcdBackend

from tests.support.etcd_server import EtcdCluster
from tests.support.silent_wait import check_a_silent_store_ends_a_wait_as_an_outage


@pytest.mark.parametrize("direct", [False, True], ids=["announced", "direct hand-off"])
def test_a_silent_member_ends_a_wait_at_its_timeout_as_an_outage(etcd_server: EtcdCluster, direct: bool) -> None:
    # The waiter reaches etcd through a proxy that then holds every byte back, with the URL's
    # default request timeout: each request of an attempt would wait it out in full. The
    # attempts of the wait must end with it.
    namespace = f"silent-{uuid.uuid4().hex}/"
    key = f"test:silent:{uuid.uuid4().hex}"
    proxy = TcpProxy("127.0.0.1", etcd_server.members[0].client_port)
    holder = EtcdBackend.from_url(etcd_server.url, namespace=namespace)
    waiter = EtcdBackend.from_url(f"etcd://127.0.0.1:{proxy.port}", namespace=namespace, direct_handoff=direct)
    try:
        # The backend's own connections: http.client's timeout (an OSError) is the cause.
        check_a_silent_store_ends_a_wait_as_an_outage(holder, waiter, key, proxy.stall, proxy.resume, OSError)
    finally:
        waiter.close()
        proxy.close()
        holder.force_release(key)
        holder.close()


class _TimeoutRecordingSession(requests.Session):
    """A session that notes the timeout of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[Any] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.timeouts.append(kwargs.get("timeout"))
        return super().send(request, **kwargs)


def test_the_requests_of_a_call_budget_end_with_it(etcd_server: EtcdCluster) -> None:
    # Inside the block every request of an attempt (a lease grant, the transaction) ends by
    # the budget and the margin for a busy host, not by the client's own timeout (10 s here);
    # outside it, nothing changes.
    key = f"test:budget:{uuid.uuid4().hex}"
    session = _TimeoutRecordingSession()
    backend = EtcdBackend(etcd_server.endpoints, session=session, namespace=f"budget-{uuid.uuid4().hex}/", timeout=10)
    try:
        with backend.call_budget(0.5):
            assert backend.acquire_fenced(key, "a" * 32, 5, "budget") is not None
        inside, session.timeouts = session.timeouts, []
        assert inside and all(0 < timeout <= 0.5 + CALL_MARGIN for timeout in inside), inside
        assert backend.acquire_fenced(key, "a" * 32, 5, "budget") is not None
        assert session.timeouts and all(timeout == 10 for timeout in session.timeouts), session.timeouts
    finally:
        backend.force_release(key)
        backend.close()
