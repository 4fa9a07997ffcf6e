"""Turning ``redis://``, ``rediss://`` and ``redis+sentinel://`` URLs into redis-py clients.

Query-string options go through one parser table (``URL_OPTIONS``); keyword options override
them. The backend takes ``wait_for_replicas`` and ``cluster``
for itself; the rest configure the redis-py client. The options redis-py's own URL parser
knows (``max_connections``, ``protocol``, ``retry_on_timeout``, ``ssl_check_hostname``, ...)
are in the table too, checked here and handed to redis-py, so a URL copied from Celery or
django-redis settings works; a name that neither knows is refused.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any, Callable

from ...errors import ValidationError
from ...validation import check_bool, check_duration, parse_duration, redact_url
from ..base import parse_bool

__all__ = ["URL_OPTIONS", "build_client", "parse_replicas", "retries_seen", "start_counting_retries"]


def parse_replicas(text: str) -> tuple[int, float]:
    """``"1,500ms"`` or ``"2,1.5"`` -> ``(replicas, timeout seconds)``."""
    count, sep, timeout = text.partition(",")
    if not sep:
        raise ValueError("expected REPLICAS,TIMEOUT such as 1,500ms")
    return int(count), parse_duration(timeout, "wait_for_replicas timeout")


def _seconds(name: str) -> Callable[[str], float]:
    """A parser of durations whose errors name the option ``name``."""
    return lambda text: parse_duration(text, name)


def _parse_count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _parse_positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _parse_protocol(text: str) -> int:
    value = int(text)
    if value not in (2, 3):
        raise ValueError("must be 2 (RESP2) or 3 (RESP3)")
    return value


#: Options of redis-py's own URL parser (``redis.connection.URL_QUERY_ARGUMENT_PARSERS``) that
#: lease_lock does not define itself: checked here, then handed to redis-py unchanged.
REDIS_PY_OPTIONS: Mapping[str, Callable[[str], Any]] = {
    "db": _parse_count,
    "max_connections": _parse_positive,
    "protocol": _parse_protocol,
    "retry_on_timeout": parse_bool,
    "socket_keepalive": parse_bool,
    "socket_read_size": _parse_positive,
    "ssl_check_hostname": parse_bool,
    "ssl_min_version": _parse_count,
    "timeout": _seconds("timeout"),
}

#: redis-py passes these to a TLS connection only; a plain connection fails on its first use.
_TLS_ONLY = ("ssl_check_hostname", "ssl_min_version")


#: Every option a Redis URL's query string may carry, with its text parser.
URL_OPTIONS: Mapping[str, Callable[[str], Any]] = {
    "wait_for_replicas": parse_replicas,
    "cluster": parse_bool,
    "socket_timeout": _seconds("socket_timeout"),
    "socket_connect_timeout": _seconds("socket_connect_timeout"),
    "health_check_interval": lambda text: int(parse_duration(text, "health_check_interval")),
    "client_name": str,
    "username": str,
    "password": str,
    "ssl_cert_reqs": str,
    "ssl_ca_certs": str,
    "sentinel_password": str,
    **REDIS_PY_OPTIONS,
}


def check_option_types(options: dict[str, Any]) -> dict[str, Any]:
    """Check options given as Python values (keywords are not parsed like URL text)."""
    if "cluster" in options:
        check_bool(options["cluster"], "cluster")
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in options:
            options[name] = check_duration(options[name], name)
    interval = options.get("health_check_interval")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 0):
        raise ValidationError("health_check_interval must be an int of seconds >= 0")
    for name in ("client_name", "username", "password", "ssl_cert_reqs", "ssl_ca_certs", "sentinel_password"):
        if name in options and not isinstance(options[name], str):
            raise ValidationError(f"{name} must be a str, not {type(options[name]).__name__}")
    for name in ("retry_on_timeout", "socket_keepalive", "ssl_check_hostname"):
        if name in options:
            check_bool(options[name], name)
    for name in ("db", "max_connections", "protocol", "socket_read_size", "ssl_min_version"):
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValidationError(f"{name} must be an int, not {type(value).__name__}")
    if "protocol" in options and options["protocol"] not in (2, 3):
        raise ValidationError("protocol must be 2 (RESP2) or 3 (RESP3)")
    if "timeout" in options:
        options["timeout"] = check_duration(options["timeout"], "timeout")
    return options


def check_url(url: str) -> None:
    """Refuse a redis:// or rediss:// URL whose port or database redis-py would misread.

    redis-py quietly uses database 0 for ``/abc`` and raises a bare ``ValueError`` for a bad
    port; both are usage errors to be reported before anything connects.
    """
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - urlsplit parses the port lazily and raises here
    except ValueError as exc:
        # Neither the URL (its password) nor the driver's error (which quotes the URL's
        # netloc) may reach the message.
        raise ValidationError(f"Redis URL {redact_url(url)} has a bad port: {exc}") from None
    database = parts.path.strip("/")
    if database and not database.isdigit():
        raise ValidationError(
            f"Redis URL {redact_url(url)}: the path must be a database number such as /0"
        )


def _without_query(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _sentinel_hosts(netloc: str) -> list[tuple[str, int]]:
    hosts = []
    for item in netloc.rpartition("@")[2].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, ""
        try:
            hosts.append((host.strip("[]"), int(port) if port else 26379))
        except ValueError as exc:
            raise ValidationError(f"sentinel address {item!r} has a bad port") from exc
    return hosts


def _sentinel_client(url: str, options: dict[str, Any]) -> Any:
    from redis import sentinel as sentinel_module

    # redis-py typed Sentinel only in recent releases; through Any the call checks the same on
    # every release the extra admits, with no ignore that one of them would call unused.
    sentinel_class: Any = sentinel_module.Sentinel
    parts = urllib.parse.urlsplit(url)
    path = [segment for segment in parts.path.split("/") if segment]
    if not path or len(path) > 2:
        raise ValidationError(
            "redis+sentinel URL must look like "
            "redis+sentinel://[:password@]host:26379[,host2:26379]/SERVICE[/DB]"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError as exc:
        raise ValidationError(f"redis+sentinel URL database {path[1]!r} is not a number") from exc
    # ?db= overrides the path, as it does in redis-py's own URLs.
    db = options.pop("db", db)
    if parts.password is not None:
        options.setdefault("password", urllib.parse.unquote(parts.password))
    if parts.username:
        options.setdefault("username", urllib.parse.unquote(parts.username))
    sentinel_kwargs: dict[str, Any] = {
        name: options[name]
        for name in ("socket_timeout", "socket_connect_timeout")
        if name in options
    }
    if "sentinel_password" in options:
        sentinel_kwargs["password"] = options.pop("sentinel_password")
    sentinel = sentinel_class(_sentinel_hosts(parts.netloc), sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(
        urllib.parse.unquote(path[0]), db=db, **options
    )


_COUNTER = threading.local()


def start_counting_retries() -> None:
    """Start counting, on this thread, the failed tries of URL-built clients (see below)."""
    _COUNTER.failures = 0


def retries_seen() -> int:
    """Failed tries of URL-built clients on this thread since :func:`start_counting_retries`.

    A try that failed after its command was sent leaves the command's outcome unknown: the
    backend reads a release's answer in that light (see ``RedisBackend.release``).
    """
    return int(getattr(_COUNTER, "failures", 0))


def _retry_policy() -> Any:
    """The retry policy of URL-built clients: two more tries on a fresh connection after a
    connection error or a timeout, 50 ms then up to 500 ms apart (redis-py's own default makes
    ten tries over several seconds, which would stall a down server's every call)."""
    from redis import backoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry

    class CountingRetry(Retry):
        """redis-py's Retry that also counts, per thread, the tries that failed."""

        def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
            def counted(error: Exception, *rest: Any) -> Any:
                _COUNTER.failures = retries_seen() + 1
                return fail(error, *rest)

            return super().call_with_retry(do, counted, *args, **kwargs)

    # redis-py before 6.0 has no ExponentialWithJitterBackoff; its equal-jitter backoff grows
    # and caps the same way, keeping half of each pause fixed.
    jittered = getattr(backoff, "ExponentialWithJitterBackoff", None)
    pause = jittered(base=0.05, cap=0.5) if jittered is not None else backoff.EqualJitterBackoff(cap=0.5, base=0.05)
    return CountingRetry(
        pause,
        2,
        supported_errors=(RedisConnectionError, RedisTimeoutError, OSError),
    )


#: Socket timeouts of clients built from a URL unless the URL sets them. redis-py waits for ever
#: by default, and the heartbeat thread makes its calls itself: one blackholed connection would
#: stop every lease of the locker from being extended until TCP gave up, hours later.
DEFAULT_SOCKET_TIMEOUT = 5.0


def build_client(url: str, options: dict[str, Any]) -> Any:
    """A redis-py client for ``url``; ``options`` are the client options already parsed.

    ``cluster=True`` builds a ``RedisCluster`` from a ``redis://`` or ``rediss://`` URL of any
    one node. Socket timeouts default to :data:`DEFAULT_SOCKET_TIMEOUT`.
    """
    options.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    options.setdefault("socket_connect_timeout", DEFAULT_SOCKET_TIMEOUT)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    cluster = bool(options.pop("cluster", False))
    if scheme != "rediss":
        for name in _TLS_ONLY:
            if name in options:
                raise ValidationError(
                    f"Redis URL option {name} applies to TLS connections only: use a "
                    "rediss:// URL, or drop the option"
                )
    if not cluster:
        # A cluster client takes no retry object for its nodes; it has its own retries.
        options.setdefault("retry", _retry_policy())
    if scheme == "redis+sentinel":
        if cluster:
            raise ValidationError("cluster=true cannot be combined with a redis+sentinel URL")
        return _sentinel_client(url, options)
    if "sentinel_password" in options:
        raise ValidationError("sentinel_password only applies to redis+sentinel:// URLs")
    check_url(url)
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(_without_query(url), **options)
    import redis

    return redis.Redis.from_url(_without_query(url), **options)
