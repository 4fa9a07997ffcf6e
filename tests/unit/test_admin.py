"""The listing and clearing code shared by ``lease-lock`` and ``manage.py locks``, on the
memory backend (the real stores are in tests/integration/test_cli_admin.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from lease_lock import Locker
from lease_lock.admin import (
    describe_holder,
    describe_lost_reason,
    held_for,
    held_locks,
    locks_json,
    locks_table,
    release_keys,
    release_prefix,
)
from lease_lock.backends.base import LockState
from lease_lock.backends.memory import MemoryBackend
from lease_lock.errors import ValidationError


@pytest.fixture
def locker() -> Iterator[Locker]:
    with Locker(MemoryBackend(), key_prefix="app:", owner="web-1:42 job") as made:
        yield made


def test_table_is_sorted_aligned_with_dashes_for_the_unknown(locker: Locker) -> None:
    held = [locker.acquire(key, ttl=90) for key in ("b-long-key-name", "a", "c")]
    with Locker(locker.backend, owner="other-host:7 x") as other:
        outside = other.acquire("app-outside")
        states = held_locks(locker)
        assert outside.state == "held"
    assert all(lock.state == "held" for lock in held)
    assert [state.key for state in states] == ["a", "b-long-key-name", "c"]
    lines = locks_table(states).splitlines()
    owner_column = lines[0].index("OWNER")
    assert owner_column == len("b-long-key-name") + 2
    for line in lines[1:]:
        assert line[owner_column:].startswith("web-1:42 job")
        # No fencing on this locker's grants, and no store knows when a holder first took a key.
        assert line.split()[3:5] == ["-", "-"]
        assert line.split()[5] in ("1m29s", "1m30s")
    first = json.loads(locks_json(states))[0]
    assert set(first) == {"key", "held", "expires_at", "expires_in", "fence", "owner", "limit", "holders"}
    assert (first["limit"], len(first["holders"])) == (1, 1)
    assert (first["key"], first["held"], first["fence"], first["owner"]) == ("a", True, None, "web-1:42 job")


def test_durations_read_as_people_write_them() -> None:
    def ends(seconds: float) -> str:
        return describe_holder(LockState("k", True, owner="o", expires_in=seconds)).rsplit(" ", 1)[1]

    assert [ends(s) for s in (4.64, 12.9, 303, 7500)] == ["4.6s", "12s", "5m03s", "2h05m"]
    assert describe_holder(LockState.free("k")) == ""
    assert describe_holder(LockState("k", True)) == "held"


def test_lost_reasons_in_plain_words() -> None:
    assert describe_lost_reason("observed") == "the key was force-released or taken by another holder"
    assert describe_lost_reason("extend") == describe_lost_reason("release") == describe_lost_reason("observed")
    assert describe_lost_reason("max-hold").startswith("it was held for the longest time")
    assert describe_lost_reason("something-new") == "something-new"


def test_release_asks_once_and_a_no_drops_nothing(locker: Locker) -> None:
    # Kept: a lock dropped while held is given back by the library.
    kept = [locker.acquire(key) for key in ("job:1", "job:2", "jobs")]
    written: list[str] = []
    questions: list[str] = []

    def say_no(question: str) -> bool:
        questions.append(question)
        return False

    assert release_prefix(locker, "job:", confirm=say_no, write=written.append) is None
    assert questions == ["force-release these 2 key(s)?"]
    assert len(held_locks(locker)) == 3
    assert release_prefix(locker, "job:", confirm=lambda question: True, write=written.append) == 2
    assert written[-1] == "released 2 key(s) under 'job:'"
    assert [state.key for state in held_locks(locker)] == ["jobs"]
    assert kept[2].state == "held"
    assert release_keys(locker, ["jobs", "nope"], confirm=None, write=written.append) == 1
    assert written[-2:] == ["jobs: released", "nope: free, nothing to release"]
    with pytest.raises(ValidationError, match="must not be empty"):
        release_prefix(locker, "", confirm=None, write=written.append)


def test_held_for_reads_the_grant_time_from_the_fence() -> None:
    with Locker(MemoryBackend(), fencing=True) as fenced, Locker(fenced.backend) as plain:
        # Kept: a held lock that is dropped is given back by the heartbeat.
        kept = [fenced.acquire("fenced", ttl=60), plain.acquire("plain", ttl=60)]
        states = {state.key: state for state in held_locks(fenced)}
        # A store "now" two minutes after the grant: the expiry minus the lease left.
        granted = states["fenced"]
        later = LockState(
            key="fenced", held=True, fence=granted.fence, owner=None,
            expires_at=granted.expires_at, expires_in=(granted.expires_in or 0) - 120,
        )
        assert all(lock.is_held() for lock in kept)
    assert held_for(later) == pytest.approx(120, abs=1)
    row = {line.split()[0]: line.split() for line in locks_table([later, states["plain"]]).splitlines()[1:]}
    assert row["fenced"][3] == "2m00s" or row["fenced"][3] == "2m01s"
    assert row["plain"][3] == "-"  # no fence, nothing dates the grant
    # A counter (another service's fences) dates nothing.
    assert held_for(LockState(key="k", held=True, fence=42, expires_in=5.0)) is None


CONTROL_KEYS = ["two\nlines", "back\rover", "colour\x1b[31mred", "tab\there", "slash\\n"]


def test_keys_and_owners_with_control_characters_are_one_escaped_line_each(locker: Locker) -> None:
    # Lockers refuse such owner labels; another client of the store may write anything.
    for key in CONTROL_KEYS:
        assert locker.backend.acquire(f"app:{key}", "t" * 32, 90.0, "evil\x1b]0;title\x07\nowner")
    states = held_locks(locker)
    lines = locks_table(states).splitlines()
    assert len(lines) == 1 + len(CONTROL_KEYS)
    assert all(line.isprintable() for line in lines)
    assert [line.split()[0] for line in lines[1:]] == [repr(key)[1:-1] for key in sorted(CONTROL_KEYS)]
    assert "evil\\x1b]0;title\\x07\\nowner" in lines[1]
    assert "\\x1b" in describe_holder(states[0]) and describe_holder(states[0]).isprintable()
    # JSON keeps every key exact.
    assert [item["key"] for item in json.loads(locks_json(states))] == sorted(CONTROL_KEYS)
    written: list[str] = []
    assert release_keys(locker, CONTROL_KEYS, confirm=None, write=written.append) == len(CONTROL_KEYS)
    assert all(line.isprintable() for text in written for line in text.splitlines())
    assert sum(len(text.splitlines()) for text in written) == 1 + 2 * len(CONTROL_KEYS)


def test_a_counting_key_is_one_row_telling_its_places_and_every_holder_in_json() -> None:
    with Locker(MemoryBackend(), fencing=True, owner="web-1:42 job") as locker:
        first = locker.acquire("jobs", ttl=60, limit=3)
        second = locker.acquire("jobs", ttl=90, limit=3)
        solo = locker.acquire("solo", ttl=60)
        states = held_locks(locker)
        assert all(lock.is_held() for lock in (first, second, solo))
    jobs, alone = states
    assert (jobs.key, jobs.limit, len(jobs.holders)) == ("jobs", 3, 2)
    header, *rows = locks_table(states).splitlines()
    assert header.split()[:3] == ["KEY", "HOLDERS", "OWNER"]
    assert [row.split()[:2] for row in rows] == [["jobs", "2/3"], ["solo", "1/1"]]
    # The other columns of a counting key are its latest grant's.
    assert rows[0].split()[4] == str(second.fence)
    assert describe_holder(jobs).startswith("2/3 held, latest by web-1:42 job, leases renewed by their holders; ")
    assert describe_holder(jobs).endswith(" first current lease ends in 59s") or describe_holder(jobs).endswith(
        " first current lease ends in 1m00s"
    )
    listed = json.loads(locks_json(states))
    assert listed[0]["limit"] == 3
    assert [holder["fence"] for holder in listed[0]["holders"]] == [first.fence, second.fence]
    assert set(listed[0]["holders"][0]) == {"owner", "fence", "expires_at", "expires_in"}
    assert listed[1]["holders"] == [
        {name: listed[1][name] for name in ("owner", "fence", "expires_at", "expires_in")}
    ]
    # A listing without a counting key keeps its columns.
    assert locks_table([alone]).splitlines()[0].split()[:2] == ["KEY", "OWNER"]
