"""Optional interfaces beyond locking, for the HTTP lock service and its client.

A backend implements locking only (:class:`~lease_lock.backends.base.Backend`). Two duties that
belong to the HTTP lock service live here instead, each an interface a backend may also take on:

- :class:`ServiceStore`: what the lock *server* needs from the store it runs on besides locks:
  fixed-window counters shared by every server process (the per-project rate limits), and a
  grant of a free key that answers with the key's state when it is not free (so a fresh
  acquisition costs the server one round trip instead of a read and a write).
  ``lease-lock serve`` and :func:`lease_lock.server.create_app` refuse a store that lacks it.
  The memory, SQLite, Redis, PostgreSQL, etcd and MongoDB backends offer it.
- :class:`RequestIdCarrier`: a backend that can send a caller's request id along with its
  acquisitions (the HTTP client backend). :func:`request_id_scope` enters it when a backend
  offers it and does nothing otherwise.

:func:`ask_grant` is how the core sends one grant request of an acquisition through any
backend: it carries the request id where the backend can, and turns the service's request to
slow down (:class:`~lease_lock.errors.RateLimitedError`, a 429 with ``Retry-After``) into an
answer, :class:`SlowDown`, so that the core's attempt loop knows neither.

A third-party backend that implements neither still passes
:class:`lease_lock.testing.BackendContract` and works with every ``Locker`` feature; it only
cannot be the store behind ``lease-lock serve``.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import ContextManager, Optional, Union

from ..errors import RateLimitedError, ValidationError
from .base import Backend, LockState, WaitingLine

__all__ = ["RequestIdCarrier", "ServiceStore", "SlowDown", "ask_grant", "check_amount", "request_id_scope"]


class ServiceStore(Backend):
    """A backend the HTTP lock server can run on: it also keeps counters shared by its clients.

    Subclass it instead of :class:`~lease_lock.backends.base.Backend` and implement
    :meth:`count_in_window`; :class:`lease_lock.testing.ServiceStoreContract` tests it.
    """

    def grant_if_free(self, key: str, token: str, ttl: float, owner: str) -> Union[int, LockState]:
        """Grant ``key`` with a fence only when no lease holds it, ``token``'s own included.

        Returns the grant's fence (as :meth:`~lease_lock.backends.base.Backend.acquire_fenced`
        would), or else the key's state as :meth:`~lease_lock.backends.base.Backend.inspect`
        reads it (usually held; free when it was released in between). This default reads,
        then grants: two round trips. Stores that can grant-or-read in one atomic step
        override it.
        """
        state = self.inspect(key)
        if state.held:
            return state
        fence = self.acquire_fenced(key, token, ttl, owner)
        return fence if fence is not None else self.inspect(key)

    @abc.abstractmethod
    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` (a positive int) to counter ``name`` in the current fixed window.

        Windows are ``window`` seconds long and aligned to its multiples on the store's clock;
        a counter starts at zero in every window. The read and the addition are one atomic
        step, so every client of the store sees each total once. Returns the counter's new
        value and the seconds left in the window.
        """


def check_amount(amount: object) -> int:
    """``amount`` if it is a positive int (not a bool), else a ``ValidationError``."""
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
        raise ValidationError(f"amount must be a positive int, got {amount!r}")
    return amount


class RequestIdCarrier(abc.ABC):
    """A backend that sends a caller's request id along with its acquisitions."""

    @abc.abstractmethod
    def request_id_scope(self, request_id: Optional[str]) -> ContextManager[None]:
        """Attach ``request_id`` to the acquisitions this thread makes inside the block."""


def request_id_scope(backend: object, request_id: Optional[str]) -> ContextManager[None]:
    """``backend``'s request-id block when it is a :class:`RequestIdCarrier`, else a no-op.

    The core wraps an acquisition attempt in this when the caller passed ``request_id=``; a
    backend that carries no request ids ignores it.
    """
    if isinstance(backend, RequestIdCarrier):
        return backend.request_id_scope(request_id)
    return contextlib.nullcontext()


@dataclass(frozen=True)
class SlowDown:
    """The store's answer to a grant request when it asks the caller to wait before the next.

    ``seconds`` is how long it asked for (the service's ``Retry-After``); ``error`` is the
    :class:`~lease_lock.errors.RateLimitedError` that said so, which a caller that will send no
    further request (a single attempt, or the last one) raises as it is.
    """

    seconds: float
    error: RateLimitedError


def ask_grant(
    backend: Backend,
    key: str,
    token: str,
    ttl: float,
    owner: str,
    fenced: bool,
    request_id: Optional[str],
    line: Optional[WaitingLine] = None,
    limit: int = 1,
) -> Union[int, SlowDown, None]:
    """One grant request of an acquisition: the answer, whichever backend it goes to.

    Returns the grant's fence (``0`` for a grant asked without one, ``fenced=False``), ``None``
    when the key is held, or a :class:`SlowDown` when the store asked the caller to wait first.
    ``request_id`` travels with the request when the backend is a :class:`RequestIdCarrier`
    and is ignored otherwise. A waiter's ``line`` (see :meth:`Backend.join_line`) asks in its
    place, as :meth:`WaitingLine.ask`. A ``limit`` above 1 asks for a place of a counting key
    (:meth:`Backend.acquire_counted`, always fenced). An unreachable store raises
    ``BackendUnavailableError``, as every primitive does.
    """
    try:
        if request_id is not None:
            with request_id_scope(backend, request_id):
                return ask_grant(backend, key, token, ttl, owner, fenced, None, line, limit)
        if line is not None:
            return line.ask()
        if limit > 1:
            return backend.acquire_counted(key, token, ttl, owner, limit)
        if fenced:
            return backend.acquire_fenced(key, token, ttl, owner)
        return 0 if backend.acquire(key, token, ttl, owner) else None
    except RateLimitedError as error:
        return SlowDown(error.retry_after, error)
