"""Finding and clearing locks: what ``lease-lock ls``, ``lease-lock force-release --prefix`` and
Django's ``manage.py locks`` share, so that both print the same thing.

Keys are shown as the locker's caller names them: without the locker's ``key_prefix``, so that
a key printed by :func:`held_locks` can be passed back to ``Locker.get`` or
``Locker.force_release`` as it is. What is written for people (tables, lines, questions) shows
keys and owner labels through :func:`~lease_lock.validation.escape_text`, one line per key with
no control sequence a terminal would obey; the JSON output carries them exactly.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, TextIO

from .backends.base import Holder, LockState
from .errors import ValidationError
from .locker import Locker
from .validation import check_key, escape_text

__all__ = [
    "LOST_REASONS",
    "NO_ANSWER",
    "CannotListError",
    "ask",
    "describe_holder",
    "describe_holder_of",
    "describe_lost_reason",
    "describe_place",
    "held_for",
    "held_locks",
    "holder_json",
    "locks_json",
    "locks_table",
    "places_held",
    "release_keys",
    "release_prefix",
    "state_json",
]

#: Each lost reason in plain words.
LOST_REASONS: dict[str, str] = {
    "extend": "the key was force-released or taken by another holder",
    "observed": "the key was force-released or taken by another holder",
    "release": "the key was force-released or taken by another holder",
    "extend-failed": "the store could not be reached to renew the lease before it ran out",
    "late-extend": "a renewal answered too late and the lease ran out",
    "expired": "the lease ran out before it was renewed",
    "max-hold": "it was held for the longest time allowed (max hold)",
    "closed": "the locker was closed",
    "forked": "the process forked (a child never owns its parent's locks)",
}


#: Why nothing was released when a question got no answer (stdin closed or empty).
NO_ANSWER = "no answer on stdin; nothing released (pass --yes to skip the question)"


class CannotListError(ValidationError):
    """The store behind the locker cannot list its keys."""


def describe_lost_reason(reason: Optional[str]) -> str:
    """``reason`` (a lost reason code) in plain words; unknown codes are returned as they are."""
    if reason is None:
        return "unknown reason"
    return LOST_REASONS.get(reason, reason)


def _seconds(value: Optional[float]) -> str:
    """A duration for people: ``4.6s``, ``12s``, ``5m03s``, ``2h05m``."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.1f}s"
    whole = int(value)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def describe_holder(state: LockState) -> str:
    """Who holds the key and when its current lease ends, in words that do not suggest the key
    frees itself then (the holder renews its lease while it works):
    ``held by vm:26622 sh, lease renewed by its holder; current lease ends in 4.6s``.
    A counting key tells how many of its places are held, its latest holder and when the first
    of its leases ends: ``2/3 held, latest by vm:26622 sh, leases renewed by their holders;
    first current lease ends in 4.6s``. ``""`` for a free key.
    """
    if not state.held:
        return ""
    if state.limit > 1:
        text = f"{places_held(state)} held"
        if state.owner:
            text += f", latest by {escape_text(state.owner)}"
        ends = [holder.expires_in for holder in state.holders if holder.expires_in is not None]
        if ends:
            text += f", leases renewed by their holders; first current lease ends in {_seconds(min(ends))}"
        return text
    text = f"held by {escape_text(state.owner)}" if state.owner else "held"
    if state.expires_in is not None:
        text += f", lease renewed by its holder; current lease ends in {_seconds(state.expires_in)}"
    return text


def describe_place(holder: Holder) -> str:
    """One lease of a counting key: ``held by vm:26622 sh, fence 17, current lease ends in
    4.6s (2026-11-30T17:49:33.007Z)``, leaving out what the store does not know."""
    text = f"held by {escape_text(holder.owner)}" if holder.owner else "held"
    if holder.fence is not None:
        text += f", fence {holder.fence}"
    if holder.expires_in is not None:
        text += f", current lease ends in {_seconds(holder.expires_in)}"
    if holder.expires_at is not None:
        text += f" ({_timestamp(holder.expires_at)})"
    return text


def places_held(state: LockState) -> str:
    """How many of the key's places are held, of its limit: ``2/3`` (``0/1`` for a free key)."""
    return f"{len(state.holders)}/{state.limit}"


def describe_holder_of(locker: Locker, key: str) -> str:
    """`` (held by ...)`` for a busy-key message: :func:`describe_holder` of ``key`` in
    brackets, or ``""`` when the key is free again or the store cannot say."""
    try:
        state = locker.get(key)
    except Exception:  # noqa: BLE001 - it only decorates the message; the answer is known
        return ""
    return f" ({describe_holder(state)})" if state.held else ""


def _timestamp(moment: Optional[datetime]) -> Optional[str]:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _remaining(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds, 3)


def holder_json(holder: Holder) -> dict[str, Any]:
    """The JSON object of one lease of a key (an item of ``holders`` in ``status --json``)."""
    return {
        "owner": holder.owner,
        "fence": holder.fence,
        "expires_at": _timestamp(holder.expires_at),
        "expires_in": _remaining(holder.expires_in),
    }


def state_json(state: LockState) -> dict[str, Any]:
    """The JSON object of one key (the ``status --json`` fields): the top-level fields are
    the latest grant's, ``holders`` has every live lease (one for an exclusive key, none for a
    free one) and ``limit`` how many the key admits at once."""
    return {
        "key": state.key,
        "held": state.held,
        "expires_at": _timestamp(state.expires_at),
        "expires_in": _remaining(state.expires_in),
        "fence": state.fence,
        "owner": state.owner,
        "limit": state.limit,
        "holders": [holder_json(holder) for holder in state.holders],
    }


def held_locks(locker: Locker, prefix: str = "") -> list[LockState]:
    """Every held key under ``prefix``, sorted, keys without the locker's ``key_prefix``.

    The prefix is literal: ``*``, ``%``, ``_``, ``[`` or ``?`` in it match only themselves.
    Raises :class:`CannotListError` when the store cannot list keys.
    """
    if not locker.backend.capabilities.scan:
        raise CannotListError(f"the {type(locker.backend).__name__} store cannot list its keys")
    if not isinstance(prefix, str):
        raise ValidationError(f"prefix must be a str, not {type(prefix).__name__}")
    if locker.key_prefix + prefix:
        check_key(locker.key_prefix + prefix, "prefix")
    # The backend's states rather than Locker.list's: an operator sees the fences even when
    # this locker does not use them.
    cut = len(locker.key_prefix)
    scanned = locker.backend.scan(locker.key_prefix + prefix)
    states = [replace(state, key=state.key[cut:]) for state in scanned if state.held]
    return sorted(states, key=lambda state: state.key)


def locks_json(states: Sequence[LockState]) -> str:
    """A JSON array, one :func:`state_json` object per key."""
    return json.dumps([state_json(state) for state in states])


_COLUMNS = ("KEY", "OWNER", "FENCE", "HELD FOR", "EXPIRES IN")

#: Fences below this (2000-01-01 in microseconds) are counters, not grant times.
_FIRST_TIME_FENCE = 946_684_800_000_000


def held_for(state: LockState) -> Optional[float]:
    """How long the current holder has held the key, in seconds, or ``None`` when unknown.

    The memory, SQLite, Redis and PostgreSQL stores (and a lease_lock server over one) make a
    fence at least their clock at the grant in microseconds since the epoch (and a renewal keeps
    the fence), so such a grant tells when its holder first took the key. The store's "now" is
    its own expiry minus the lease left, so this host's clock plays no part. A grant without a
    fence, or a fence that is a counter (etcd's fences are revisions; another service's may be
    plain counters), gives ``None``.
    """
    if state.fence is None or state.fence < _FIRST_TIME_FENCE:
        return None
    try:
        granted = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=state.fence)
    except OverflowError:
        return None
    if state.expires_at is not None and state.expires_in is not None:
        now = state.expires_at - timedelta(seconds=state.expires_in)
    else:
        now = datetime.now(timezone.utc)
    seconds = (now - granted).total_seconds()
    # A fence ahead of the clock (a counter that ran past it, a clock set back) dates nothing.
    return seconds if seconds >= 0 else None


def locks_table(states: Sequence[LockState]) -> str:
    """An aligned table for people, one line per key (in the order given), ``-`` for what the
    store does not know (``HELD FOR``: see :func:`held_for`).

    A counting key is one line too: when the listing has one, a ``HOLDERS`` column tells how many
    places of each key are held (``2/3``), and the other columns of a counting key are those of
    its latest grant.
    """
    counting = any(state.limit > 1 for state in states)
    header: tuple[str, ...] = (_COLUMNS[0], "HOLDERS", *_COLUMNS[1:]) if counting else _COLUMNS
    rows = [header] + [
        (
            escape_text(state.key),
            *((places_held(state),) if counting else ()),
            escape_text(state.owner) if state.owner else "-",
            "-" if state.fence is None else str(state.fence),
            _seconds(held_for(state)),
            _seconds(state.expires_in),
        )
        for state in states
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def release_prefix(
    locker: Locker,
    prefix: str,
    *,
    confirm: Optional[Callable[[str], bool]],
    write: Callable[[str], None],
) -> Optional[int]:
    """Drop every key held under ``prefix`` (literal, as in :func:`held_locks`); return how
    many leases were dropped, or ``None`` when ``confirm`` said no (nothing dropped).

    Writes the table of what will be dropped, asks ``confirm(question)`` once (``None`` means
    the caller already agreed, as ``--yes`` does), then writes how many were dropped. A key
    freed between the listing and its drop is not counted; one granted again in between is
    dropped too.
    """
    if not prefix:
        raise ValidationError("prefix must not be empty (it would drop every key)")
    states = held_locks(locker, prefix)
    if not states:
        write(f"no held keys under {prefix!r}; nothing released")
        return 0
    write(locks_table(states))
    if confirm is not None and not confirm(f"force-release these {len(states)} key(s)?"):
        return None
    dropped = sum(1 for state in states if locker.force_release(state.key))
    write(f"released {dropped} key(s) under {prefix!r}")
    return dropped


def release_keys(
    locker: Locker,
    keys: Sequence[str],
    *,
    confirm: Optional[Callable[[str], bool]],
    write: Callable[[str], None],
) -> Optional[int]:
    """Drop each of ``keys`` whoever holds it; return how many leases were dropped, or
    ``None`` when ``confirm`` said no (nothing dropped).

    Free keys are reported as such; the held ones are listed and ``confirm(question)`` is asked
    once for all of them (``None``: the caller already agreed). Each key's outcome is one line,
    ``KEY: released`` or ``KEY: free, nothing to release``.
    """
    states = [locker.get(key) for key in keys]
    held = [replace(state, key=key) for key, state in zip(keys, states) if state.held]
    if held:
        write(locks_table(held))
        if confirm is not None and not confirm(f"force-release these {len(held)} key(s)?"):
            return None
    dropped = 0
    for key in keys:
        if locker.force_release(key):
            dropped += 1
            write(f"{escape_text(key)}: released")
        else:
            write(f"{escape_text(key)}: free, nothing to release")
    return dropped


def ask(question: str, *, stdin: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> Optional[bool]:
    """Ask ``question`` on ``stderr`` and read the answer from ``stdin`` (default: the
    process's); ``True`` for y/yes, ``None`` when there is no answer (closed stdin)."""
    stdin = sys.stdin if stdin is None else stdin
    stderr = sys.stderr if stderr is None else stderr
    stderr.write(f"{question} [y/N] ")
    stderr.flush()
    answer = stdin.readline() if stdin is not None else ""
    if not answer:
        stderr.write("\n")
        return None
    return answer.strip().lower() in ("y", "yes")
