"""A model-based exclusion test: random interleavings of everything a lock's users do, on every
store with a lease clock of its own, checked against the two promises a lease lock makes.

Two or three Lockers share one store, as processes would. Hypothesis drives them through
acquires that wait in a background thread (so a waiter is waiting, in line where the store has
one, while another holder releases), acquires that time out, single attempts, cancelled waits,
releases, handles dropped while held, and leases left to run out, over keys that look alike to a
store that derives names from them (``x``, ``{x}``, ``{x}:line``, ``a{b}c``, ``{}``).

The model (:class:`ExclusionModel`) checks every grant against what it knows:

- **one live holder per key**: a holder is live while its own local reckoning says its lease
  cannot have ended (``expires_in`` above a small margin, and not being released or dropped). The
  local lease starts before the request left and ends early, so a holder that reads live after
  another grant of its key has returned holds the key in the store at the same time as that
  grant: never a legitimate hand-over at the end of a lease.
- **fences only grow**: a grant asked for after another grant of its key returned carries a
  larger fence, and no two grants of a key share one.
- a ``release()`` that answers ``False`` before the holder's local lease could have ended means
  somebody took the key from a live holder;
- once every Locker is closed, every key can be had again within a lease and a claim window.

Each parametrization runs a seeded, bounded search (see :data:`SEARCH`) on one store, with and
without the direct hand-off line where the store has one; the search checks the model at the end
of each example. A waiter that takes a place in line says so (:class:`ReportedLine`) before the
next step, so that a release in that step meets it in line. Interleavings the search meets only
now and then are replayed as plain tests through the same machine.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)
from lease_lock import Lock, Locker, LockHeldError, ValidationError
from lease_lock.backends.base import Backend, LineGrant, WaitingLine
from lease_lock.events import LockEvent

pytestmark = [
    pytest.mark.slow,
    # Dropping a held lock is one of the steps: the library warns about it, as it should.
    pytest.mark.filterwarnings("ignore::lease_lock.errors.DroppedLockWarning"),
]

#: Keys that a store deriving auxiliary names from the key (hash tags, suffixes) may confuse.
KEYS = ("x", "{x}", "{x}:line", "a{b}c", "{}")
#: Lockers on one store, acting as processes.
PROCESSES = 3
#: Waiting threads at once (each store's line takes more than this).
WAITERS = 3
#: The lease of every lock (etcd's shortest is longer: it uses that).
TTL = 0.5
#: A holder within this many seconds of its local lease end is not counted as live: the check
#: stays sound without it, the margin only absorbs clock-rate noise between host and store.
LIVE_MARGIN = 0.01
#: The bound on waits for threads and events that should end at once; generous, never a pace.
SETTLE = 30.0
#: The search each parametrization runs: seeded, and bounded so that a store takes well under a
#: minute on a loaded two-core machine.
SEARCH = settings(
    derandomize=True,
    database=None,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=False,
    # No shrinking: an interleaving of threads replays only roughly, and shrinking one takes
    # minutes. The failure reports the example as generated; the replayed interleavings below
    # give the short ones.
    phases=(Phase.explicit, Phase.generate),
)


# -- the stores ---------------------------------------------------------------------------------


@dataclass
class Store:
    """One store under test: ``space()`` gives a fresh, empty place on it for one example, as a
    function that opens a backend for one Locker (a "process")."""

    name: str
    ttl: float
    space: Callable[[], Callable[[], Backend]]
    shared_backend: bool = False
    #: Examples of the search: fewer where the shortest lease is longer (every wait scales with it).
    examples: int = 30


def _redis_without_line() -> type[Backend]:
    from lease_lock.backends.redis import RedisBackend

    class RedisWithoutLine(RedisBackend):
        """A Redis backend whose waiters never get a place in the store's line: they are woken
        one process at a time through the shared watcher, as the waiters past the bound of the
        direct line are."""

        def _lines_usable(self) -> bool:
            return False

    return RedisWithoutLine


def _memory_store() -> Store:
    from lease_lock.backends.memory import MemoryBackend

    def space() -> Callable[[], Backend]:
        backend = MemoryBackend()
        return lambda: backend

    return Store("memory", ttl=TTL, space=space, shared_backend=True)


def _sqlite_store(tmp_path: Path) -> Store:
    from lease_lock.backends.sqlite import SqliteBackend

    def space() -> Callable[[], Backend]:
        path = tmp_path / f"locks-{uuid.uuid4().hex[:8]}.db"
        return lambda: SqliteBackend(str(path))

    return Store("sqlite", ttl=TTL, space=space)


def _redis_store(url: str, line: bool) -> Store:
    from lease_lock.backends.redis import RedisBackend

    kind: Any = RedisBackend if line else _redis_without_line()

    def space() -> Callable[[], Backend]:
        # A private server: the keys are the bare look-alikes, with nothing in front that would
        # change their hash tags, so the database is emptied instead of prefixed.
        cleaner = RedisBackend.from_url(url)
        try:
            cleaner.client.flushdb()
        finally:
            cleaner.close()
        return lambda: kind.from_url(url)

    return Store("redis" if line else "redis-without-line", ttl=TTL, space=space)


def _postgres_store(url: str, line: bool) -> Store:
    from lease_lock.backends.postgres import PostgresBackend

    def space() -> Callable[[], Backend]:
        table = f"model_{uuid.uuid4().hex[:12]}"
        return lambda: PostgresBackend.from_url(url, table=table, direct_handoff=line)

    return Store("postgres-direct-handoff" if line else "postgres", ttl=TTL, space=space)


def _etcd_store(url: str, line: bool) -> Store:
    from lease_lock.backends.etcd import MIN_TTL, EtcdBackend

    def space() -> Callable[[], Backend]:
        namespace = f"model-{uuid.uuid4().hex[:12]}/"
        return lambda: EtcdBackend.from_url(url, namespace=namespace, direct_handoff=line)

    return Store("etcd-direct-handoff" if line else "etcd", ttl=float(MIN_TTL), space=space, examples=12)


STORES = (
    "memory", "sqlite", "redis", "redis-without-line", "postgres", "postgres-direct-handoff", "etcd",
    "etcd-direct-handoff",
)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    name: str = request.param
    if name == "memory":
        return _memory_store()
    if name == "sqlite":
        return _sqlite_store(tmp_path)
    if name.startswith("redis"):
        return _redis_store(request.getfixturevalue("private_redis_server").url, line=name == "redis")
    if name.startswith("postgres"):
        return _postgres_store(request.getfixturevalue("postgres_server").url, line=name.endswith("handoff"))
    return _etcd_store(request.getfixturevalue("etcd_server").url, line=name.endswith("handoff"))


# -- the model ----------------------------------------------------------------------------------


@dataclass(eq=False)
class Grant:
    """One grant of a key to one of the test's locks, as the model saw it."""

    number: int
    process: int
    key: str
    how: str
    fence: int
    token: str
    auto_extend: bool
    #: When the acquire call began and returned (``time.monotonic``).
    asked: float
    returned: float
    lock: Optional[Lock]
    #: ``held`` until the test releases (``releasing``, ``released``) or drops it (``dropped``).
    status: str = "held"
    #: Granted while the example was ending: the waiter that got it gives it back at once.
    late: bool = False

    def describe(self) -> str:
        return (
            f"grant #{self.number} ({self.how} by process {self.process}, fence {self.fence}, "
            f"token {self.token[:8]}…, status {self.status})"
        )


@dataclass
class ExclusionModel:
    """What the test knows of every grant, and the violations it found (see the module
    docstring); shared by the main thread and the waiting threads."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    grants: list[Grant] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: Set when the example ends: every grant from then on is given back by its waiter.
    closing: bool = False

    def record(self, process: int, how: str, lock: Lock, auto_extend: bool, asked: float, returned: float) -> Grant:
        """Check a grant that just returned against every grant of its key, then keep it."""
        assert lock.fence is not None, "every Locker of the test is made with fencing=True"
        with self.mutex:
            grant = Grant(
                next(self.numbers), process, lock.key, how, lock.fence, lock.token, auto_extend, asked, returned, lock,
            )
            grant.late = self.closing
            self._check_exclusion(grant)
            for other in self.grants:
                if other.key == grant.key:
                    self._check_fences(other, grant)
            self.grants.append(grant)
            return grant

    def _check_exclusion(self, grant: Grant) -> None:
        assert grant.lock is not None
        left = grant.lock.expires_in
        if left <= LIVE_MARGIN:
            return  # it came back with its lease (nearly) spent: nobody can rely on it
        for other in self.grants:
            if other.key != grant.key or other.status != "held" or other.lock is None:
                continue
            other_left = other.lock.expires_in
            if other_left > LIVE_MARGIN:
                self.violations.append(
                    f"two live holders of key {grant.key!r}: {other.describe()} still had "
                    f"{other_left:.3f} s of its local lease when {grant.describe()} returned "
                    f"with {left:.3f} s of its own"
                )

    def _check_fences(self, first: Grant, second: Grant) -> None:
        if first.fence == second.fence:
            self.violations.append(
                f"two grants of key {first.key!r} share fence {first.fence}: {first.describe()} and "
                f"{second.describe()}"
            )
            return
        for before, after in ((first, second), (second, first)):
            if before.returned < after.asked and after.fence < before.fence:
                self.violations.append(
                    f"the fence of key {after.key!r} went back: {after.describe()} was asked for after "
                    f"{before.describe()} had returned, yet got fence {after.fence} < {before.fence}"
                )

    def held(self) -> list[Grant]:
        with self.mutex:
            return [grant for grant in self.grants if grant.status == "held" and grant.lock is not None]

    def release(self, grant: Grant) -> None:
        """Release ``grant``'s lock; a ``False`` answer that came before its local lease could
        have ended is a violation (somebody took the key from a live holder)."""
        lock = grant.lock
        assert lock is not None
        self.mark(grant, "releasing")
        before = time.monotonic()
        left = lock.expires_in
        released = lock.release()
        took = time.monotonic() - before
        if not released and took < left - LIVE_MARGIN:
            self.note(
                f"key {grant.key!r} was taken from a live holder: release() of {grant.describe()} "
                f"answered False {took:.3f} s into the {left:.3f} s left of its local lease"
            )
        self.mark(grant, "released")

    def close(self) -> list[Grant]:
        """The example ends: the grants still held that the test must give back."""
        with self.mutex:
            self.closing = True
            return [grant for grant in self.grants if grant.status == "held" and grant.lock is not None]

    def mark(self, grant: Grant, status: str) -> None:
        with self.mutex:
            grant.status = status
            if status in ("released", "dropped"):
                grant.lock = None

    def note(self, violation: str) -> None:
        with self.mutex:
            self.violations.append(violation)


class Waiter(threading.Thread):
    """A blocking acquire on a thread of its own. ``settled`` is set once it really waits: its
    first attempt was answered and, where it takes a place in the key's line, that place is
    taken (see :class:`ReportedLine`); or once it ended. The test goes on from there, so that a
    release in the next step meets a waiter that is waiting, in line or not. A waiter ``behind``
    another waiter of its Locker for the same key queues in that Locker and takes no place in
    line until the one ahead leaves."""

    def __init__(
        self, model: ExclusionModel, process: int, locker: Locker, key: str, timeout: float,
        cancel: Optional[threading.Event], auto_extend: bool, label: str, behind: bool = False,
    ) -> None:
        super().__init__(name=f"waiter {label}", daemon=True)
        self.model = model
        self.process = process
        self.locker = locker
        self.key = key
        self.timeout = timeout
        self.cancel = cancel
        self.auto_extend = auto_extend
        self.label = label
        self.settled = threading.Event()
        #: Whether this waiter takes a place in line once its first attempt is refused.
        self.joins_line = cancel is None and not behind and hasattr(locker.backend, "join_line")
        self.outcome = "waiting"
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        asked = time.monotonic()
        try:
            lock = self.locker.acquire(
                self.key, timeout=self.timeout, cancel=self.cancel, auto_extend=self.auto_extend
            )
        except LockHeldError as error:
            self.outcome = f"gave up ({error.reason})"
        except BaseException as error:  # noqa: BLE001 - reported by ExclusionMachine.check
            self.outcome = "failed"
            self.error = error
        else:
            grant = self.model.record(self.process, self.label, lock, self.auto_extend, asked, time.monotonic())
            del lock
            self.outcome = f"granted as #{grant.number}"
            if grant.late:
                self.model.release(grant)
        finally:
            self.settled.set()


def _on_event(event: LockEvent) -> None:
    # The first answer to a waiter's attempt tells the test that it now waits, unless it is
    # about to take a place in line (ReportedLine tells when it has).
    thread = threading.current_thread()
    if isinstance(thread, Waiter) and not thread.joins_line and event.type in ("contended", "attempt_failed"):
        thread.settled.set()


class ReportedLine(WaitingLine):
    """A waiting thread's place in line that tells its :class:`Waiter` once it is taken.

    Its first ``wait`` takes the place with a wait of no time (which the line contract makes an
    ``ask`` that keeps the place) before blocking for the rest: a release from then on finds
    the waiter in line."""

    def __init__(self, line: WaitingLine) -> None:
        self._line = line
        self._placed = False

    def ask(self) -> Optional[int]:
        return self._line.ask()

    def wait(self, seconds: float) -> Optional[LineGrant]:
        if not self._placed:
            self._placed = True
            started = time.monotonic()
            grant = self._line.wait(0.0)
            _settle_waiter()
            if grant is not None:
                return grant
            seconds = max(0.0, seconds - (time.monotonic() - started))
        return self._line.wait(seconds)

    def leave(self, granted: bool) -> None:
        self._line.leave(granted)


def _settle_waiter() -> None:
    thread = threading.current_thread()
    if isinstance(thread, Waiter):
        thread.settled.set()


def announce_places_in_line(backend: Backend) -> None:
    """Make ``backend``'s places in line tell their waiters when they are taken (a backend
    without a line is left as it is)."""
    join_line = getattr(backend, "join_line", None)
    if join_line is None:
        return

    def announced(*args: Any, **kwargs: Any) -> Optional[WaitingLine]:
        line: Optional[WaitingLine] = join_line(*args, **kwargs)
        if line is None:
            _settle_waiter()  # no place to be had: the waiter waits as on a store without a line
            return None
        return ReportedLine(line)

    backend.join_line = announced  # type: ignore[attr-defined]


# -- the state machine --------------------------------------------------------------------------


PROCESS = st.integers(0, PROCESSES - 1)
PICK = st.integers(0, 30)
#: A key of the example's focus, by index (see ``ExclusionMachine.choose_focus``).
FOCUSED = st.integers(0, 2)
#: Waits, as shares of the store's ttl: within a lease, past one, and past a few.
SHARE = st.sampled_from((0.5, 1.5, 3.0))


def accepted_keys(store: Store) -> tuple[str, ...]:
    """The keys of :data:`KEYS` that ``store`` accepts: a store may reserve names of its own
    (refused with ``ValidationError`` before anything is asked), which no user can then hold."""
    backend = store.space()()
    try:
        accepted = []
        for key in KEYS:
            try:
                backend.check_key(key)
            except ValidationError:
                continue
            accepted.append(key)
        return tuple(accepted)
    finally:
        backend.close()


class ExclusionMachine(RuleBasedStateMachine):
    """The steps, drawn by Hypothesis, and the end of an example; :func:`exclusion_machine`
    binds it to a store."""

    store: ClassVar[Store]
    #: The keys of :data:`KEYS` the store accepts.
    family: ClassVar[tuple[str, ...]]

    def __init__(self) -> None:
        super().__init__()
        self.model = ExclusionModel()
        self.waiters: list[Waiter] = []
        self.labels = itertools.count(1)
        self.backends: list[Backend] = []
        self.lockers: list[Locker] = []
        self.step_failed = False
        self.keys: list[str] = []
        open_backend = self.store.space()
        for _ in range(PROCESSES):
            backend = open_backend()
            if not self.store.shared_backend or not self.backends:
                announce_places_in_line(backend)
                self.backends.append(backend)
            self.lockers.append(Locker(backend, ttl=self.store.ttl, fencing=True, on_event=_on_event))

    @initialize(data=st.data())
    def choose_focus(self, data: st.DataObject) -> None:
        """The keys of one example: a few of the family, so that its steps meet on them."""
        self.choose_keys(data.draw(st.lists(st.sampled_from(self.family), min_size=1, max_size=3, unique=True)))

    def choose_keys(self, keys: list[str]) -> None:
        self.keys = keys

    # -- helpers ----------------------------------------------------------------------------

    def _key(self, index: int) -> str:
        return self.keys[index % len(self.keys)]

    def _pending(self) -> list[Waiter]:
        return [waiter for waiter in self.waiters if waiter.is_alive()]

    def _pick(self, grants: list[Grant], index: int) -> Optional[Grant]:
        # No precondition says whether there is one: what the waiting threads were granted
        # depends on timing, and the steps Hypothesis draws must not.
        return grants[index % len(grants)] if grants else None

    def _join(self, waiter: Waiter, bound: float) -> None:
        waiter.join(bound)
        assert not waiter.is_alive(), f"{waiter.name} still waits {bound:.1f} s after its wait should have ended"

    # -- rules ------------------------------------------------------------------------------

    @rule(process=PROCESS, key=FOCUSED, auto_extend=st.booleans())
    def try_acquire(self, process: int, key: int, auto_extend: bool) -> None:
        asked = time.monotonic()
        try:
            lock = self.lockers[process].try_acquire(self._key(key), auto_extend=auto_extend)
        except LockHeldError:
            return  # a grant that came back too late: given back, nobody holds it
        if lock is not None:
            self.model.record(process, "try_acquire", lock, auto_extend, asked, time.monotonic())

    @rule(process=PROCESS, key=FOCUSED, share=st.sampled_from((0.05, 0.2)))
    def acquire_with_timeout(self, process: int, key: int, share: float) -> None:
        timeout = share * self.store.ttl
        asked = time.monotonic()
        try:
            lock = self.lockers[process].acquire(self._key(key), timeout=timeout)
        except LockHeldError:
            return
        self.model.record(process, f"acquire(timeout={timeout:g})", lock, True, asked, time.monotonic())

    @rule(
        process=PROCESS, key=FOCUSED, held=st.booleans(), share=SHARE, cancellable=st.booleans(),
        auto_extend=st.booleans(),
    )
    def start_waiting(
        self, process: int, key: int, held: bool, share: float, cancellable: bool, auto_extend: bool
    ) -> None:
        """A waiter in a thread of its own; with ``held``, for the key of a lock held now
        (a wait for a free key is over at once)."""
        if len(self._pending()) >= WAITERS:
            return
        holder = self._pick(self.model.held(), key) if held else None
        name = self._key(key) if holder is None else holder.key
        timeout = share * self.store.ttl
        label = f"wait#{next(self.labels)}({name!r}, timeout={timeout:g}{', cancel' if cancellable else ''})"
        locker = self.lockers[process]
        behind = any(other.locker is locker and other.key == name for other in self._pending())
        waiter = Waiter(
            self.model, process, locker, name, timeout, threading.Event() if cancellable else None, auto_extend, label,
            behind,
        )
        self.waiters.append(waiter)
        waiter.start()
        assert waiter.settled.wait(SETTLE), f"{label} was not waiting {SETTLE:.0f} s after it began"

    @rule(index=PICK, cancel=st.booleans())
    def end_a_wait(self, index: int, cancel: bool) -> None:
        """Cancel a waiter (one with a cancel event), or see a waiter through to its end."""
        waiters = [waiter for waiter in self._pending() if waiter.cancel is not None or not cancel]
        if not waiters:
            return
        waiter = waiters[index % len(waiters)]
        if cancel:
            assert waiter.cancel is not None
            waiter.cancel.set()
            self._join(waiter, SETTLE)
        else:
            self._join(waiter, waiter.timeout + SETTLE)

    @rule(index=PICK, how=st.sampled_from(("release", "drop", "run out")))
    def end_a_hold(self, index: int, how: str) -> None:
        """Release a held lock, drop it, or let a lease that is not extended run out."""
        held = self.model.held()
        if how == "run out":
            held = [grant for grant in held if not grant.auto_extend]
        grant = self._pick(held, index)
        if grant is None:
            return
        if how == "release":
            self.model.release(grant)
        elif how == "drop":
            self.model.mark(grant, "dropped")
            # The model held the last reference: the lock is collected and its lease given back.
            gc.collect()
        else:
            assert grant.lock is not None
            # lost.wait returns when the local lease ends: nothing renews it.
            assert grant.lock.lost.wait(self.store.ttl + SETTLE), f"{grant.describe()} never ran out"

    def check(self) -> None:
        """Raise what the model found: violations, and errors of the waiting threads.

        Called at the end of an example only, not after every step: a step whose outcome
        depends on threads replays only roughly, and a check raising at another step of the
        replay would make Hypothesis report inconsistent data generation instead."""
        with self.model.mutex:
            violations = list(self.model.violations)
        failed = [waiter for waiter in self.waiters if waiter.error is not None]
        if violations:
            self.step_failed = True
            raise AssertionError(f"on {self.store.name}: " + "\n".join(violations))
        if failed:
            self.step_failed = True
            error = failed[0].error
            raise AssertionError(f"on {self.store.name}: {failed[0].name} raised {error!r}") from error

    # -- the end of an example --------------------------------------------------------------

    def teardown(self) -> None:
        try:
            # Give every key back, so that the waiters are granted (and checked) or end:
            # each gives back what it gets from now on.
            for grant in self.model.close():
                self.model.release(grant)
            for waiter in self.waiters:
                waiter.join(waiter.timeout + SETTLE)
            stuck = [waiter.name for waiter in self.waiters if waiter.is_alive()]
            if not self.step_failed:
                assert not stuck, f"on {self.store.name}: waiters still waiting at the end: {stuck}"
                self.check()
        finally:
            for locker in self.lockers:
                locker.close()
        if not self.step_failed:
            self._every_key_free_again()
        for backend in self.backends:
            backend.close()

    def _every_key_free_again(self) -> None:
        # Closing gave back every lease the test held; what a departed waiter was handed
        # lapses within its claim window (at most a ttl).
        checker = Locker(self.backends[0], ttl=self.store.ttl, fencing=True)
        try:
            for key in self.family:
                bound = 2 * self.store.ttl + SETTLE
                try:
                    lock = checker.acquire(key, timeout=bound)
                except LockHeldError as error:
                    raise AssertionError(
                        f"on {self.store.name}: key {key!r} was still held {bound:.0f} s after every Locker "
                        f"of the example closed ({checker.get(key)})"
                    ) from error
                lock.release()
        finally:
            checker.close()


def exclusion_machine(store: Store) -> type[ExclusionMachine]:
    """The state machine class for ``store``."""
    family = accepted_keys(store)
    assert "x" in family and "{x}" in family, f"{store.name} refuses the keys the model is about: {family}"
    return type(f"ExclusionMachine[{store.name}]", (ExclusionMachine,), {"store": store, "family": family})


def test_one_live_holder_per_key_and_growing_fences(store: Store) -> None:
    run_state_machine_as_test(exclusion_machine(store), settings=settings(SEARCH, max_examples=store.examples))


@pytest.mark.parametrize(("waited", "released"), [("{x}", "x"), ("x", "{x}")])
def test_a_release_hands_nothing_to_a_waiter_for_a_look_alike_key(store: Store, waited: str, released: str) -> None:
    """One interleaving the search may take many examples to meet, replayed through the same
    model: both look-alike keys held, a waiter (in line where the store has one) for one of
    them, the other released. The waiter must time out: its key is held throughout.

    The model's leases are short; on a busy machine the holder of the waited key can lose its
    lease to a late extension, and the key is then free for the waiter by right. Such a run says
    nothing about look-alike keys, so it is run again."""
    for _ in range(5):
        machine = exclusion_machine(store)()
        try:
            machine.choose_keys([waited, released])
            machine.try_acquire(process=0, key=0, auto_extend=True)
            machine.try_acquire(process=1, key=1, auto_extend=True)
            assert [grant.key for grant in machine.model.held()] == [waited, released]
            holder = machine.model.held()[0].lock
            assert holder is not None
            machine.start_waiting(process=2, key=0, held=False, share=1.5, cancellable=False, auto_extend=True)
            machine.end_a_hold(index=1, how="release")
            machine.end_a_wait(index=0, cancel=False)
            machine.check()
            if holder.lost_reason is None:
                assert machine.waiters[0].outcome == "gave up (timeout)", machine.waiters[0].outcome
                return
        finally:
            machine.teardown()
    pytest.fail("the holder of the waited key lost its lease in every run")
