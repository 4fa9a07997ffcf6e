"""Bad input: every public call raises ValidationError naming the argument, before
anything reaches the backend."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Callable, Iterator

import pytest
from lease_lock import Locker, Retry, ValidationError, connect, exponential_backoff
from lease_lock.options import LockOptions

from .fakes import FakeClock, RecordingBackend, SilentBackend

LONG_KEY = "k" * 1025
Call = Callable[[Locker], Any]


@pytest.fixture
def quiet(backend: RecordingBackend) -> Iterator[RecordingBackend]:
    """The recording backend, its store checked empty after the test."""
    yield backend
    assert backend.calls == [], "a call with bad input reached the backend"
    assert list(backend.scan("")) == []


BAD_CALLS: list[tuple[str, Call, str]] = [
    ("lock key type", lambda locker: locker.lock(5), "key"),
    ("lock key empty", lambda locker: locker.lock(""), "key"),
    ("lock key NUL", lambda locker: locker.lock("a\x00b"), "key"),
    ("lock key too long", lambda locker: locker.lock(LONG_KEY), "key"),
    ("lock key surrogate", lambda locker: locker.lock("\ud800"), "key"),
    ("lock ttl zero", lambda locker: locker.lock("k", 0), "ttl"),
    ("lock ttl negative", lambda locker: locker.lock("k", -1), "ttl"),
    ("lock ttl nan", lambda locker: locker.lock("k", math.nan), "ttl"),
    ("lock ttl inf", lambda locker: locker.lock("k", math.inf), "ttl"),
    ("lock ttl str", lambda locker: locker.lock("k", "30"), "ttl"),
    ("lock ttl bool", lambda locker: locker.lock("k", True), "ttl"),
    ("retry type", lambda locker: locker.lock("k", retry={"retries": 1}), "retry"),
    ("timeout negative", lambda locker: locker.lock("k", timeout=-2), "timeout"),
    ("timeout str", lambda locker: locker.lock("k", timeout="1"), "timeout"),
    ("blocking int", lambda locker: locker.lock("k", blocking=1), "blocking"),
    ("cancel type", lambda locker: locker.lock("k", cancel=True), "cancel"),
    ("auto_extend type", lambda locker: locker.lock("k", auto_extend="yes"), "auto_extend"),
    ("max_hold zero", lambda locker: locker.lock("k", max_hold=0), "max_hold"),
    ("extend_interval zero", lambda locker: locker.lock("k", extend_interval=0), "extend_interval"),
    ("extend_interval over half", lambda locker: locker.lock("k", 10, extend_interval=6), "extend_interval"),
    ("token short", lambda locker: locker.lock("k", token="s" * 5), "token"),
    ("token chars", lambda locker: locker.lock("k", token="x" * 20 + " "), "token"),
    ("token type", lambda locker: locker.lock("k", token=12345678901234567890), "token"),
    ("request_id empty", lambda locker: locker.lock("k", request_id=""), "request_id"),
    ("acquire key", lambda locker: locker.acquire(""), "key"),
    ("acquire ttl", lambda locker: locker.acquire("k", ttl=-5), "ttl"),
    ("try_acquire key", lambda locker: locker.try_acquire(None), "key"),
    ("locked skip", lambda locker: locker.locked("k", skip="yes"), "skip"),
    ("locked key", lambda locker: locker.locked(""), "key"),
    ("locked ttl", lambda locker: locker.locked("k", ttl=0), "ttl"),
    ("locked interval", lambda locker: locker.locked("k", extend_interval=20), "extend_interval"),
    ("locked callable key result", lambda locker: locker.locked(lambda: "")(lambda: None)(), "key"),
    ("acquire_many str", lambda locker: locker.acquire_many("abc"), "keys"),
    ("acquire_many empty", lambda locker: locker.acquire_many([]), "keys"),
    ("acquire_many item", lambda locker: locker.acquire_many(["a", ""]), "keys"),
    ("acquire_many mixed types", lambda locker: locker.acquire_many(["a", 1]), "keys"),
    ("acquire_many unhashable", lambda locker: locker.acquire_many(["a", ["b"]]), "keys"),
    ("acquire_many not iterable", lambda locker: locker.acquire_many(5), "keys"),
    ("acquire_many token", lambda locker: locker.acquire_many(["a"], token="t" * 20), "token"),
    ("acquire_many ttl", lambda locker: locker.acquire_many(["a"], ttl=0), "ttl"),
    ("get key", lambda locker: locker.get(""), "key"),
    ("list prefix", lambda locker: locker.list(5), "prefix"),
    ("force_release key", lambda locker: locker.force_release(b"k"), "key"),
]


@pytest.mark.parametrize(("call", "argument"), [case[1:] for case in BAD_CALLS], ids=[case[0] for case in BAD_CALLS])
def test_bad_locker_call_names_the_argument_and_writes_nothing(
    locker: Locker, quiet: RecordingBackend, call: Call, argument: str
) -> None:
    with pytest.raises(ValidationError, match=argument):
        call(locker)


#: Option names a call does not take: Python's own ``TypeError``, before anything is asked of
#: the store (and a type checker reports them first).
UNKNOWN_OPTIONS: list[tuple[str, Call, str]] = [
    ("lock", lambda locker: locker.lock("k", wait=True), "wait"),
    ("acquire", lambda locker: locker.acquire("k", timout=1), "timout"),
    ("try_acquire retry", lambda locker: locker.try_acquire("k", retry=Retry()), "retry"),
    ("try_acquire timeout", lambda locker: locker.try_acquire("k", timeout=1), "timeout"),
    ("try_acquire blocking", lambda locker: locker.try_acquire("k", blocking=False), "blocking"),
    ("locked", lambda locker: locker.locked("k", retries=3), "retries"),
    ("acquire_many", lambda locker: locker.acquire_many(["a"], ttl_seconds=3), "ttl_seconds"),
]


@pytest.mark.parametrize(
    ("call", "argument"), [case[1:] for case in UNKNOWN_OPTIONS], ids=[case[0] for case in UNKNOWN_OPTIONS]
)
def test_an_unknown_option_is_a_type_error_naming_it_and_writes_nothing(
    locker: Locker, quiet: RecordingBackend, call: Call, argument: str
) -> None:
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{argument}'"):
        call(locker)


def test_key_prefix_counts_towards_the_key_length(quiet: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(quiet, clock=clock, heartbeat_thread=False, key_prefix="p" * 1000)
    with pytest.raises(ValidationError, match="1024"):
        locker.lock("k" * 25)
    locker.lock("k" * 24)
    locker.close()


BAD_SETTINGS: list[tuple[str, dict[str, Any], str]] = [
    ("ttl zero", {"ttl": 0}, "ttl"),
    ("ttl inf", {"ttl": math.inf}, "ttl"),
    ("ttl str", {"ttl": "30s"}, "ttl"),
    ("max_hold negative", {"max_hold": -1}, "max_hold"),
    ("retry type", {"retry": 3}, "retry"),
    ("key_prefix type", {"key_prefix": b"p"}, "key_prefix"),
    ("key_prefix NUL", {"key_prefix": "\x00"}, "key_prefix"),
    ("fencing type", {"fencing": 1}, "fencing"),
    ("owner type", {"owner": 5}, "owner"),
    ("owner unprintable", {"owner": "a\nb"}, "owner"),
    ("on_event", {"on_event": "print"}, "on_event"),
    ("clock", {"clock": 1.0}, "clock"),
    ("token_factory", {"token_factory": "abc"}, "token_factory"),
]


@pytest.mark.parametrize(
    ("settings", "argument"), [case[1:] for case in BAD_SETTINGS], ids=[case[0] for case in BAD_SETTINGS]
)
def test_bad_locker_settings(quiet: RecordingBackend, settings: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValidationError, match=argument):
        Locker(quiet, **settings)


def test_backend_must_be_a_backend() -> None:
    with pytest.raises(ValidationError, match="backend"):
        Locker(object())  # type: ignore[arg-type]


def test_durations_accept_timedelta(quiet: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(
        quiet, clock=clock, heartbeat_thread=False, ttl=timedelta(seconds=12), max_hold=timedelta(minutes=5)
    )
    assert (locker.ttl, locker.max_hold) == (12.0, 300.0)
    assert locker.lock("k", ttl=timedelta(milliseconds=1500)).ttl == 1.5
    locker.close()


def test_bad_token_from_the_factory_is_refused(quiet: RecordingBackend, clock: FakeClock) -> None:
    locker = Locker(quiet, clock=clock, heartbeat_thread=False, token_factory=lambda: "bad token")
    with pytest.raises(ValidationError, match="token_factory"):
        locker.acquire("k")
    locker.close()


def test_bad_lock_method_arguments(locker: Locker, quiet: RecordingBackend) -> None:
    lock = locker.lock("k", ttl=10.0, extend_interval=3.0)
    with pytest.raises(ValidationError, match="blocking"):
        lock.acquire(blocking="no")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="timeout"):
        lock.acquire(timeout=-5)
    with pytest.raises(ValidationError, match="timeout"):
        lock.acquire(timeout=math.nan)
    assert quiet.calls == []


def test_bad_extend_arguments_touch_nothing(locker: Locker, backend: RecordingBackend) -> None:
    lock = locker.acquire("k", ttl=10.0, extend_interval=3.0)
    backend.calls.clear()
    with pytest.raises(ValidationError, match="ttl"):
        lock.extend(0)
    with pytest.raises(ValidationError, match="extend_interval"):
        lock.extend(5.0)
    assert backend.calls == []
    assert lock.ttl == 10.0


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: Retry(retries=-1), "retries"),
        (lambda: Retry(retries=1.5), "retries"),
        (lambda: Retry(retries=True), "retries"),
        (lambda: Retry(retries="3"), "retries"),
        (lambda: Retry(delay=-0.1), "delay"),
        (lambda: Retry(delay="fast"), "delay"),
        (lambda: Retry(timeout=math.nan), "timeout"),
        (lambda: Retry(timeout=-1), "timeout"),
        (lambda: exponential_backoff(base=0), "base"),
        (lambda: exponential_backoff(max=-1), "max"),
    ],
)
def test_bad_retry_policies(make: Callable[[], object], argument: str) -> None:
    with pytest.raises(ValidationError, match=argument):
        make()


def test_retry_accepts_its_documented_values() -> None:
    assert Retry(retries=math.inf, delay=0, timeout=math.inf).timeout == math.inf
    assert Retry(retries=3.0, delay=timedelta(milliseconds=250), timeout=timedelta(seconds=2)).timeout == 2.0


def test_bad_delay_function_result_is_named(clock: FakeClock, sleeps: list[float]) -> None:
    backend = SilentBackend(clock=clock)
    backend.acquire("k", "o" * 32, 60.0, "other")
    locker = Locker(backend, clock=clock, heartbeat_thread=False)
    with pytest.raises(ValidationError, match="delay"):
        locker.acquire("k", retry=Retry(delay=lambda state: -1.0))
    assert sleeps == []
    locker.close()


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: connect(5), "url"),
        (lambda: connect("memory://", bogus=1), "bogus"),
        (lambda: connect("memory://?bogus=1"), "bogus"),
        (lambda: connect("memory://", ttl=0), "ttl"),
        (lambda: connect("memory://", key_prefix=3), "key_prefix"),
        (lambda: connect("nosuchscheme://host"), "nosuchscheme"),
    ],
)
def test_bad_connect_arguments(call: Callable[[], object], argument: str) -> None:
    with pytest.raises(ValidationError, match=argument):
        call()


@pytest.mark.parametrize(
    ("url", "typo", "meant"),
    [
        ("memory://", "tll", "ttl"),
        ("sqlite:///{tmp}/locks.db", "tll", "ttl"),
        ("sqlite:///{tmp}/locks.db", "busy_timout", "busy_timeout"),
        ("redis://127.0.0.1:1/0", "tll", "ttl"),
        ("redis://127.0.0.1:1/0", "socket_timout", "socket_timeout"),
        ("http://127.0.0.1:1", "max_hol", "max_hold"),
    ],
)
def test_a_mistyped_connect_option_is_named_with_its_match_among_every_option(
    url: str, typo: str, meant: str, tmp_path: Any
) -> None:
    with pytest.raises(ValidationError) as caught:
        connect(url.format(tmp=tmp_path), **{typo: 30})
    message = str(caught.value)
    assert f"{typo!r} (did you mean {meant!r}?)" in message
    # Both kinds of option are listed: the Locker's and the backend's.
    assert "Locker options " in message and "ttl" in message and "key_prefix" in message
    assert f"{url.partition(':')[0]} options " in message


@pytest.mark.parametrize(("typo", "meant"), [("ttl_seconds", "ttl"), ("timout", "timeout"), ("tll", "ttl")])
def test_a_mistyped_option_in_a_mapping_is_named_with_its_match(typo: str, meant: str) -> None:
    # Options that arrive as a mapping (the rq and celery decorators' ``**opts``) are checked by
    # name here, with a guess at the one meant.
    with pytest.raises(ValidationError) as caught:
        LockOptions.from_kwargs({typo: 30})
    message = str(caught.value)
    assert f"unknown option {typo!r} (did you mean {meant!r}?)" in message
    known = message.partition("; known: ")[2].split(", ")
    assert "ttl" in known and "cancel" in known and "token" in known


def test_an_option_like_nothing_known_is_named_without_a_guess() -> None:
    with pytest.raises(ValidationError) as caught:
        connect("memory://", zzzz=1)
    assert "'zzzz';" in str(caught.value) and "did you mean" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown", "hidden"),
    [
        ("redis//localhost:6379/1", "'redis//localhost:6379/1'", None),
        ("redis//user:s3cret@localhost:6379/1", "'redis//user:***@localhost:6379/1'", "s3cret"),
        ("redis//user:s3/cr@et@localhost/1", "'redis//user:***@localhost/1'", "s3/cr"),
        ("host=db password=s3cret dbname=x", "'host=db password=*** dbname=x'", "s3cret"),
    ],
)
def test_a_url_without_a_scheme_is_shown_with_its_secrets_masked(url: str, shown: str, hidden: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        connect(url)
    assert f"url {shown} has no scheme" in str(caught.value)
    if hidden:
        assert hidden not in str(caught.value)


@pytest.mark.parametrize("name", ["socket_timeout", "socket_connect_timeout", "timeout"])
def test_a_bad_redis_duration_option_is_named(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        connect(f"redis://127.0.0.1:1/0?{name}=abc")
    assert str(caught.value).startswith(f"{name} must look like"), caught.value
