"""Crowds: the waiting threads of one Locker on one key wait as one.

A thread of a Locker that will wait in the store's line for a key joins the key's crowd in its
Locker (:meth:`Crowds.join`) and gets a :class:`Place` there once its first attempt found the
key held. The first place leads: its thread alone takes a place in the store's line (or on
its watcher) and waits there. The others follow, in the order they came, each blocked on its own
event, asking the store nothing. A leader that leaves (it was granted the key, timed out, was
cancelled, or failed) hands the lead to the next place at once (:meth:`Crowds.leave`), whose
thread then takes the crowd's place in the store's line. So the store sees one waiter per
Locker and key, and fairness between processes stays the store's line.

A release of the key by a thread of the same Locker wakes the first place that no line wakes
(:meth:`Crowds.released`): the first follower, when the leader waits in a direct line (which is
handed the key, or told to wait while the store leaves the key free for a holder's burst), or a
leader without a line; a leader in an announced line is woken by the release itself. The woken
thread asks for the key at once (one round trip), and while it asks, a thread of the Locker that
comes for the key queues behind the crowd instead of asking first (:meth:`Crowds.asking`): a key
the store leaves free after a release goes to the crowd's next thread in turn, not to whichever
thread of the Locker asks first (the one that released it, most often). The one exception to
first come, first served: a leader told by a direct line to wait out a holder's burst (the store
leaves the key free meanwhile) waits there while the followers take the burst's grants.

The crowd decides only who asks: whether a thread holds the key is decided by the store, as for
any attempt, so two threads of a Locker can never both hold it through the crowd. A follower
keeps its own timeout, cancel event and retry delay (a set delay ends its wait, and it then asks
as a waiter without a line would).

A forked child starts with no crowds (see ``Acquisition.after_fork``): the parent's waiting
threads do not exist there.
"""

from __future__ import annotations

import threading
from typing import Optional

from .backends.base import WaitingLine

__all__ = ["Crowds", "Place"]


class Place:
    """One waiting thread's place in its key's crowd.

    ``leads`` once it is the crowd's first; ``line``, the store's line its thread waits in, if
    any; ``wake``, set when it takes the lead or when a thread of the Locker released the key,
    and ``asks`` from that release until its thread's attempt was answered."""

    __slots__ = ("asks", "leads", "line", "wake")

    def __init__(self, leads: bool) -> None:
        self.leads = leads
        self.line: Optional[WaitingLine] = None
        self.wake = threading.Event()
        self.asks = False


class Crowds(dict[str, dict[Place, None]]):
    """The crowds of one Locker: by key, the places of its waiting threads, oldest first (a
    dict keeps insertion order and drops any one place at once).

    Changed only under its mutex; its truth (any crowd at all) is read without it, as a hint
    that costs a thread acquiring or releasing a key nobody waits for next to nothing."""

    __slots__ = ("_mutex",)

    def __init__(self) -> None:
        super().__init__()
        self._mutex = threading.Lock()

    def join(self, key: str) -> Place:
        """A place at the end of ``key``'s crowd, leading when the crowd was empty."""
        with self._mutex:
            crowd = self.get(key)
            if crowd is None:
                place = Place(True)
                self[key] = {place: None}
            else:
                place = Place(False)
                crowd[place] = None
            return place

    def leave(self, key: str, place: Place) -> None:
        """``place`` leaves ``key``'s crowd; a leader hands the lead to the next place."""
        with self._mutex:
            crowd = self.get(key)
            if crowd is None or place not in crowd:
                return
            del crowd[place]
            if not crowd:
                del self[key]
                return
            if place.leads:
                head = next(iter(crowd))
                head.leads = True
                head.wake.set()

    def released(self, key: str) -> None:
        """A thread of the Locker released ``key`` (or lost it): the first place of its crowd
        that no line wakes is woken to ask at once (see the module docstring)."""
        with self._mutex:
            for place in self.get(key, ()):
                line = place.line
                if line is None:
                    place.asks = True
                    place.wake.set()
                    return
                if not line.direct:
                    return

    def asking(self, key: str) -> bool:
        """Whether a thread of ``key``'s crowd was woken by a release and asks for it now."""
        with self._mutex:
            return any(place.asks for place in self.get(key, ()))
