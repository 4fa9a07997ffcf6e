"""Shared by the Celery and RQ integrations: keys made from a call, and a key claimed when a job
is enqueued, then adopted by the worker that runs it.

A claim is a lease whose token is the job's id. A job id is known to every delivery of the
job's message (a broker may deliver one message twice), so it must never be the token a run
holds the key under: two deliveries would then both "hold" it. A run therefore *adopts* the
claim: one atomic step of the store (:meth:`~lease_lock.backends.base.Backend.adopt`) replaces
the job id with a fresh token of that run, and a second delivery of the same message finds the
key held by a run, not by the queue, and is a duplicate. The owner label stored beside the
lease names the job, so a duplicate can answer with the first job's id. A job that is never run
frees its key when the claim's lease runs out; a run that dies frees it when its own (heartbeated,
much shorter) lease runs out, after which a redelivery adopts the key again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from typing import Any, Callable, Optional

from ..backends import Backend, LockState
from ..errors import ValidationError
from ..lock import Lock
from ..locker import Locker
from ..validation import check_key, check_limit, check_token, check_ttl

__all__ = [
    "adopt",
    "call_key",
    "check_adopts",
    "check_limit_alone",
    "claim",
    "first_lease_end",
    "job_id_of",
    "label",
    "log_skip",
    "run_holder",
    "unclaim",
]

#: What separates the locker's owner label from the job id in a claim's owner label.
_JOB_TAG = " job="
#: Longest key spelled out in full; longer ones end in a digest of the arguments.
_PLAIN_KEY_LIMIT = 160

logger = logging.getLogger("lease_lock")


def call_key(name: str, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``name`` plus the call's arguments bound to ``function``'s signature.

    Binding makes ``f(1)``, ``f(x=1)`` and ``f()`` with a default of 1 one key. The arguments
    are written as sorted JSON (so a tuple and the list a JSON message turns it into match);
    when the key would be long, a SHA-256 digest of that text stands for it.
    """
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        arguments: Any = {"args": list(args), "kwargs": kwargs}
    else:
        bound.apply_defaults()
        arguments = dict(bound.arguments)
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=repr)
    key = f"{name}:{text}"
    if len(key) > _PLAIN_KEY_LIMIT or not key.isprintable():
        key = f"{name}:sha256:{hashlib.sha256(text.encode()).hexdigest()}"
    return check_key(key)


def _owner(locker: Locker, job_id: str) -> str:
    return f"{locker.owner}{_JOB_TAG}{job_id}"


def job_id_of(state: LockState) -> Optional[str]:
    """The job id of a claimed key's holder (``None`` when the holder is not a claim)."""
    owner = state.owner or ""
    _, tag, job_id = owner.rpartition(_JOB_TAG)
    return job_id if tag and job_id else None


def _grant(locker: Locker, full_key: str, token: str, job_id: str, ttl: float) -> bool:
    backend, owner = locker.backend, _owner(locker, job_id)
    if locker.fencing:
        return backend.acquire_fenced(full_key, token, ttl, owner) is not None
    return backend.acquire(full_key, token, ttl, owner)


def check_limit_alone(limit: object, name: str, option: str, instead: str) -> None:
    """Refuse ``limit`` (named ``name``) above 1 with ``option``, a claim taken when a job is
    enqueued: a claim keeps one call per key queued or running and is adopted by one run, so it
    has no meaning for a key that admits several runs at once. ``instead`` says what to do to
    run at most ``limit`` at once per key."""
    if check_limit(limit, name) > 1:
        raise ValidationError(
            f"{option} cannot go with {name}={limit}: a key claimed when a job is enqueued stands for "
            f"one call queued or running, while {name} > 1 lets several run at once; {instead} to run "
            f"at most {limit} at once per key"
        )


def check_adopts(locker: Locker, option: str) -> None:
    """Raise ``ValidationError`` when ``locker``'s backend class cannot adopt a claim, which
    ``option`` needs; checked before any claim is written. (A client whose store decides, as
    the HTTP client's service does, is refused by the claim itself: see :func:`claim`.)"""
    if type(locker.backend).adopt is Backend.adopt:
        raise _cannot_adopt(locker, option)


def _cannot_adopt(locker: Locker, option: str, answer: Optional[BaseException] = None) -> ValidationError:
    said = "" if answer is None else f" (the store answered: {answer})"
    return ValidationError(
        f"{option} needs a backend that can adopt a claim (Backend.adopt); "
        f"{type(locker.backend).__name__} cannot adopt a claim{said}"
    )


def _refused_adopt(error: Exception) -> bool:
    """Whether ``error`` says the store cannot adopt: ``NotImplementedError``, or the HTTP
    service's ``501 Not Implemented`` as the HTTP client raises it."""
    response = getattr(error, "response", None)
    return isinstance(error, NotImplementedError) or getattr(response, "status_code", None) == 501


def _write_claim(locker: Locker, full_key: str, job_id: str, ttl: float, option: str) -> bool:
    # Written by adopt with the claim's own token, which grants a free key (or the claim's own
    # again) exactly as a grant would: a store that cannot adopt refuses here, before anything
    # is written, and never holds a claim that no run could take over.
    try:
        return locker.backend.adopt(full_key, job_id, job_id, ttl, _owner(locker, job_id)) is not None
    except Exception as error:
        if _refused_adopt(error):
            raise _cannot_adopt(locker, option, error) from error
        raise


def adopt(locker: Locker, key: str, job_id: str, ttl: Optional[float], **options: Any) -> Optional[Lock]:
    """The run of job ``job_id`` takes over its claim on ``key``: a held :class:`Lock` under a
    token of its own (heartbeated like any lock, ``options`` as for ``try_acquire``), or
    ``None`` when another run or holder has the key.

    A free key (the claim ran out, or an earlier run of the job ended, died or released) is
    taken as well: the job still needs its run.
    """
    backend = locker.backend
    lease = locker.ttl if ttl is None else check_ttl(ttl)
    check_token(job_id, "job id")
    backend.check_token(job_id)
    full_key = check_key(locker.key_prefix + check_key(key), "key")
    backend.check_key(full_key)
    token = backend.new_token()
    if backend.adopt(full_key, job_id, token, lease, _owner(locker, job_id)) is None:
        return None
    # The key is this run's now; the lock below is the same lease (a repeated grant to the
    # holding token keeps it and its fence), with the heartbeat and the outcome rules of a Lock.
    lock = locker.try_acquire(key, lease, token=token, **options)
    if lock is not None:
        label(locker, lock, job_id)
    return lock


#: How long a claimed run that found its key held waits for the holder's job id to appear.
_LABEL_WAIT = 2.0


def run_holder(locker: Locker, key: str) -> LockState:
    """The state of ``key`` as a claimed run that could not adopt it sees the holder.

    A run that adopted a claim writes its job id back into the owner label one step after its
    own grant (see :func:`adopt`), so a holder without a job id is looked at again for up to two
    seconds before it is taken for one that is not a job: a second delivery of the running job
    must know the holder is its own first delivery.
    """
    give_up = time.monotonic() + _LABEL_WAIT
    state = locker.get(key)
    while state.held and job_id_of(state) is None and time.monotonic() < give_up:
        time.sleep(0.05)
        state = locker.get(key)
    return state


def claim(locker: Locker, key: str, job_id: str, ttl: float) -> Optional[LockState]:
    """Take ``key`` for the job ``job_id`` for ``ttl`` seconds; ``None`` when granted (or
    already the job's), else the state of the holder that has it.

    The lease is written through the backend directly: it belongs to the job, not to this
    process, so it must outlive this locker and is not heartbeated here. It is written by
    :meth:`~lease_lock.backends.base.Backend.adopt`, so a store that cannot adopt refuses the
    claim itself (``ValidationError``) and nothing is claimed.
    """
    check_ttl(ttl, "lock_enqueue_ttl")
    option = "a key claimed when a job is enqueued"
    check_adopts(locker, option)
    check_token(job_id, "job id")
    locker.backend.check_token(job_id)
    full_key = check_key(locker.key_prefix + check_key(key), "key")
    locker.backend.check_key(full_key)
    # A holder may release between the refused grant and the look: try again a few times.
    for _ in range(3):
        if _write_claim(locker, full_key, job_id, ttl, option):
            return None
        state = locker.get(key)
        if state.held:
            return state
    return locker.get(key)


def unclaim(locker: Locker, key: str, job_id: str) -> None:
    """Give back a claim whose job was never sent."""
    locker.backend.release(locker.key_prefix + key, job_id)


def label(locker: Locker, lock: Lock, job_id: str) -> None:
    """Write the job id back into the owner label of a worker's grant of a claimed key, so a
    duplicate sent while the job runs can still name it (a repeated grant to the holding token
    keeps the lease and its fence)."""
    _grant(locker, lock.key, lock.token, job_id, lock.ttl)


def first_lease_end(state: LockState) -> Optional[float]:
    """Seconds until the first lease of ``state``'s holders ends (of an exclusive key, its one
    holder's), as the store measured them; ``None`` when the store does not say."""
    ends = [holder.expires_in for holder in state.holders if holder.expires_in is not None]
    return min(ends) if ends else None


def log_skip(what: str, key: str, state: LockState, log: logging.Logger = logger) -> None:
    """One WARNING line saying ``what`` (``"RQ job NAME[ID]"``) was skipped because ``key`` was
    busy, and who holds it (of a counting key: how many places are held, and the latest holder)."""
    holder = state.owner or "an unknown holder"
    if state.limit > 1:
        holder = f"{len(state.holders)} of its {state.limit} holders, latest {holder}"
    ends = first_lease_end(state)
    if ends is not None:
        log.warning("%s skipped: lock %r is held by %s (lease ends in %.1fs)", what, key, holder, ends)
    else:
        log.warning("%s skipped: lock %r is held by %s", what, key, holder)
