"""The backend contract as a pytest suite, for built-in and third-party backends.

Subclass :class:`BackendContract` in a test module and provide a ``backend`` fixture that yields
a fresh, working backend; pytest then runs every contract test against it::

    import pytest
    from lease_lock.testing import BackendContract

    class TestMyBackend(BackendContract):
        @pytest.fixture
        def backend(self):
            backend = MyBackend(...)
            yield backend
            backend.close()

:class:`BackendContract` tests locking only. A store the HTTP lock server can run on also offers
the optional :class:`~lease_lock.backends.service.ServiceStore` interface; mix
:class:`ServiceStoreContract` into the same test class (it uses the same ``backend`` fixture) to
test its shared counters as well.

Nothing is registered as a pytest plugin: importing this module is the opt-in. Timings scale to
``backend.capabilities.min_ttl``, so a backend whose shortest lease is several seconds (the HTTP
service's is five) still passes, only more slowly. The suite waits on the backend's own answers
with generous deadlines and never asserts on how fast something happened.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Callable, Iterator, Optional

import pytest

from .backends.base import Backend, ExtendRequest, LineGrant, LockState, WaitingLine
from .backends.service import ServiceStore
from .errors import ValidationError
from .events import LockEvent
from .locker import Locker

__all__ = ["BackendContract", "ServiceStoreContract", "wait_until"]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return predicate()
        time.sleep(interval)


class BackendContract:
    """Every behaviour a lock backend must have, as tests. Subclasses supply ``backend``."""

    #: Extra seconds a backend may need beyond a lease's end before the key is free again
    #: (the HTTP service keeps a lapsed lease one more second).
    expiry_grace: float = 1.5
    owner = "contract-test:1"

    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        """Override in the subclass: yield the backend under test."""
        raise NotImplementedError("subclass BackendContract and define a 'backend' fixture")

    @pytest.fixture
    def key(self) -> str:
        """A key no other test uses, valid on every backend (the HTTP service's rule included)."""
        return f"contract:{uuid.uuid4().hex}"

    @staticmethod
    def token(backend: Backend) -> str:
        """A fresh token in the backend's preferred form."""
        return backend.new_token()

    @staticmethod
    def short_ttl(backend: Backend) -> float:
        """A lease short enough to wait out in a test."""
        return max(0.5, backend.capabilities.min_ttl)

    @staticmethod
    def long_ttl(backend: Backend) -> float:
        """A lease that cannot run out during a test."""
        return max(60.0, backend.capabilities.min_ttl * 12)

    def wait_for_expiry(self, backend: Backend, key: str, ttl: float) -> bool:
        """Wait until nobody holds ``key`` any more, on the backend's own clock."""
        return wait_until(lambda: not backend.inspect(key).held, ttl + self.expiry_grace + 10)

    def grant(self, backend: Backend, key: str, token: str, ttl: float) -> bool:
        """One grant request through the fenced call when the backend hands out fences (the
        path ``Locker(fencing=True)`` takes), else through the plain one."""
        if backend.capabilities.fencing:
            return backend.acquire_fenced(key, token, ttl, self.owner) is not None
        return backend.acquire(key, token, ttl, self.owner)

    def skip_without(self, backend: Backend, capability: str, key: str) -> None:
        """Return when ``backend`` declares ``capability`` (``"fencing"``, ``"scan"``,
        ``"release_notify"`` or ``"counting"``), so the calling test runs. Otherwise check that the backend
        refuses it plainly and skip the test, naming the capability in the report: an
        undeclared capability is neither tested as present nor counted as passed.

        The refusals: ``acquire_fenced`` raises ``NotImplementedError`` without taking the key
        and ``Locker(fencing=True)`` raises ``ValidationError``; ``scan`` and
        ``watch_releases`` raise ``NotImplementedError``; ``acquire_counted`` raises
        ``NotImplementedError`` without taking the key and ``Locker(limit=2)`` raises
        ``ValidationError`` naming the backend.
        """
        if getattr(backend.capabilities, capability):
            return
        if capability == "fencing":
            with pytest.raises(NotImplementedError):
                backend.acquire_fenced(key, self.token(backend), self.long_ttl(backend), self.owner)
            assert not backend.inspect(key).held
            with pytest.raises(ValidationError, match="fencing"):
                Locker(backend, fencing=True)
            refusal = "acquire_fenced raises NotImplementedError and Locker(fencing=True) is refused"
        elif capability == "scan":
            with pytest.raises(NotImplementedError):
                list(backend.scan(key))
            refusal = "scan raises NotImplementedError"
        elif capability == "release_notify":
            with pytest.raises(NotImplementedError):
                backend.watch_releases(lambda _key: None)
            refusal = "watch_releases raises NotImplementedError"
        elif capability == "counting":
            with pytest.raises(NotImplementedError):
                backend.acquire_counted(key, self.token(backend), self.long_ttl(backend), self.owner, 2)
            assert not backend.inspect(key).held
            with pytest.raises(ValidationError, match=type(backend).__name__):
                Locker(backend, limit=2)
            refusal = "acquire_counted raises NotImplementedError and Locker(limit=2) is refused"
        else:
            raise ValueError(f"no refusal check for capability {capability!r}")
        pytest.skip(f"{type(backend).__name__} does not declare capabilities.{capability} ({refusal})")

    def fenced_grant_after_expiry(self, backend: Backend, key: str, token: str) -> int:
        """Take ``key`` for ``token`` once the backend lets anyone take it again (a backend may
        keep a lapsed key a little longer, like the HTTP service's grace second); its fence."""
        fences: list[int] = []

        def grant() -> bool:
            fence = backend.acquire_fenced(key, token, self.long_ttl(backend), self.owner)
            if fence is not None:
                fences.append(fence)
            return fence is not None

        assert wait_until(grant, self.expiry_grace + 10)
        return fences[0]

    # -- acquire and contention ----------------------------------------------------------------

    def test_acquire_free_key(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        assert backend.acquire(key, token, self.long_ttl(backend), self.owner) is True
        assert backend.is_held(key, token) is True

    def test_contention_answers_false(self, backend: Backend, key: str) -> None:
        first, second = self.token(backend), self.token(backend)
        ttl = self.long_ttl(backend)
        assert backend.acquire(key, first, ttl, self.owner)
        assert backend.acquire(key, second, ttl, self.owner) is False
        assert self.grant(backend, key, second, ttl) is False
        assert backend.is_held(key, first) and not backend.is_held(key, second)

    def test_same_token_reacquire_resets_lease(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        long_ttl = self.long_ttl(backend)
        assert backend.acquire(key, token, long_ttl, self.owner)
        shorter = long_ttl / 2
        assert backend.acquire(key, token, shorter, self.owner) is True
        state = backend.inspect(key)
        assert state.held and state.expires_in is not None
        # An absolute new lease: it may shorten the old one, never adds to it.
        assert state.expires_in <= shorter + 1.0

    def test_racing_acquires_grant_once(self, backend: Backend, key: str) -> None:
        tokens = [self.token(backend) for _ in range(8)]
        ttl = self.long_ttl(backend)
        start = threading.Barrier(len(tokens))
        winners: list[str] = []

        def contend(token: str) -> None:
            start.wait()
            if self.grant(backend, key, token, ttl):
                winners.append(token)

        threads = [threading.Thread(target=contend, args=(token,)) for token in tokens]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(winners) == 1
        assert backend.is_held(key, winners[0])

    # -- release -------------------------------------------------------------------------------

    def test_release_needs_the_token(self, backend: Backend, key: str) -> None:
        owner_token, other = self.token(backend), self.token(backend)
        assert backend.acquire(key, owner_token, self.long_ttl(backend), self.owner)
        assert backend.release(key, other) is False
        assert backend.is_held(key, owner_token)
        assert backend.release(key, owner_token) is True
        assert backend.release(key, owner_token) is False
        assert not backend.inspect(key).held

    def test_release_of_free_key(self, backend: Backend, key: str) -> None:
        assert backend.release(key, self.token(backend)) is False

    def test_released_key_is_free_for_others(self, backend: Backend, key: str) -> None:
        first, second = self.token(backend), self.token(backend)
        ttl = self.long_ttl(backend)
        assert backend.acquire(key, first, ttl, self.owner)
        assert backend.release(key, first)
        assert backend.acquire(key, second, ttl, self.owner)

    # -- extend --------------------------------------------------------------------------------

    def test_extend_replaces_expiry(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        long_ttl = self.long_ttl(backend)
        assert backend.acquire(key, token, long_ttl, self.owner)
        shorter = long_ttl / 3
        assert backend.extend(key, token, shorter) is True
        state = backend.inspect(key)
        assert state.held and state.expires_in is not None
        assert state.expires_in <= shorter + 1.0
        assert backend.extend(key, token, long_ttl) is True
        longer = backend.inspect(key).expires_in
        assert longer is not None and longer > shorter + 1.0

    def test_extend_needs_the_token(self, backend: Backend, key: str) -> None:
        token, other = self.token(backend), self.token(backend)
        assert backend.acquire(key, token, self.long_ttl(backend), self.owner)
        assert backend.extend(key, other, self.long_ttl(backend)) is False
        assert backend.extend(f"{key}:absent", token, self.long_ttl(backend)) is False

    def test_extend_many_answers_in_order(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        ttl = self.long_ttl(backend)
        held = [f"{key}:{index}" for index in range(3)]
        for name in held:
            assert backend.acquire(name, token, ttl, self.owner)
        requests = [ExtendRequest(name, token, ttl) for name in held]
        requests.insert(1, ExtendRequest(f"{key}:absent", token, ttl))
        assert backend.extend_many(requests) == [True, False, True, True]
        assert backend.extend_many([]) == []

    # -- is_held, inspect, force_release -------------------------------------------------------

    def test_is_held_after_release(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        assert not backend.is_held(key, token)
        assert backend.acquire(key, token, self.long_ttl(backend), self.owner)
        assert backend.is_held(key, token)
        assert backend.release(key, token)
        assert not backend.is_held(key, token)

    def test_inspect_held_key(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        ttl = self.long_ttl(backend)
        before = datetime.now(timezone.utc)
        fence: Optional[int] = None
        if backend.capabilities.fencing:
            fence = backend.acquire_fenced(key, token, ttl, self.owner)
            assert fence is not None
        else:
            assert backend.acquire(key, token, ttl, self.owner)
        state = backend.inspect(key)
        assert state.key == key and state.held
        assert state.owner == self.owner
        assert state.fence == fence
        assert state.expires_at is not None and state.expires_at.tzinfo is not None
        assert state.expires_at.utcoffset() == timezone.utc.utcoffset(None)
        # Generous bounds: the backend's clock may differ a little from ours.
        assert before.timestamp() + ttl - 60 < state.expires_at.timestamp() < before.timestamp() + ttl + 60
        assert state.expires_in is not None and 0 < state.expires_in <= ttl + 1.0
        assert token not in repr(state)

    def test_inspect_free_key(self, backend: Backend, key: str) -> None:
        state = backend.inspect(key)
        assert state.key == key and not state.held
        assert state.expires_at is None and state.fence is None

    def test_force_release(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        assert backend.force_release(key) is False
        assert backend.acquire(key, token, self.long_ttl(backend), self.owner)
        assert backend.force_release(key) is True
        assert not backend.is_held(key, token)
        assert backend.release(key, token) is False
        assert backend.extend(key, token, self.long_ttl(backend)) is False
        assert backend.force_release(key) is False

    # -- expiry --------------------------------------------------------------------------------

    def test_expiry_on_backend_clock(self, backend: Backend, key: str) -> None:
        token, other = self.token(backend), self.token(backend)
        ttl = self.short_ttl(backend)
        assert backend.acquire(key, token, ttl, self.owner)
        assert self.wait_for_expiry(backend, key, ttl)
        assert wait_until(
            lambda: backend.acquire(key, other, self.long_ttl(backend), self.owner),
            self.expiry_grace + 10,
        )
        assert not backend.is_held(key, token)
        assert backend.extend(key, token, ttl) is False
        assert backend.release(key, token) is False
        assert backend.is_held(key, other)

    # -- fencing -------------------------------------------------------------------------------

    def test_fences_rise_with_every_grant(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "fencing", key)
        ttl = self.long_ttl(backend)
        fences = []
        for _ in range(5):
            token = self.token(backend)
            fence = backend.acquire_fenced(key, token, ttl, self.owner)
            assert isinstance(fence, int) and not isinstance(fence, bool)
            assert 0 < fence < 2**53
            fences.append(fence)
            assert backend.release(key, token)
        assert fences == sorted(fences) and len(set(fences)) == len(fences)

    def test_fence_kept_by_extend_and_reacquire(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "fencing", key)
        token = self.token(backend)
        ttl = self.long_ttl(backend)
        fence = backend.acquire_fenced(key, token, ttl, self.owner)
        assert fence is not None
        assert backend.extend(key, token, ttl)
        assert backend.inspect(key).fence == fence
        assert backend.acquire_fenced(key, token, ttl, self.owner) == fence
        assert backend.inspect(key).fence == fence

    def test_fence_rises_after_expiry_and_force_release(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "fencing", key)
        first = self.token(backend)
        short = self.short_ttl(backend)
        fence1 = backend.acquire_fenced(key, first, short, self.owner)
        assert fence1 is not None
        assert self.wait_for_expiry(backend, key, short)
        fence2 = self.fenced_grant_after_expiry(backend, key, self.token(backend))
        assert fence2 > fence1
        assert backend.force_release(key)
        fence3 = backend.acquire_fenced(key, self.token(backend), self.long_ttl(backend), self.owner)
        assert fence3 is not None and fence3 > fence2

    def test_same_token_after_lapse_is_a_new_grant(self, backend: Backend, key: str) -> None:
        # The key was free between the lapse and the re-acquire, so whoever held it then may
        # have written with a larger fence: the returning token must not get its old one back.
        self.skip_without(backend, "fencing", key)
        token = self.token(backend)
        short = self.short_ttl(backend)
        first = backend.acquire_fenced(key, token, short, self.owner)
        assert first is not None
        assert self.wait_for_expiry(backend, key, short)
        assert self.fenced_grant_after_expiry(backend, key, token) > first

    def test_fences_of_different_keys_are_independent(self, backend: Backend, key: str) -> None:
        # Fences are promised per key: larger for every later grant of the key, the same for
        # its holder's extensions and re-acquires. Fences of two keys are never compared (one
        # counter shared by every key is allowed), so independence means that nothing done to
        # one key shows in the other's fences: its holder keeps its fence, and its own grants,
        # judged alone, still rise. The second key extends the first, so a store that mixes up
        # keys sharing a prefix fails too. Each round ends one key by release, the next by
        # force_release.
        self.skip_without(backend, "fencing", key)
        ttl = self.long_ttl(backend)
        fences: dict[str, list[int]] = {key: [], f"{key}:b": []}

        def grant(name: str) -> str:
            token = self.token(backend)
            fence = backend.acquire_fenced(name, token, ttl, self.owner)
            assert fence is not None, f"{name} is free and must be granted"
            fences[name].append(fence)
            return token

        def holder_keeps_its_fence(name: str, token: str) -> None:
            fence = fences[name][-1]
            assert backend.inspect(name).fence == fence, f"{name}'s fence changed with the other key"
            assert backend.extend(name, token, ttl)
            assert backend.acquire_fenced(name, token, ttl, self.owner) == fence
            assert backend.inspect(name).fence == fence

        def end(name: str, token: str, forced: bool) -> None:
            assert backend.force_release(name) if forced else backend.release(name, token)

        first, second = fences
        first_token = grant(first)
        for round_ in range(4):
            second_token = grant(second)
            holder_keeps_its_fence(first, first_token)
            end(first, first_token, forced=round_ % 2 == 1)
            holder_keeps_its_fence(second, second_token)
            first_token = grant(first)
            holder_keeps_its_fence(second, second_token)
            end(second, second_token, forced=round_ % 2 == 0)
            holder_keeps_its_fence(first, first_token)
        for name, granted in fences.items():
            assert all(earlier < later for earlier, later in zip(granted, granted[1:])), (
                f"the fences of {name} did not rise with every grant: {granted}"
            )

    # -- keys ----------------------------------------------------------------------------------

    def test_keys_are_exact(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        ttl = self.long_ttl(backend)
        assert backend.acquire(key, token, ttl, self.owner)
        # A key that only shares a prefix, or differs in case, is another key.
        assert backend.acquire(f"{key}x", self.token(backend), ttl, self.owner)
        assert backend.acquire(key.upper(), self.token(backend), ttl, self.owner)

    def test_unusual_keys(self, backend: Backend, key: str) -> None:
        ttl = self.long_ttl(backend)
        candidates = [f"{key}:ünïcødé/{{tag}} *?[x]", key + ":" + "k" * 900]
        for name in candidates:
            try:
                backend.check_key(name)
            except ValueError:
                continue  # stricter backends (the HTTP service) refuse these up front
            token = self.token(backend)
            assert backend.acquire(name, token, ttl, self.owner)
            assert backend.inspect(name).held
            assert backend.release(name, token)

    # -- optional capabilities -----------------------------------------------------------------

    def test_scan_lists_held_keys(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "scan", key)
        ttl = self.long_ttl(backend)
        names = [f"{key}:{index}" for index in range(3)]
        tokens = {name: self.token(backend) for name in names}
        for name in names:
            assert backend.acquire(name, tokens[name], ttl, self.owner)
        assert backend.release(names[1], tokens[names[1]])
        assert backend.acquire(f"other:{key}", self.token(backend), ttl, self.owner)
        listed = {state.key for state in backend.scan(f"{key}:")}
        assert listed == {names[0], names[2]}
        assert all(state.held for state in backend.scan(f"{key}:"))

    def test_release_notifications(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "release_notify", key)
        heard: list[str] = []
        released = threading.Event()
        forced = threading.Event()

        def on_release(name: str) -> None:
            heard.append(name)
            if name == key:
                released.set()
            elif name == f"{key}:forced":
                forced.set()

        watcher = backend.watch_releases(on_release)
        try:
            assert wait_until(lambda: watcher.active, 30)
            token = self.token(backend)
            ttl = self.long_ttl(backend)
            assert backend.acquire(key, token, ttl, self.owner)
            assert backend.release(key, token)
            assert released.wait(30)
            assert backend.acquire(f"{key}:forced", token, ttl, self.owner)
            assert backend.force_release(f"{key}:forced")
            assert forced.wait(30)
        finally:
            watcher.close()
        assert not watcher.active

    # -- counting leases (optional) --------------------------------------------------------------

    def places(self, backend: Backend, key: str, limit: int, count: int, ttl: Optional[float] = None) -> list[str]:
        """Grant ``count`` places of ``key`` (a counting key of ``limit``) to fresh tokens; the
        tokens, in the order granted. Skips the test (checking the refusal) on a backend that
        grants no counting leases."""
        self.skip_without(backend, "counting", key)
        tokens = [self.token(backend) for _ in range(count)]
        for token in tokens:
            fence = backend.acquire_counted(key, token, ttl or self.long_ttl(backend), self.owner, limit)
            assert fence is not None, "a counting key refused a place below its limit"
        return tokens

    def test_counting_admits_up_to_the_limit(self, backend: Backend, key: str) -> None:
        tokens = self.places(backend, key, 3, 3)
        ttl = self.long_ttl(backend)
        assert backend.acquire_counted(key, self.token(backend), ttl, self.owner, 3) is None
        assert all(backend.is_held(key, token) for token in tokens)
        state = backend.inspect(key)
        assert state.held and state.limit == 3 and len(state.holders) == 3
        fences = [holder.fence for holder in state.holders]
        assert all(fence is not None for fence in fences) and fences == sorted(set(fences))  # type: ignore[type-var]
        assert state.fence == fences[-1]
        assert all(holder.owner == self.owner for holder in state.holders)
        assert all(holder.expires_in is not None and 0 < holder.expires_in <= ttl + 1 for holder in state.holders)

    def test_counting_fences_rise_with_every_grant(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "counting", key)
        ttl = self.long_ttl(backend)
        exclusive = self.token(backend)
        first = backend.acquire_fenced(key, exclusive, ttl, self.owner) if backend.capabilities.fencing else 0
        assert first is not None and backend.release(key, exclusive)
        fences = []
        for _ in range(3):
            token = self.token(backend)
            fence = backend.acquire_counted(key, token, ttl, self.owner, 2)
            assert fence is not None
            fences.append(fence)
            assert backend.release(key, token)
        assert fences == sorted(set(fences)) and fences[0] > first
        if backend.capabilities.fencing:
            again = backend.acquire_fenced(key, exclusive, ttl, self.owner)
            assert again is not None and again > fences[-1]

    def test_counting_renewal_keeps_the_place_and_its_fence(self, backend: Backend, key: str) -> None:
        first, second = self.places(backend, key, 2, 2)
        ttl = self.long_ttl(backend)
        fences = {holder.fence for holder in backend.inspect(key).holders}
        assert backend.acquire_counted(key, first, ttl / 2, self.owner, 2) in fences
        assert backend.extend(key, second, ttl / 2) is True
        assert backend.extend(key, self.token(backend), ttl) is False
        assert backend.extend_many(
            [ExtendRequest(key, first, ttl), ExtendRequest(key, self.token(backend), ttl)]
        ) == [True, False]
        state = backend.inspect(key)
        assert {holder.fence for holder in state.holders} == fences and len(state.holders) == 2

    def test_counting_release_frees_one_place(self, backend: Backend, key: str) -> None:
        first, second = self.places(backend, key, 2, 2)
        ttl = self.long_ttl(backend)
        assert backend.release(key, self.token(backend)) is False
        assert backend.release(key, first) is True
        assert backend.release(key, first) is False
        assert not backend.is_held(key, first) and backend.is_held(key, second)
        newcomer = self.token(backend)
        assert backend.acquire_counted(key, newcomer, ttl, self.owner, 2) is not None
        assert backend.acquire_counted(key, self.token(backend), ttl, self.owner, 2) is None
        assert backend.release(key, second) and backend.release(key, newcomer)
        assert not backend.inspect(key).held

    def test_counting_places_expire_one_by_one(self, backend: Backend, key: str) -> None:
        ttl = self.short_ttl(backend)
        (short,) = self.places(backend, key, 2, 1, ttl)
        (long,) = self.places(backend, key, 2, 1)
        assert wait_until(lambda: not backend.is_held(key, short), ttl + self.expiry_grace + 10)
        assert backend.is_held(key, long)
        assert backend.acquire_counted(key, self.token(backend), self.long_ttl(backend), self.owner, 2) is not None
        assert len(backend.inspect(key).holders) == 2

    def test_counting_limit_mismatch_is_refused_and_writes_nothing(self, backend: Backend, key: str) -> None:
        self.places(backend, key, 2, 1)
        before = backend.inspect(key)
        ttl = self.long_ttl(backend)
        with pytest.raises(ValidationError, match=r"limit=3.*limit=2"):
            backend.acquire_counted(key, self.token(backend), ttl, self.owner, 3)
        # An exclusive grant finds the key held; the Locker tells why.
        assert self.grant(backend, key, self.token(backend), ttl) is False
        with Locker(backend) as locker, pytest.raises(ValidationError, match=r"limit=1.*limit=2"):
            locker.try_acquire(key)
        after = backend.inspect(key)
        assert (after.limit, [holder.fence for holder in after.holders]) == (
            before.limit, [holder.fence for holder in before.holders]
        )
        # And a counting acquire on an exclusive holder's key.
        exclusive_key = f"{key}:exclusive"
        holder = self.token(backend)
        assert self.grant(backend, exclusive_key, holder, ttl)
        with pytest.raises(ValidationError, match=r"limit=2.*limit=1"):
            backend.acquire_counted(exclusive_key, self.token(backend), ttl, self.owner, 2)
        state = backend.inspect(exclusive_key)
        assert state.held and state.limit == 1 and len(state.holders) == 1 and backend.is_held(exclusive_key, holder)

    def test_counting_force_release_drops_every_place(self, backend: Backend, key: str) -> None:
        tokens = self.places(backend, key, 3, 2)
        fences = [holder.fence or 0 for holder in backend.inspect(key).holders]
        assert backend.force_release(key) is True
        assert not backend.inspect(key).held
        assert not any(backend.is_held(key, token) for token in tokens)
        fence = backend.acquire_counted(key, self.token(backend), self.long_ttl(backend), self.owner, 3)
        assert fence is not None and fence > max(fences)

    def test_counting_scan_lists_the_key_once(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "scan", key)
        self.places(backend, key + ":counted", 3, 2)
        listed = [state for state in backend.scan(key + ":") if state.key == key + ":counted"]
        assert len(listed) == 1 and listed[0].limit == 3 and len(listed[0].holders) == 2

    def test_counting_release_lets_one_waiter_in(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "counting", key)
        ttl = self.long_ttl(backend)
        refused = threading.Semaphore(0)

        def on_event(event: LockEvent) -> None:
            if event.type == "contended" and event.attempt == 1:
                refused.release()

        with Locker(backend, ttl=ttl, limit=2, on_event=on_event) as locker:
            first, second = locker.acquire(key), locker.acquire(key)
            got: list[int] = []
            entered = threading.Semaphore(0)
            stop = threading.Event()

            def waiter() -> None:
                try:
                    lock = locker.acquire(key, timeout=ttl, cancel=stop)
                except Exception:  # noqa: BLE001 - the waiter left unserved ends with an error
                    return
                got.append(lock.fence or 0)
                entered.release()
                stop.wait(ttl)
                lock.release()

            waiters = [threading.Thread(target=waiter) for _ in range(2)]
            for thread in waiters:
                thread.start()
            # Both waiters have found the key full before a place frees.
            assert refused.acquire(timeout=30) and refused.acquire(timeout=30)
            first.release()
            # Woken by the release, long before any lease could run out.
            assert entered.acquire(timeout=ttl / 2)
            assert len(got) == 1 and got[0] > max(first.fence or 0, second.fence or 0)
            assert not entered.acquire(timeout=1.0), "one release let two waiters in"
            stop.set()
            for thread in waiters:
                thread.join(60)
            second.release()

    def test_counting_heartbeat_keeps_every_place(self, backend: Backend, key: str) -> None:
        self.skip_without(backend, "counting", key)
        ttl = max(3.0, backend.capabilities.min_ttl)
        # One Locker per place, so that each place's extensions are counted apart.
        extended = [threading.Semaphore(0), threading.Semaphore(0)]

        def counter(place: int) -> Callable[[LockEvent], None]:
            return lambda event: extended[place].release() if event.type == "extended" else None

        with Locker(backend, ttl=ttl, limit=2, on_event=counter(0)) as one, Locker(
            backend, ttl=ttl, limit=2, on_event=counter(1)
        ) as other, one.lock(key) as first, other.lock(key) as second:
            # Two extensions of each place: each lives past its first lease on its own extensions.
            for place in extended:
                assert place.acquire(timeout=ttl * 10) and place.acquire(timeout=ttl * 10)
            assert first.state == "held" and second.state == "held"
            assert backend.is_held(key, first.token) and backend.is_held(key, second.token)
            assert first.limit == 2 and first.fence != second.fence
        assert not backend.inspect(key).held

    # -- the waiting line (optional) -------------------------------------------------------------

    def joined(self, backend: Backend, key: str, token: str) -> WaitingLine:
        """A waiting line of ``backend`` for ``token`` (a long lease, fenced when the backend
        fences). A backend whose ``join_line`` offers none announces nothing: its waiters sleep
        out their retry pause, and the line tests are skipped, naming that."""
        line = backend.join_line(
            key, token, self.long_ttl(backend), self.owner, backend.capabilities.fencing, time.monotonic
        )
        if line is None:
            pytest.skip(f"{type(backend).__name__} offers no waiting line (join_line answers None)")
        return line

    def held_by_another(self, backend: Backend, key: str) -> str:
        """Grant ``key`` to a fresh token for a long lease; the token."""
        holder = self.token(backend)
        assert self.grant(backend, key, holder, self.long_ttl(backend))
        return holder

    def test_line_ask_takes_a_free_key(self, backend: Backend, key: str) -> None:
        token = self.token(backend)
        line = self.joined(backend, key, token)
        try:
            assert line.ask() is not None
            assert backend.is_held(key, token)
        finally:
            line.leave(True)
        assert backend.is_held(key, token)
        assert backend.release(key, token)

    def test_line_release_reaches_a_waiter_in_line(self, backend: Backend, key: str) -> None:
        holder = self.held_by_another(backend, key)
        waiter = self.token(backend)
        line = self.joined(backend, key, waiter)
        granted = False
        try:
            assert line.ask() is None
            grants: list[Optional[LineGrant]] = []
            thread = threading.Thread(target=lambda: grants.append(line.wait(60)))
            thread.start()
            assert backend.release(key, holder)
            thread.join(90)
            assert not thread.is_alive()
            (grant,) = grants
            assert grant is not None, "the release never reached the waiter in line"
            granted = True
            if backend.capabilities.fencing:
                assert grant.fence == backend.inspect(key).fence
            assert backend.is_held(key, waiter)
        finally:
            line.leave(granted)
        assert backend.release(key, waiter)

    def test_line_wait_ends_empty_while_the_key_stays_held(self, backend: Backend, key: str) -> None:
        holder = self.held_by_another(backend, key)
        line = self.joined(backend, key, self.token(backend))
        try:
            assert line.ask() is None
            assert line.wait(0.3) is None
        finally:
            line.leave(False)
        assert backend.is_held(key, holder)
        assert backend.release(key, holder)

    def test_a_waiter_that_leaves_gives_nothing_away(self, backend: Backend, key: str) -> None:
        holder = self.held_by_another(backend, key)
        line = self.joined(backend, key, self.token(backend))
        assert line.ask() is None
        line.leave(False)
        # Its holder keeps the key, and once released the key goes to whoever asks next, not
        # to the waiter that left.
        assert backend.is_held(key, holder)
        assert backend.release(key, holder)
        after = self.token(backend)
        assert wait_until(lambda: self.grant(backend, key, after, self.long_ttl(backend)), 30)
        assert backend.release(key, after)

    def test_a_grant_the_waiter_leaves_unused_goes_back(self, backend: Backend, key: str) -> None:
        holder = self.held_by_another(backend, key)
        waiter = self.token(backend)
        line = self.joined(backend, key, waiter)
        try:
            assert line.ask() is None
            assert backend.release(key, holder)
            assert line.wait(60) is not None
        finally:
            line.leave(False)
        assert not backend.is_held(key, waiter)
        after = self.token(backend)
        assert wait_until(lambda: self.grant(backend, key, after, self.long_ttl(backend)), 30)
        assert backend.release(key, after)

    # -- adopting a claim ----------------------------------------------------------------------

    def adopts(self, backend: Backend, key: str) -> bool:
        """``True`` for a backend that implements :meth:`~lease_lock.backends.base.Backend.adopt`,
        whose adoption tests then run. ``False``, after checking that it says so, for one that
        keeps the base class's refusal: ``adopt`` raises ``NotImplementedError`` naming the
        backend and leaves the key alone (a read-then-write stand-in would be unsafe)."""
        if type(backend).adopt is not Backend.adopt:
            return True
        claim = self.token(backend)
        assert self.grant(backend, key, claim, self.long_ttl(backend))
        with pytest.raises(NotImplementedError, match=type(backend).__name__):
            backend.adopt(key, claim, self.token(backend), self.long_ttl(backend), self.owner)
        assert backend.is_held(key, claim)
        return False

    def claimed(self, backend: Backend, key: str) -> tuple[str, Optional[int]]:
        """A claim on ``key`` (a grant to a fresh token, fenced when the backend fences): its
        token and fence."""
        claim = self.token(backend)
        assert self.grant(backend, key, claim, self.long_ttl(backend))
        return claim, backend.inspect(key).fence

    def test_adopt_replaces_the_claim_with_a_new_grant(self, backend: Backend, key: str) -> None:
        if not self.adopts(backend, key):
            return
        claim, claim_fence = self.claimed(backend, key)
        run = self.token(backend)
        fence = backend.adopt(key, claim, run, self.long_ttl(backend), "adopter:1")
        assert fence is not None
        assert backend.is_held(key, run) and not backend.is_held(key, claim)
        state = backend.inspect(key)
        assert state.held and state.owner == "adopter:1"
        if backend.capabilities.fencing:
            assert claim_fence is not None and fence > claim_fence and state.fence == fence
        # The claim's token is no longer a holder: it can neither release nor extend the key.
        assert not backend.release(key, claim)
        assert not backend.extend(key, claim, self.long_ttl(backend))
        assert backend.is_held(key, run)

    def test_a_claim_is_adopted_once(self, backend: Backend, key: str) -> None:
        if not self.adopts(backend, key):
            return
        claim, _ = self.claimed(backend, key)
        first, second = self.token(backend), self.token(backend)
        fence = backend.adopt(key, claim, first, self.long_ttl(backend), "first:1")
        assert fence is not None
        assert backend.adopt(key, claim, second, self.long_ttl(backend), "second:1") is None
        state = backend.inspect(key)
        assert backend.is_held(key, first) and not backend.is_held(key, second)
        assert state.owner == "first:1"
        if backend.capabilities.fencing:
            assert state.fence == fence

    def test_racing_adoptions_of_one_claim_grant_once(self, backend: Backend, key: str) -> None:
        if not self.adopts(backend, key):
            return
        claim, _ = self.claimed(backend, key)
        tokens = [self.token(backend) for _ in range(8)]
        answers: dict[str, Optional[int]] = {}
        start = threading.Barrier(len(tokens))

        def adopt(token: str) -> None:
            start.wait()
            answers[token] = backend.adopt(key, claim, token, self.long_ttl(backend), self.owner)

        threads = [threading.Thread(target=adopt, args=(token,)) for token in tokens]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == len(tokens)
        winners = [token for token, fence in answers.items() if fence is not None]
        assert len(winners) == 1
        assert backend.is_held(key, winners[0])

    def test_adopt_of_a_free_key_grants_it(self, backend: Backend, key: str) -> None:
        if not self.adopts(backend, key):
            return
        run = self.token(backend)
        assert backend.adopt(key, self.token(backend), run, self.long_ttl(backend), self.owner) is not None
        assert backend.is_held(key, run)

    def test_adopt_repeated_by_its_token_keeps_the_grant(self, backend: Backend, key: str) -> None:
        # A call whose answer was lost is sent again by the same token: it must not lose the key.
        if not self.adopts(backend, key):
            return
        claim, _ = self.claimed(backend, key)
        run = self.token(backend)
        fence = backend.adopt(key, claim, run, self.long_ttl(backend), self.owner)
        again = backend.adopt(key, claim, run, self.long_ttl(backend), self.owner)
        assert fence is not None and again == fence
        assert backend.is_held(key, run)

    def test_adopt_leaves_another_holder_alone(self, backend: Backend, key: str) -> None:
        if not self.adopts(backend, key):
            return
        holder = self.token(backend)
        assert self.grant(backend, key, holder, self.long_ttl(backend))
        before = backend.inspect(key)
        run = self.token(backend)
        assert backend.adopt(key, self.token(backend), run, self.long_ttl(backend), "adopter:1") is None
        after = backend.inspect(key)
        assert backend.is_held(key, holder) and not backend.is_held(key, run)
        assert (after.owner, after.fence) == (before.owner, before.fence)

    def test_adopt_after_the_adopter_lapsed_takes_the_key(self, backend: Backend, key: str) -> None:
        # A run that adopted the claim and died: once its lease ran out, a second delivery of
        # the same job adopts again, as a new grant with a larger fence.
        if not self.adopts(backend, key):
            return
        claim, _ = self.claimed(backend, key)
        short = self.short_ttl(backend)
        crashed = backend.adopt(key, claim, self.token(backend), short, self.owner)
        assert crashed is not None
        assert self.wait_for_expiry(backend, key, short)
        redelivery = self.token(backend)
        fences: list[int] = []

        def adopt() -> bool:
            fence = backend.adopt(key, claim, redelivery, self.long_ttl(backend), self.owner)
            if fence is not None:
                fences.append(fence)
            return fence is not None

        assert wait_until(adopt, self.expiry_grace + 10)
        assert backend.is_held(key, redelivery)
        if backend.capabilities.fencing:
            assert fences[0] > crashed


class ServiceStoreContract:
    """The shared counters of a :class:`~lease_lock.backends.service.ServiceStore`, as tests.

    Subclasses supply a ``backend`` fixture yielding a fresh store (the same fixture
    :class:`BackendContract` uses, so one class can run both).
    """

    @pytest.fixture
    def backend(self) -> Iterator[ServiceStore]:
        """Override in the subclass: yield the store under test."""
        raise NotImplementedError("subclass ServiceStoreContract and define a 'backend' fixture")

    @pytest.fixture
    def counter(self) -> str:
        """A counter name no other test uses."""
        return f"contract-counter:{uuid.uuid4().hex}"

    def test_is_a_service_store(self, backend: ServiceStore) -> None:
        assert isinstance(backend, ServiceStore)

    def test_counts_one_by_default(self, backend: ServiceStore, counter: str) -> None:
        first, left = backend.count_in_window(counter, 3600)
        assert first == 1
        assert 0 < left <= 3600
        assert backend.count_in_window(counter, 3600)[0] == 2
        assert backend.count_in_window(f"{counter}:other", 3600)[0] == 1

    def test_amount_is_added_at_once(self, backend: ServiceStore, counter: str) -> None:
        assert backend.count_in_window(counter, 3600, 5)[0] == 5
        assert backend.count_in_window(counter, 3600)[0] == 6
        assert backend.count_in_window(counter, 3600, amount=10)[0] == 16

    @pytest.mark.parametrize("amount", [0, -1, True, 1.5, "2"])
    def test_amount_must_be_a_positive_int(self, backend: ServiceStore, counter: str, amount: object) -> None:
        with pytest.raises(ValidationError, match="amount"):
            backend.count_in_window(counter, 3600, amount)  # type: ignore[arg-type]
        assert backend.count_in_window(counter, 3600)[0] == 1

    def test_a_new_window_starts_at_zero(self, backend: ServiceStore, counter: str) -> None:
        assert backend.count_in_window(counter, 1.0, 3)[0] >= 3
        # Some call lands first in a later window and sees only its own amount.
        assert wait_until(lambda: backend.count_in_window(counter, 1.0)[0] == 1, 30, 0.3)

    def test_grant_if_free_grants_a_free_key(self, backend: ServiceStore, counter: str) -> None:
        token = backend.new_token()
        fence = backend.grant_if_free(counter, token, 60, "contract-owner")
        assert isinstance(fence, int) and 0 < fence < 2**53
        assert backend.is_held(counter, token)
        state = backend.inspect(counter)
        assert state.fence == fence and state.owner == "contract-owner"
        assert backend.release(counter, token)
        later = backend.grant_if_free(counter, backend.new_token(), 60, "contract-owner")
        assert isinstance(later, int) and later > fence

    def test_grant_if_free_answers_a_held_key_with_its_state(self, backend: ServiceStore, counter: str) -> None:
        token = backend.new_token()
        fence = backend.acquire_fenced(counter, token, 60, "first")
        for asker in (backend.new_token(), token):  # the holder's own token is not granted either
            answer = backend.grant_if_free(counter, asker, 30, "second")
            assert isinstance(answer, LockState)
            assert answer.held and answer.fence == fence and answer.owner == "first"
            assert answer.expires_in is not None and 30 < answer.expires_in <= 60
        assert backend.inspect(counter).owner == "first"

    def test_concurrent_grants_if_free_grant_once(self, backend: ServiceStore, counter: str) -> None:
        answers: list[object] = []
        lock = threading.Lock()

        def grant() -> None:
            answer = backend.grant_if_free(counter, backend.new_token(), 60, "racer")
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=grant) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == 8
        assert sum(isinstance(answer, int) for answer in answers) == 1

    def test_concurrent_counts_are_atomic(self, backend: ServiceStore, counter: str) -> None:
        seen: list[int] = []
        lock = threading.Lock()

        def count() -> None:
            for _ in range(25):
                value = backend.count_in_window(counter, 3600)[0]
                with lock:
                    seen.append(value)

        threads = [threading.Thread(target=count) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(seen) == list(range(1, 101))
