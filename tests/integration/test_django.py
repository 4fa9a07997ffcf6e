"""The Django integration, driven by Django itself: settings configured here, the test client
for a view that locks, ``call_command`` and ``ManagementUtility`` for ``SingletonCommand``, the
``migrate`` command for the PostgreSQL table, all on real databases (a SQLite file and the
tests' PostgreSQL server); the view and the busy command also with ``LEASE_LOCK`` on the tests'
etcd cluster by an ``etcd://`` URL."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import django
import psycopg2
import pytest
from django.conf import settings
from django.core.management import CommandError, ManagementUtility, call_command
from django.test import Client, override_settings
from lease_lock import Locker, LockLostError, MemoryBackend, ValidationError
from lease_lock.contrib.django import (
    BUSY_RETURNCODE,
    LOST_RETURNCODE,
    SingletonCommand,
    get_locker,
    locker,
    reset_locker,
)
from lease_lock.validation import install_hint

from tests.integration.django_project import gate

PREFIX = f"t{uuid.uuid4().hex[:8]}:"
WAIT = 30.0


@pytest.fixture(scope="module")
def django_db(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Django configured once for this module: a SQLite file as ``default``, the tests'
    PostgreSQL as ``pg``, and ``LEASE_LOCK`` on ``django://default``."""
    sqlite_file = tmp_path_factory.mktemp("django") / "site.db"
    pg = urllib.parse.urlsplit(postgres_server.url)
    settings.configure(
        SECRET_KEY="lease-lock-tests",  # noqa: S106 - a throwaway key for a test-only site
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        INSTALLED_APPS=["lease_lock.contrib.django", "tests.integration.django_project"],
        ROOT_URLCONF="tests.integration.django_project.urls",
        MIDDLEWARE=[],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_file)},
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": pg.path.lstrip("/"),
                "USER": urllib.parse.unquote(pg.username or "postgres"),
                "PASSWORD": urllib.parse.unquote(pg.password or ""),
                "HOST": pg.hostname,
                "PORT": str(pg.port),
                "OPTIONS": {"application_name": "lease-lock-django-test"},
            },
        },
        LEASE_LOCK={"URL": "django://default", "KEY_PREFIX": PREFIX, "TTL": 5},
    )
    django.setup()
    yield sqlite_file
    reset_locker()


@pytest.fixture
def fresh_gate(django_db: Path) -> Iterator[None]:
    gate.reset()
    yield
    gate.proceed.set()  # never leave a command thread blocked behind a failed assertion


def run_in_thread(*args: Any, **options: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            call_command(*args, stdout=io.StringIO(), **options)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def test_settings_map_to_the_sqlite_backend_of_the_alias(django_db: Path) -> None:
    built = get_locker()
    assert type(built.backend).__name__ == "SqliteBackend"
    assert built.backend.path == str(django_db)  # type: ignore[attr-defined]
    assert (built.key_prefix, built.ttl) == (PREFIX, 5.0)
    assert get_locker() is built  # one per process


@pytest.fixture(params=["sqlite", "etcd"])
def lock_store(request: pytest.FixtureRequest, django_db: Path) -> Iterator[str]:
    """The site's lock store: the module's ``django://default``, or ``LEASE_LOCK`` pointed at the
    tests' etcd cluster by its ``etcd://`` URL (the locker is rebuilt when the setting changes)."""
    if request.param == "sqlite":
        yield "SqliteBackend"
        return
    url = request.getfixturevalue("etcd_cluster").url
    with override_settings(LEASE_LOCK={"URL": url, "KEY_PREFIX": PREFIX, "TTL": 5}):
        yield "EtcdBackend"


def test_view_holds_the_lock_and_answers_409_while_it_is_busy(lock_store: str) -> None:
    assert type(get_locker().backend).__name__ == lock_store
    client = Client()
    answer = client.get("/orders/7/settle")
    assert answer.status_code == 200
    assert answer.json() == {"order": 7, "held": True, "key": PREFIX + "order:7"}
    assert not locker.get("order:7").held  # released when the view returned
    holder = locker.acquire("order:7")
    try:
        assert client.get("/orders/7/settle").status_code == 409
    finally:
        holder.release()
    assert client.get("/orders/7/settle").status_code == 200


def test_a_second_concurrent_command_fails_busy_with_one_stderr_line(fresh_gate: None, lock_store: str) -> None:
    assert type(get_locker().backend).__name__ == lock_store
    first, errors = run_in_thread("nightly_report")
    assert gate.started.wait(WAIT)
    assert locker.get("command:nightly_report").held
    stderr = io.StringIO()
    with pytest.raises(CommandError) as busy:
        call_command("nightly_report", stdout=io.StringIO(), stderr=stderr)
    assert busy.value.returncode == BUSY_RETURNCODE == 75
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1 and "command:nightly_report" in lines[0]
    # The CLI's words, with the key as the command names it (no KEY_PREFIX).
    assert lines[0].startswith("'command:nightly_report' is busy (held by "), lines[0]
    assert lines[0].endswith("; another run holds it, not started") and PREFIX not in lines[0]
    gate.proceed.set()
    first.join(WAIT)
    assert not first.is_alive() and errors == []
    assert gate.runs == [PREFIX + "command:nightly_report"]
    assert not locker.get("command:nightly_report").held


def test_manage_py_exits_75_and_prints_one_line(fresh_gate: None, capsys: pytest.CaptureFixture[str]) -> None:
    first, errors = run_in_thread("nightly_report")
    assert gate.started.wait(WAIT)
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", "nightly_report"]).execute()
    assert exited.value.code == 75
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "'command:nightly_report' is busy (held by " in lines[0]
    gate.proceed.set()
    first.join(WAIT)
    assert errors == [] and len(gate.runs) == 1


def test_lock_wait_runs_after_the_holder_finishes(fresh_gate: None) -> None:
    holder = locker.acquire("command:nightly_report")
    waiter, errors = run_in_thread("nightly_report", "--lock-wait")
    # While the key is held the command must neither run nor give up.
    assert not gate.started.wait(0.5)
    assert errors == []
    holder.release()
    assert gate.started.wait(WAIT)
    gate.proceed.set()
    waiter.join(WAIT)
    assert errors == [] and len(gate.runs) == 1


def test_lock_timeout_gives_up_with_the_busy_code(fresh_gate: None) -> None:
    first, errors = run_in_thread("nightly_report")
    assert gate.started.wait(WAIT)
    with pytest.raises(CommandError) as busy:
        call_command("nightly_report", "--lock-timeout", "0.3", stdout=io.StringIO(), stderr=io.StringIO())
    assert busy.value.returncode == 75
    assert isinstance(busy.value.__cause__, Exception) and busy.value.__cause__.reason == "timeout"  # type: ignore[attr-defined]
    assert " after waiting 0." in str(busy.value) and PREFIX not in str(busy.value)
    gate.proceed.set()
    first.join(WAIT)
    assert errors == []


class DayReport(SingletonCommand):
    """A command keyed by one of its options."""

    lock_key = staticmethod(lambda options: f"report:{options['day']}")  # type: ignore[assignment]

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("day")

    def handle(self, *args: Any, **options: Any) -> None:
        assert self.lock is not None
        gate.runs.append(self.lock.key)
        # Another run of a different day is not blocked by this one.
        if options["day"] == "mon":
            call_command(DayReport(), "tue", stdout=io.StringIO())


def test_lock_key_callable_of_the_options(fresh_gate: None) -> None:
    call_command(DayReport(), "mon", stdout=io.StringIO())
    assert gate.runs == [PREFIX + "report:mon", PREFIX + "report:tue"]


class Batch(SingletonCommand):
    """At most two runs at once, its locks on a memory store the test shares."""

    lock_key = "batch"
    lock_limit = 2
    store = Locker(MemoryBackend())

    def get_locker(self) -> Locker:
        return self.store

    def handle(self, *args: Any, **options: Any) -> None:
        assert self.lock is not None
        gate.runs.append(f"{self.lock.limit}:{len(self.store.get('batch').holders)}")


def test_lock_limit_lets_that_many_runs_hold_the_key(fresh_gate: None) -> None:
    held = Batch.store.acquire("batch", limit=2)
    call_command(Batch(), stdout=io.StringIO())
    assert gate.runs == ["2:2"]  # the run held the second place
    also = Batch.store.acquire("batch", limit=2)
    with pytest.raises(CommandError) as busy:
        call_command(Batch(), stdout=io.StringIO(), stderr=io.StringIO())
    assert busy.value.returncode == 75
    assert "'batch' is busy (2/2 held, latest by " in str(busy.value)
    assert str(busy.value).endswith("; 2 other runs hold it, not started")
    assert held.release() and also.release()


def test_lock_limit_is_checked_when_the_command_class_is_defined() -> None:
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValidationError, match="lock_limit must be an int from 1"):
            type("Bad", (SingletonCommand,), {"lock_limit": bad})


class LosesItsLock(SingletonCommand):
    """A command whose lease is taken away (force-released) while it runs."""

    lock_key = "fragile"

    def handle(self, *args: Any, **options: Any) -> None:
        assert locker.force_release("fragile")


def test_a_lost_lock_ends_the_command_with_a_clear_error(django_db: Path) -> None:
    with pytest.raises(CommandError) as lost:
        call_command(LosesItsLock(), stdout=io.StringIO())
    assert lost.value.returncode == LOST_RETURNCODE
    # The CLI's words: the reason in plain words, not its code, and the key without KEY_PREFIX.
    assert str(lost.value).startswith(
        "lost the lock on 'fragile': the key was force-released or taken by another holder; "
    ), str(lost.value)
    assert PREFIX not in str(lost.value) and "(observed)" not in str(lost.value)
    assert isinstance(lost.value.__cause__, LockLostError)


def test_bad_settings_are_named(django_db: Path) -> None:
    with override_settings(LEASE_LOCK={"URL": "django://nope"}), pytest.raises(ValidationError, match="nope"):
        get_locker()
    with override_settings(LEASE_LOCK={"TIMEOUT": 3}), pytest.raises(ValidationError, match="TIMEOUT"):
        get_locker()
    with override_settings(LEASE_LOCK={"TTL": -1}), pytest.raises(ValidationError, match="ttl"):
        get_locker()


def test_migration_creates_the_postgres_table_for_create_table_false(django_db: Path, postgres_server: Any) -> None:
    table = f"ll_django_{uuid.uuid4().hex[:8]}"
    config = {"URL": "django://pg", "OPTIONS": {"table": table, "create_table": False}}
    with override_settings(LEASE_LOCK=config):
        built = get_locker()
        assert type(built.backend).__name__ == "PostgresBackend"
        with pytest.raises(ValidationError, match=table):
            built.acquire("before-migration")
        # The migration is PostgreSQL-only: on the SQLite default it records itself and runs nothing.
        call_command("migrate", "lease_lock", database="default", verbosity=0)
        call_command("migrate", "lease_lock", database="pg", verbosity=0)
        try:
            reset_locker()
            lock = get_locker().acquire("after-migration")
            assert get_locker().get("after-migration").held
            lock.release()
        finally:
            reset_locker()
            call_command("migrate", "lease_lock", "zero", database="pg", verbosity=0)
    with psycopg2.connect(postgres_server.url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s), to_regclass(%s)", (table, table + "_fence"))
        assert cursor.fetchone() == (None, None)
    conn.close()


def test_the_locker_is_rebuilt_in_a_forked_child(django_db: Path) -> None:
    parent = get_locker()
    held = parent.acquire("fork-parent")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        status = b"?"
        try:
            child = get_locker()
            fresh = child is not parent and not child.closed
            child.acquire("fork-child").release()
            status = b"ok" if fresh and child.get("fork-parent").held else b"stale"
        except BaseException as error:  # noqa: BLE001 - reported to the parent through the pipe
            status = repr(error).encode()
        finally:
            os.write(write_end, status)
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    assert report == b"ok"
    assert held.state == "held" and get_locker() is parent
    assert held.release()


def test_the_locker_is_closed_at_exit(django_db: Path) -> None:
    script = textwrap.dedent(
        f"""
        import django
        from django.conf import settings
        settings.configure(
            DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {str(django_db)!r}}}}},
            LEASE_LOCK={{"URL": "django://default", "KEY_PREFIX": {PREFIX!r}, "TTL": 60}},
        )
        django.setup()
        from lease_lock.contrib.django import locker
        lock = locker.acquire("left-held")
        print(locker.get("left-held").held, flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    # The 60 s lease was given back when the interpreter exited, not left to run out.
    assert not locker.get("left-held").held


# -- where the lock lives without a URL, and what `check` says -------------------------------------
# Django's settings can be configured once per process, so each site below runs in a fresh
# interpreter: it configures itself, runs `manage.py check`, then answers one request to a view
# that locks and, while it holds the lock, asks the store itself where the lease is.

_SITE = """
import json, sys
import django
from django.conf import settings
settings.configure(
    SECRET_KEY="lease-lock-tests", ALLOWED_HOSTS=["testserver"], USE_TZ=True, MIDDLEWARE=[],
    INSTALLED_APPS=["lease_lock.contrib.django"], ROOT_URLCONF="__main__", **SETTINGS
)
django.setup()
from django.core.management import ManagementUtility, call_command
from django.http import JsonResponse
from django.test import Client
from django.urls import path
from lease_lock.contrib.django import locker

def where(key):
    WHERE

def view(request):
    with locker.lock("order:7", blocking=False) as lock:
        return JsonResponse({"key": lock.key, "found": where(lock.key), "owner": locker.owner})

urlpatterns = [path("settle", view)]
try:
    ManagementUtility(["manage.py", "check"]).execute()
except SystemExit as exit:
    sys.exit(exit.code)
if MIGRATE:
    call_command("migrate", "lease_lock", verbosity=0)
answer = Client().post("/settle")
print(json.dumps({"status": answer.status_code, **answer.json(), "backend": type(locker.backend).__name__}))
"""


def run_site(settings_dict: dict[str, Any], where: str = "return None", *, migrate: bool = False,
             env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if name != "LEASE_LOCK_URL"}
    environment.update(env or {})
    script = (
        _SITE.replace("**SETTINGS", f"**{settings_dict!r}").replace("WHERE", where).replace("MIGRATE", str(migrate))
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT, check=False,
                          env=environment)


def _postgres_database(postgres_server: Any) -> dict[str, Any]:
    pg = urllib.parse.urlsplit(postgres_server.url)
    return {
        "ENGINE": "django.db.backends.postgresql", "NAME": pg.path.lstrip("/"),
        "USER": urllib.parse.unquote(pg.username or "postgres"), "PASSWORD": urllib.parse.unquote(pg.password or ""),
        "HOST": pg.hostname, "PORT": str(pg.port),
    }


def test_postgres_databases_and_no_lease_lock_settings_lock_in_that_database(postgres_server: Any) -> None:
    # Django's own connection reads the row while the view holds the lock.
    where = (
        "from django.db import connection\n"
        "    with connection.cursor() as cursor:\n"
        "        cursor.execute('SELECT owner FROM lease_lock WHERE key = %s', [key])\n"
        "        return cursor.fetchall()"
    )
    done = run_site({"DATABASES": {"default": _postgres_database(postgres_server)}}, where, migrate=True)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["status"] == 200 and answer["backend"] == "PostgresBackend"
    assert answer["found"] == [[answer["owner"]]]
    assert "this host only" not in done.stderr


def test_only_a_redis_cache_and_django_cache_url_lock_in_that_redis(redis_server: Any) -> None:
    prefix = f"dj-{uuid.uuid4().hex[:8]}:"
    where = (
        "import redis\n"
        f"    return redis.Redis.from_url({redis_server.url!r}).get(key).decode().rpartition('|')[2]"
    )
    site = {
        "DATABASES": {},
        "CACHES": {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_server.url}},
        "LEASE_LOCK": {"URL": "django-cache://default", "KEY_PREFIX": prefix},
    }
    done = run_site(site, where)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["status"] == 200 and answer["backend"] == "RedisBackend"
    assert answer["key"] == prefix + "order:7" and answer["found"] == answer["owner"]


def test_no_store_anywhere_fails_check_and_first_use_naming_the_setting() -> None:
    done = run_site({"DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}})
    assert done.returncode == 1, done.stdout
    assert "lease_lock.E001" in done.stderr and 'settings.LEASE_LOCK["URL"]' in done.stderr
    assert "LEASE_LOCK_URL" in done.stderr
    # Without the check, the first use raises the same ValidationError.
    script = textwrap.dedent(
        """
        import django
        from django.conf import settings
        settings.configure(DATABASES={}, INSTALLED_APPS=["lease_lock.contrib.django"])
        django.setup()
        from lease_lock import ValidationError
        from lease_lock.contrib.django import locker
        try:
            locker.get("x")
        except ValidationError as error:
            print("ValidationError:", error)
        """
    )
    environment = {name: value for name, value in os.environ.items() if name != "LEASE_LOCK_URL"}
    first_use = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT,
                               check=False, env=environment)
    assert first_use.stdout.startswith("ValidationError: no lock store configured"), first_use.stderr


def test_check_refuses_an_option_the_backend_of_the_url_does_not_take() -> None:
    # The PostgreSQL-only `table` option with a Redis URL, on a port where nothing answers: the
    # check needs no connection.
    site = {"DATABASES": {}, "LEASE_LOCK": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"table": "locks"}}}
    done = run_site(site)
    assert done.returncode == 1, done.stdout
    assert "lease_lock.E001" in done.stderr and "table" in done.stderr and "redis://" in done.stderr


def test_check_refuses_a_cache_alias_that_is_not_redis() -> None:
    site = {
        "DATABASES": {},
        "CACHES": {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        "LEASE_LOCK": {"URL": "django-cache://default"},
    }
    done = run_site(site)
    assert done.returncode == 1, done.stdout
    assert "lease_lock.E001" in done.stderr and "LocMemCache" in done.stderr


def test_the_environment_url_comes_before_the_default_database(tmp_path: Path) -> None:
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "site.db")}
    done = run_site({"DATABASES": {"default": database}}, env={"LEASE_LOCK_URL": "memory://"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["backend"] == "MemoryBackend"
    # Without it the SQLite file is used, with one warning that it serves one host.
    logging = {
        "version": 1, "handlers": {"stderr": {"class": "logging.StreamHandler"}},
        "loggers": {"lease_lock": {"handlers": ["stderr"], "level": "WARNING"}},
    }
    done = run_site({"DATABASES": {"default": database}, "LOGGING": logging})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["backend"] == "SqliteBackend"
    # Once from the system check, once in the configured log.
    assert done.stderr.count("this host only") == 2, done.stderr
    assert done.stderr.count("(lease_lock.W001)") == 1, done.stderr


def test_a_sqlite_store_is_a_check_warning_under_djangos_default_logging(tmp_path: Path) -> None:
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "site.db")}
    done = run_site({"DATABASES": {"default": database}})
    assert done.returncode == 0, done.stderr  # a warning does not stop the site
    assert json.loads(done.stdout.strip().splitlines()[-1])["backend"] == "SqliteBackend"
    (line,) = [line for line in done.stderr.splitlines() if "(lease_lock.W001)" in line]
    assert "this host only" in line and f"file {tmp_path / 'site.db'}:" in line
    # And once in the log: with Django's default logging (nothing above its own loggers) the
    # lease_lock WARNING reaches stderr through Python's last resort, the only place a server
    # that runs no system checks (gunicorn) shows it.
    assert done.stderr.count("this host only") == 2, done.stderr
    silenced = run_site({"DATABASES": {"default": database}, "SILENCED_SYSTEM_CHECKS": ["lease_lock.W001"]})
    assert silenced.returncode == 0 and "lease_lock.W001" not in silenced.stderr, silenced.stderr
    # Silencing the check silences the log line too: the site said it runs on one host.
    assert "this host only" not in silenced.stderr, silenced.stderr


@pytest.mark.parametrize(
    ("setting", "value", "rule"),
    [
        ("TTL", "30", "ttl must be seconds"),
        ("MAX_HOLD", -5, "max_hold must be > 0"),
        ("KEY_PREFIX", 7, "key_prefix must be a str"),
        ("FENCING", "yes", "fencing must be True or False"),
    ],
)
def test_check_names_a_setting_whose_value_the_locker_refuses(
    setting: str, value: object, rule: str, tmp_path: Path
) -> None:
    site = {"DATABASES": {}, "LEASE_LOCK": {"URL": f"sqlite:///{tmp_path / 'locks.db'}", setting: value}}
    done = run_site(site)
    # Before the first request: it would have answered 500.
    assert done.returncode == 1, done.stdout
    (line,) = [line for line in done.stderr.splitlines() if "(lease_lock.E002)" in line]
    assert f'settings.LEASE_LOCK["{setting}"]: {rule}' in line
    nested = run_site({"DATABASES": {}, "LEASE_LOCK": {"URL": "memory://", "OPTIONS": {"ttl": "30"}}})
    assert nested.returncode == 1 and 'settings.LEASE_LOCK["OPTIONS"]["ttl"]: ttl must be' in nested.stderr


def test_check_names_the_extra_of_a_metrics_exporter_that_is_not_installed(tmp_path: Path) -> None:
    # An interpreter that cannot import prometheus_client, with the real Django.
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text("import sys\nsys.modules['prometheus_client'] = None\n")
    path = os.pathsep.join([str(site_dir), os.environ.get("PYTHONPATH", "")])
    done = run_site({"DATABASES": {}, "LEASE_LOCK": {"URL": "memory://", "METRICS": "prometheus"}},
                    env={"PYTHONPATH": path})
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "(lease_lock.E003)" in line]
    assert "'prometheus_client' package" in line and install_hint("prometheus") in line
    unknown = run_site({"DATABASES": {}, "LEASE_LOCK": {"URL": "memory://", "METRICS": "statsd"}})
    assert unknown.returncode == 1 and "lease_lock.E003" in unknown.stderr and "'statsd'" in unknown.stderr


def test_a_cache_alias_maps_to_its_first_redis_server_with_its_options(django_db: Path) -> None:
    from lease_lock.contrib.django._settings import cache_url

    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "shared": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://primary:6379", "redis://replica:6379"],
            "OPTIONS": {"PASSWORD": "p w", "DB": 3},
        },
        "native": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "rediss://a:1/2;rediss://b:1/2"},
        "socket": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "unix:///run/redis.sock"},
    }
    with override_settings(CACHES=caches):
        assert cache_url("shared") == "redis://:p%20w@primary:6379/3"
        assert cache_url("native") == "rediss://a:1/2"
        with pytest.raises(ValidationError, match="redis:// or rediss://"):
            cache_url("socket")
        with pytest.raises(ValidationError, match="no alias 'missing'"):
            cache_url("missing")
