"""``SingletonTask`` on real Celery workers and a real Redis broker (the tests' private server):
a worker in a thread (threads pool) and a worker subprocess (prefork pool), so the locker is
also exercised in processes forked after it was built. The prefork worker also runs with its
locks on the tests' etcd cluster (``lease_lock_url`` an ``etcd://`` URL).

The module doubles as the worker subprocess's app (``celery -A tests.integration.test_celery``):
the broker, lock URL and queue then come from the environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.app.log import TaskFormatter
from celery.contrib.testing.worker import start_worker
from lease_lock import Backend, Locker, LockState, MemoryBackend, ValidationError
from lease_lock.backends.http import HttpBackend
from lease_lock.contrib.celery import AlreadyQueued, SingletonTask, broker_lock_url, check_settings, task_locker
from lease_lock.server import create_app
from lease_lock.testing import BackendContract

from tests.support.http_server import ThreadedServer, make_keys
from tests.support.polling import wait_until

# Celery's Redis result backend calls redis-py's deprecated setex(); that is Celery's to fix,
# and the warning must not fail the task inside the worker thread.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

WAIT = 30.0
_ENV = "LEASE_LOCK_TEST_CELERY"

app = Celery("lease_lock_celery_tests")
app.conf.update(
    broker_url=os.environ.get(f"{_ENV}_BROKER", "redis://127.0.0.1:1/0"),
    result_backend=os.environ.get(f"{_ENV}_BROKER", "redis://127.0.0.1:1/0"),
    lease_lock_url=None if os.environ.get(f"{_ENV}_NO_URL") else os.environ.get(f"{_ENV}_LOCKS", "memory://"),
    task_default_queue=os.environ.get(f"{_ENV}_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_serializer="json",
    result_serializer="json",
)
#: The locker the worker's main process built before forking its pool (subprocess mode).
_PARENT_LOCKERS: list[Locker] = []


@signals.worker_init.connect
def _build_before_fork(**kwargs: Any) -> None:
    if os.environ.get(f"{_ENV}_PREBUILD"):
        _PARENT_LOCKERS.append(task_locker(app))


def _hold(flags: str, redis_url: str, label: str) -> None:
    """Announce the run, then block until the test pushes a go token."""
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{flags}:started", label)
    if client.blpop([f"{flags}:go"], timeout=WAIT) is None:
        raise RuntimeError("the test never let the task finish")


@app.task(base=SingletonTask, lock_key="report:{0}", bind=True)
def build_report(self: Any, day: str, flags: str, redis_url: str) -> dict[str, Any]:
    """Runs alone per day."""
    _hold(flags, redis_url, self.request.id)
    inherited = any(task_locker(app) is parent for parent in _PARENT_LOCKERS)
    return {"day": day, "pid": os.getpid(), "inherited_locker": inherited, "prebuilt": len(_PARENT_LOCKERS),
            "store": type(task_locker(app).backend).__name__}


@app.task(base=SingletonTask, lock_key=lambda flags, redis_url: f"retrying:{flags}", lock_on_busy="retry",
          lock_ttl=2, bind=True, max_retries=10)
def retrying(self: Any, flags: str, redis_url: str) -> int:
    """Retried (after the holder's remaining lease) while another run holds the key."""
    _hold(flags, redis_url, str(self.request.retries))
    return int(self.request.retries)


@app.task(base=SingletonTask, lock_key="fragile:{key}")
def loses_lock(key: str) -> str:
    """Its lease is force-released while it runs, as if it had run out."""
    assert task_locker(app).force_release(f"fragile:{key}")
    return "finished"


@app.task(base=SingletonTask, lock_key="tolerant:{key}", lock_fail_on_loss=False)
def tolerates_loss(key: str) -> str:
    """Like ``loses_lock`` but keeps its result."""
    assert task_locker(app).force_release(f"tolerant:{key}")
    return "kept"


@app.task(base=SingletonTask, lock_on_enqueue=True, bind=True)
def sync_customer(self: Any, customer_id: int, flags: str, redis_url: str) -> str:
    """Sent at most once per customer while queued or running."""
    _hold(flags, redis_url, f"{customer_id}")
    return str(self.request.id)


@app.task(base=SingletonTask, lock_on_enqueue=True, lock_duplicate="raise", lock_enqueue_ttl=2)
def raising_sync(customer_id: int, flags: str) -> None:
    """A duplicate raises AlreadyQueued; an unrun message frees the key after two seconds."""


@app.task(base=SingletonTask, lock_on_enqueue=True, lock_duplicate="skip")
def skipping_sync(customer_id: int, flags: str) -> None:
    """A duplicate is not sent and answers None."""


@app.task(base=SingletonTask, lock_on_enqueue=True, bind=True, max_retries=1)
def retries_once(self: Any, flags: str) -> int:
    """Asks to be retried once; its key stays claimed while the retry waits."""
    if not self.request.retries:
        raise self.retry(countdown=2)
    return int(self.request.retries)


@app.task(base=SingletonTask, lock_on_enqueue=True, lock_duplicate="existing", bind=True)
def redelivered_existing(self: Any, flags: str, redis_url: str) -> str:
    """Run while the test delivers its message a second time; a duplicate is ignored."""
    _hold(flags, redis_url, str(os.getpid()))
    return str(self.request.id)


@app.task(base=SingletonTask, lock_on_enqueue=True, lock_duplicate="raise", bind=True)
def redelivered_raise(self: Any, flags: str, redis_url: str) -> str:
    """As ``redelivered_existing``; a duplicate fails with AlreadyQueued."""
    _hold(flags, redis_url, str(os.getpid()))
    return str(self.request.id)


@app.task(base=SingletonTask, lock_on_enqueue=True, lock_duplicate="skip", bind=True)
def redelivered_skip(self: Any, flags: str, redis_url: str) -> str:
    """As ``redelivered_existing``; a duplicate returns None."""
    _hold(flags, redis_url, str(os.getpid()))
    return str(self.request.id)


@app.task(base=SingletonTask, lock_on_enqueue=True, lock_ttl=2, bind=True)
def dies(self: Any, flags: str, redis_url: str) -> str:
    """Its first delivery's process is killed by the test while it runs."""
    _hold(flags, redis_url, str(os.getpid()))
    return str(self.request.id)


@app.task(base=SingletonTask, lock_on_enqueue=True, bind=True)
def labelled_late(self: Any, flags: str, redis_url: str) -> str:
    """Delivered while the test holds its key under a label that names the job only later."""
    return str(self.request.id)


_REDELIVERED = {
    task.name for task in (redelivered_existing, redelivered_raise, redelivered_skip, dies, labelled_late)
}


@signals.task_prerun.connect
def _record_delivery(sender: Any = None, args: Any = None, **_: Any) -> None:
    """In the worker: ``labelled_late``'s deliveries announce themselves in ``<flags>:delivered``."""
    if sender is not None and sender.name == labelled_late.name:
        flags, redis_url = args
        redis.Redis.from_url(redis_url).rpush(f"{flags}:delivered", "1")


@signals.task_postrun.connect
def _record_outcome(sender: Any = None, args: Any = None, state: Any = None, retval: Any = None, **_: Any) -> None:
    """In the worker: every delivery of the redelivery tests' tasks, run or not, leaves
    ``<state>:<type of result>`` in ``<flags>:handled``."""
    if sender is not None and sender.name in _REDELIVERED:
        flags, redis_url = args
        redis.Redis.from_url(redis_url).rpush(f"{flags}:handled", f"{state}:{type(retval).__name__}")


@app.task(base=SingletonTask, lock_on_enqueue=True, bind=True, max_retries=1)
def retries_at_once(self: Any, flags: str) -> int:
    """Asks to be retried at once: the retry's delivery may arrive while this run still ends."""
    if not self.request.retries:
        raise self.retry(countdown=0)
    return int(self.request.retries)


@pytest.fixture(scope="module")
def celery_redis(redis_server: Any) -> str:
    """Point the app at the tests' Redis, on a queue of its own."""
    queue = f"ll-celery-{uuid.uuid4().hex[:8]}"
    app.conf.update(
        broker_url=redis_server.url, result_backend=redis_server.url,
        lease_lock_url=redis_server.url, task_default_queue=queue,
    )
    return queue


@pytest.fixture
def thread_worker(celery_redis: str) -> Iterator[None]:
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING"):
        yield


def exactly_one_runs(redis_url: str) -> tuple[list[Any], int]:
    """Send two tasks with the same key at once; return their results and how many started."""
    flags = f"ll-celery-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url)
    results = [build_report.delay("mon", flags, redis_url) for _ in range(2)]
    try:
        # Either the second was skipped while the first held the key, or (a broken lock) both
        # bodies started; both outcomes end the wait, and only the first passes the asserts.
        wait_until(
            lambda: client.llen(f"{flags}:started") >= 2
            or (client.llen(f"{flags}:started") == 1 and any(result.ready() for result in results)),
            "one run to start and the other to be skipped",
        )
    finally:
        client.rpush(f"{flags}:go", "1", "1")
    outcomes = [result.get(timeout=WAIT) for result in results]
    started = int(client.llen(f"{flags}:started"))
    client.delete(f"{flags}:started", f"{flags}:go")
    return outcomes, started


def test_two_tasks_with_one_key_on_a_threads_worker(redis_server: Any, thread_worker: None) -> None:
    outcomes, started = exactly_one_runs(redis_server.url)
    assert started == 1
    assert sorted(outcomes, key=lambda outcome: outcome is None) == [
        {"day": "mon", "pid": os.getpid(), "inherited_locker": False, "prebuilt": 0, "store": "RedisBackend"}, None,
    ]
    assert not task_locker(app).get("report:mon").held


def test_busy_retry_runs_after_the_holder(redis_server: Any, thread_worker: None) -> None:
    flags = f"ll-celery-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_server.url)
    first = retrying.delay(flags, redis_server.url)
    wait_until(lambda: client.llen(f"{flags}:started") == 1, "the first run to start")
    second = retrying.delay(flags, redis_server.url)
    try:
        wait_until(lambda: second.state == "RETRY", "the second run to be retried")
    finally:
        client.rpush(f"{flags}:go", "1", "1")
    assert first.get(timeout=WAIT) == 0
    assert second.get(timeout=WAIT) >= 1
    client.delete(f"{flags}:started", f"{flags}:go")


def test_a_lost_lock_fails_the_task_unless_told_otherwise(thread_worker: None) -> None:
    key = uuid.uuid4().hex
    failed = loses_lock.delay(key)
    failed.get(timeout=WAIT, propagate=False)
    assert failed.state == "FAILURE"
    assert "LockLostError" in (failed.traceback or "")
    assert tolerates_loss.delay(key).get(timeout=WAIT) == "kept"


def test_bad_options_fail_when_the_task_is_defined() -> None:
    def job() -> None:
        """A task body that is never run."""

    with pytest.raises(ValueError, match="lock_on_busy"):
        assert app.task(base=SingletonTask, lock_on_busy="wait", name=f"bad-{uuid.uuid4().hex}", shared=False)(job).name
    with pytest.raises(ValueError, match="lock_ttl"):
        assert app.task(base=SingletonTask, lock_ttl=0, name=f"bad-{uuid.uuid4().hex}", shared=False)(job).name


@pytest.fixture(params=["redis", "etcd"])
def worker_locks(request: pytest.FixtureRequest) -> str:
    """The ``lease_lock_url`` of a worker subprocess: the broker's Redis, or the tests' etcd
    cluster by its ``etcd://`` URL (the broker stays Redis)."""
    return str(request.getfixturevalue("etcd_cluster" if request.param == "etcd" else "redis_server").url)


def test_two_tasks_with_one_key_on_a_prefork_worker_subprocess(
    redis_server: Any, celery_redis: str, worker_locks: str
) -> None:
    environment = {
        **os.environ,
        f"{_ENV}_BROKER": redis_server.url, f"{_ENV}_LOCKS": worker_locks,
        f"{_ENV}_QUEUE": celery_redis, f"{_ENV}_PREBUILD": "1",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.test_celery", "worker", "--pool", "prefork",
         "--concurrency", "2", "-O", "fair", "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle",
         "--without-gossip"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        outcomes, started = exactly_one_runs(redis_server.url)
    finally:
        worker.send_signal(signal.SIGTERM)
        log, _ = worker.communicate(timeout=WAIT)
    assert started == 1, log
    ran = [outcome for outcome in outcomes if outcome is not None]
    assert len(ran) == 1 and outcomes.count(None) == 1, log
    # The pool child built its own locker instead of using the one built before the fork.
    assert ran[0]["pid"] not in (os.getpid(), worker.pid)
    assert ran[0]["prebuilt"] == 1 and ran[0]["inherited_locker"] is False
    assert ran[0]["store"] == ("EtcdBackend" if worker_locks.startswith("etcd://") else "RedisBackend")


def test_the_default_key_is_the_name_plus_the_bound_arguments() -> None:
    assert build_report.lease_lock_key(("mon", "f", "u"), {}) == "report:mon"  # a format-string key
    key = sync_customer.lease_lock_key
    assert key((1, "f", "u"), {}) == key((), {"customer_id": 1, "flags": "f", "redis_url": "u"})
    assert key((1, "f", "u"), {}).startswith(sync_customer.name + ":")
    assert key((1, "f", "u"), {}) != key((2, "f", "u"), {})
    long = key((1, "f" * 500, "u"), {})
    assert long.startswith(sync_customer.name + ":sha256:") and len(long) < 200


@contextlib.contextmanager
def prefork_worker(redis_url: str, queue: str) -> Iterator[None]:
    """A ``celery worker`` subprocess with the prefork pool (two children) on ``queue``."""
    environment = {**os.environ, f"{_ENV}_BROKER": redis_url, f"{_ENV}_LOCKS": redis_url, f"{_ENV}_QUEUE": queue}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.test_celery", "worker", "--pool", "prefork",
         "--concurrency", "2", "-O", "fair", "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle",
         "--without-gossip"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        yield
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=WAIT)


@pytest.fixture(params=["threads", "prefork"])
def any_worker(request: pytest.FixtureRequest, redis_server: Any, celery_redis: str) -> Iterator[None]:
    if request.param == "threads":
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING"):
            yield
    else:
        with prefork_worker(redis_server.url, celery_redis):
            yield


def test_enqueue_once_with_a_real_worker(redis_server: Any, any_worker: None) -> None:
    flags = f"ll-celery-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_server.url)
    first = sync_customer.delay(1, flags, redis_server.url)
    other = sync_customer.delay(2, flags, redis_server.url)
    try:
        # Different arguments run side by side: both bodies start before either may finish.
        wait_until(lambda: client.llen(f"{flags}:started") == 2, "both customers to start")
        duplicates = [sync_customer.delay(1, flags, redis_server.url) for _ in range(19)]
        duplicates.append(sync_customer.apply_async((1,), {"flags": flags, "redis_url": redis_server.url}))
    finally:
        client.rpush(f"{flags}:go", "1", "1")
    assert {duplicate.id for duplicate in duplicates} == {first.id}
    assert first.get(timeout=WAIT) == first.id
    assert other.get(timeout=WAIT) == other.id != first.id
    assert sorted(client.lrange(f"{flags}:started", 0, -1)) == [b"1", b"2"]
    key = sync_customer.lease_lock_key((1, flags, redis_server.url), {})
    wait_until(lambda: not task_locker(app).get(key).held, "the run to give its key back")
    # Once it finished, the same call is sent again under a new id.
    again = sync_customer.delay(1, flags, redis_server.url)
    try:
        assert again.id != first.id
        wait_until(lambda: client.llen(f"{flags}:started") == 3, "the new call to run")
    finally:
        client.rpush(f"{flags}:go", "1")
    assert again.get(timeout=WAIT) == again.id
    client.delete(f"{flags}:started", f"{flags}:go")


def test_a_duplicate_of_a_queued_message_raises_or_skips_and_an_unrun_message_frees_its_key(
    celery_redis: str,
) -> None:
    # No worker consumes this queue: the messages stay queued, and are dropped unrun.
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    flags = uuid.uuid4().hex
    first = raising_sync.apply_async((7, flags), queue=queue)
    with pytest.raises(AlreadyQueued) as raised:
        raising_sync.apply_async((7, flags), queue=queue)
    assert raised.value.task_id == first.id
    assert raising_sync.apply_async((8, flags), queue=queue).id != first.id
    skipped = skipping_sync.apply_async((7, flags), queue=queue)
    assert skipped is not None and skipping_sync.apply_async((7, flags), queue=queue) is None
    app.control.purge()
    key = raising_sync.lease_lock_key((7, flags), {})
    # lock_enqueue_ttl is 2 s: then the key is free for a new message.
    wait_until(lambda: not task_locker(app).get(key).held, "the unrun message's claim to lapse")
    assert raising_sync.apply_async((7, flags), queue=queue).id != first.id
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(queue)


class _Records(logging.Handler):
    """Keeps every record it is handed, in order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


def test_a_skip_is_logged_at_warning_with_key_and_holder(redis_server: Any, thread_worker: None) -> None:
    # Whether Celery's task loggers propagate to the root logger (where caplog listens) changed
    # between releases, so the records are read from a handler of the test's own on that logger:
    # it sees each record exactly once either way.
    task_logger = logging.getLogger("lease_lock.contrib.celery")
    own = _Records()
    # A worker's own format, which already starts each task's line with its name and id.
    own.setFormatter(TaskFormatter(app.conf.worker_task_log_format))
    task_logger.addHandler(own)
    try:
        outcomes, started = exactly_one_runs(redis_server.url)
    finally:
        task_logger.removeHandler(own)
    assert started == 1 and None in outcomes
    skips = [record for record in own.records if "skipped" in record.getMessage()]
    assert len(skips) == 1 and skips[0].levelno == logging.WARNING
    assert "'report:mon'" in skips[0].getMessage() and task_locker(app).owner in skips[0].getMessage()
    (line,) = [line for line in own.lines if "skipped" in line]
    assert line.count(str(skips[0].__dict__["task_id"])) == 1, line
    assert line.count(str(skips[0].__dict__["task_name"])) == 1, line


def test_a_busy_retry_backs_off_instead_of_waiting_a_full_lease() -> None:
    busy = LockState(key="k", held=True, expires_in=30.0, owner="elsewhere")
    assert 0.0 < retrying.retry_countdown(busy) <= retrying.lock_retry_backoff
    assert retrying.retry_countdown(LockState(key="k", held=True, expires_in=0.2)) <= 0.2
    assert retrying.retry_countdown(LockState.free("k")) == 0.0


def test_an_app_with_only_a_redis_broker_locks_in_that_redis(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASE_LOCK_URL", raising=False)
    only_broker = Celery("only-broker", broker=redis_server.url)
    locker = task_locker(only_broker)
    key = f"celery-broker-{uuid.uuid4().hex}"
    with locker.lock(key):
        assert redis.Redis.from_url(redis_server.url).exists(key) == 1
    assert type(locker.backend).__name__ == "RedisBackend"


def test_no_store_anywhere_fails_the_check_naming_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEASE_LOCK_URL", raising=False)
    for broker in ("memory://", "amqp://guest@127.0.0.1:1//"):
        with pytest.raises(ValidationError, match=r"lease_lock_url.*LEASE_LOCK_URL"):
            check_settings(Celery("no-store", broker=broker))
    with pytest.raises(ValidationError, match="table"):
        check_settings(Celery("bad-option", broker="redis://127.0.0.1:1/0", lease_lock_options={"table": "t"}))
    check_settings(Celery("fine", broker="redis://127.0.0.1:1/0"))


def test_a_worker_without_a_store_refuses_to_start() -> None:
    environment = {name: value for name, value in os.environ.items() if name != "LEASE_LOCK_URL"}
    environment.update({f"{_ENV}_BROKER": "memory://", f"{_ENV}_NO_URL": "1"})
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.test_celery", "worker", "--pool", "solo",
         "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle", "--without-gossip"],
        env=environment, capture_output=True, text=True, timeout=WAIT, check=False,
    )
    assert done.returncode != 0
    assert "ValidationError" in done.stderr and "lease_lock_url" in done.stderr, done.stderr


def test_a_claimed_task_that_retries_keeps_its_key_for_the_retry(thread_worker: None) -> None:
    flags = uuid.uuid4().hex
    first = retries_once.delay(flags)
    wait_until(lambda: first.state == "RETRY", "the first run to ask for a retry")
    assert retries_once.delay(flags).id == first.id
    assert first.get(timeout=WAIT) == 1
    key = retries_once.lease_lock_key((flags,), {})
    wait_until(lambda: not task_locker(app).get(key).held, "the retry to give the key back")


def deliver_twice(redis_url: str, queue: str, task: Any, *, same_id: bool) -> tuple[int, list[str]]:
    """Send ``task`` and, once its body runs, publish the same call again without a claim:
    with ``same_id`` the same message (same task id), as a broker delivers it again when a
    visibility timeout passes, an ``acks_late`` worker lost its connection or an ETA message
    is restored; else a message of its own. Returns how many bodies ran at once and how each
    delivery was handled, in order."""
    client = redis.Redis.from_url(redis_url)
    flags = f"ll-celery-{uuid.uuid4().hex}"
    first = task.apply_async((flags, redis_url), queue=queue)
    second_id = first.id if same_id else str(uuid.uuid4())
    try:
        wait_until(lambda: client.llen(f"{flags}:started") == 1, "the first delivery to start")
        app.send_task(task.name, (flags, redis_url), task_id=second_id, queue=queue)
        # Handled as a duplicate, or (the bug) running beside the first: either ends the wait.
        wait_until(
            lambda: client.llen(f"{flags}:handled") == 1 or client.llen(f"{flags}:started") == 2,
            "the second delivery to be handled",
        )
        concurrent = int(client.llen(f"{flags}:started"))
    finally:
        client.rpush(f"{flags}:go", "1", "1")
    wait_until(lambda: client.llen(f"{flags}:handled") == 2, "both deliveries to be handled")
    # The first run's result stands, whatever the duplicate did.
    assert first.get(timeout=WAIT) == first.id
    assert not task_locker(app).get(task.lease_lock_key((flags, redis_url), {})).held
    assert client.llen(f"{flags}:started") == 1
    return concurrent, [item.decode() for item in client.lrange(f"{flags}:handled", 0, -1)]


def test_a_second_delivery_of_a_running_message_does_not_run_beside_it(redis_server: Any, celery_redis: str) -> None:
    queue = f"ll-redeliver-{uuid.uuid4().hex[:8]}"
    url = redis_server.url
    with prefork_worker(url, queue):
        for task in (redelivered_existing, redelivered_raise, redelivered_skip):
            # The same task id: ignored, so that nothing is stored over the running call's state.
            assert deliver_twice(url, queue, task, same_id=True) == (1, ["IGNORED:Ignore", "SUCCESS:str"])
        # Another message with the key: answered per lock_duplicate in its own result.
        assert deliver_twice(url, queue, redelivered_raise, same_id=False) == (
            1, ["FAILURE:AlreadyQueued", "SUCCESS:str"],
        )
        for task in (redelivered_existing, redelivered_skip):
            assert deliver_twice(url, queue, task, same_id=False) == (1, ["SUCCESS:NoneType", "SUCCESS:str"])


def test_a_redelivery_after_its_run_died_takes_the_key(redis_server: Any, celery_redis: str) -> None:
    queue = f"ll-died-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_server.url)
    flags = f"ll-celery-{uuid.uuid4().hex}"
    key = dies.lease_lock_key((flags, redis_server.url), {})
    locker = task_locker(app)
    with prefork_worker(redis_server.url, queue):
        first = dies.apply_async((flags, redis_server.url), queue=queue)
        try:
            wait_until(lambda: client.llen(f"{flags}:started") == 1, "the first delivery to start")
            held = locker.get(key)
            # The run holds the key under a token of its own: the owner label names the job.
            assert held.held and held.owner is not None and held.owner.endswith(f"job={first.id}")
            held_fence = locker.backend.inspect(held.key).fence
            os.kill(int(client.lindex(f"{flags}:started", 0) or 0), signal.SIGKILL)
            # Nothing heartbeats the dead run's lease (lock_ttl=2): the key comes free by itself.
            assert BackendContract().wait_for_expiry(locker.backend, held.key, 2.0)
            app.send_task(dies.name, (flags, redis_server.url), task_id=first.id, queue=queue)
            wait_until(lambda: client.llen(f"{flags}:started") == 2, "the redelivery to run")
            # A new grant: the redelivery's fence is larger than the dead run's.
            before, after = held_fence, locker.backend.inspect(held.key).fence
            assert before is not None and after is not None and after > before
        finally:
            client.rpush(f"{flags}:go", "1", "1")
        # A fresh AsyncResult per look: one that saw the dead run's FAILURE keeps it cached.
        wait_until(lambda: app.AsyncResult(first.id).state == "SUCCESS", "the redelivery's result")
    assert app.AsyncResult(first.id).get(timeout=WAIT) == first.id
    assert client.lrange(f"{flags}:handled", 0, -1) == [b"SUCCESS:str"]


def test_a_second_delivery_meets_its_first_before_the_first_names_its_job(
    redis_server: Any, thread_worker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run that adopted its claim writes the job id into the owner label one step after its
    # grant. A second delivery arriving in between must still see its own first delivery,
    # not another holder, or it would store a result over the running call's.
    url = redis_server.url
    client = redis.Redis.from_url(url)
    flags = f"ll-celery-{uuid.uuid4().hex}"
    locker = task_locker(app)
    key = labelled_late.lease_lock_key((flags, url), {})
    task_id = str(uuid.uuid4())
    looked = threading.Event()
    read = locker.get

    def get(*args: Any, **kwargs: Any) -> LockState:
        state = read(*args, **kwargs)
        looked.set()
        return state

    # The worker runs in this process on the same locker: its reads of the holder can be seen.
    monkeypatch.setattr(locker, "get", get)
    with locker.lock(key, 60) as first_run:  # the first delivery's run, not labelled yet
        app.send_task(labelled_late.name, (flags, url), task_id=task_id)
        wait_until(looked.is_set, "the second delivery to find the key held by an unlabelled run")
        assert locker.backend.acquire(first_run.key, first_run.token, 60, f"{locker.owner} job={task_id}")
        wait_until(lambda: client.llen(f"{flags}:handled") == 1, "the second delivery to be handled")
    assert client.lrange(f"{flags}:handled", 0, -1) == [b"IGNORED:Ignore"]


class CannotAdopt(MemoryBackend):
    """A store that keeps the base class's refusal to adopt a claim."""

    adopt = Backend.adopt


def test_a_store_that_cannot_adopt_is_refused_before_anything_is_claimed() -> None:
    backend = CannotAdopt()
    other = Celery("cannot-adopt", broker="memory://")
    other.conf.lease_lock_locker = Locker(backend)

    def job(customer_id: int) -> None:
        """Never sent."""

    task = other.task(base=SingletonTask, lock_on_enqueue=True, name=f"no-adopt-{uuid.uuid4().hex}", shared=False)(job)
    with pytest.raises(ValidationError, match="CannotAdopt cannot"):
        task.delay(1)
    assert not list(backend.scan(""))
    with pytest.raises(NotImplementedError, match="CannotAdopt"):
        backend.adopt("k", "claim-token-0000", "run-token-00000", 1.0, "o")


def test_a_service_whose_store_cannot_adopt_is_refused_before_anything_is_claimed(tmp_path: Path) -> None:
    # The HTTP client can adopt; the service's store behind it cannot (it answers 501). The
    # claim must be refused then, before it is written: a claim written first would block the
    # key for lock_enqueue_ttl, every later call answering with the failed call's id.
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    store = CannotAdopt()
    with ThreadedServer(create_app(store, keys_file)) as server:
        other = Celery("service-cannot-adopt", broker="memory://")
        other.conf.lease_lock_locker = locker = Locker(HttpBackend(server.url, keys["alpha"]))
        try:

            def job(customer_id: int) -> None:
                """Never sent."""

            name = f"no-adopt-{uuid.uuid4().hex}"
            task = other.task(
                base=SingletonTask, lock_on_enqueue=True, lock_key="customer:{customer_id}", name=name, shared=False
            )(job)
            for _ in range(2):
                with pytest.raises(ValidationError, match="HttpBackend cannot adopt a claim"):
                    task.delay(1)
                assert not list(store.scan("")), "nothing was claimed"
        finally:
            locker.close()
            locker.backend.close()


def test_a_service_whose_store_can_adopt_takes_the_claim(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = make_keys(keys_file)
    store = MemoryBackend()
    with ThreadedServer(create_app(store, keys_file)) as server:
        other = Celery("service-adopts", broker="memory://")
        other.conf.lease_lock_locker = locker = Locker(HttpBackend(server.url, keys["alpha"]))
        try:

            def job(customer_id: int) -> None:
                """Sent, never run."""

            name = f"adopts-{uuid.uuid4().hex}"
            task = other.task(
                base=SingletonTask, lock_on_enqueue=True, lock_key="customer:{customer_id}", name=name, shared=False
            )(job)
            first = task.delay(1)
            assert task.delay(1).id == first.id, "a duplicate answers with the claimed call's id"
            assert locker.get("customer:1").held
        finally:
            locker.close()
            locker.backend.close()


def test_a_claimed_task_retried_at_once_runs_its_retry(thread_worker: None) -> None:
    # The retry message is sent only once the run has given the key back and claimed it for
    # the retry: sent from inside retry(), it would meet the run still holding the key.
    flags = uuid.uuid4().hex
    result = retries_at_once.delay(flags)
    assert result.get(timeout=WAIT) == 1
    key = retries_at_once.lease_lock_key((flags,), {})
    wait_until(lambda: not task_locker(app).get(key).held, "the retry to give the key back")


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({"broker_url": "redis://:pw@cache:6379/2"}, "redis://:pw@cache:6379/2"),
        ({"broker_url": "rediss://cache:6380/0;rediss://spare:6380/0"}, "rediss://cache:6380/0"),
        ({"broker_url": ["redis://one:6379/0", "redis://two:6379/0"]}, "redis://one:6379/0"),
        (
            {"broker_url": "sentinel://:pw@s1:26379/3;sentinel://s2:26379/3",
             "broker_transport_options": {"master_name": "main"}},
            "redis+sentinel://:pw@s1:26379,s2:26379/main/3",
        ),
        ({"broker_url": "amqp://guest@rabbit//"}, None),
        ({"broker_url": "memory://"}, None),
    ],
)
def test_which_brokers_are_lock_stores(conf: dict[str, Any], expected: Any) -> None:
    assert broker_lock_url(_app_with(conf)) == expected


def _app_with(conf: dict[str, Any]) -> Celery:
    made = Celery("brokers", set_as_current=False)
    made.conf.update(conf)
    return made


def test_a_sentinel_broker_needs_its_master_name() -> None:
    with pytest.raises(ValidationError, match="master_name"):
        broker_lock_url(_app_with({"broker_url": "sentinel://s1:26379"}))
