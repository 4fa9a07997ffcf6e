"""The Redis backend (redis-py): standalone, Sentinel and Cluster.

Each lease is one string key named exactly like the lock (prefix included), so ``PTTL <key>``
shows the lease and Redis's own clock ends it; a counting key (``limit`` > 1) is a hash of its
places under the same name, which expires with its last place. Every primitive is one round
trip: a Lua script run with EVALSHA (EVAL when the server has lost its script cache), or a
plain ``GET`` for ``is_held`` (a second, scripted read for a counting key). The fence counter
of a key lives next to it in the same hash slot.

What Redis cannot promise: a primary that fails over before its replicas have a lease can give
the key to a second holder (``wait_for_replicas`` narrows that window, it does not close it);
an instance under memory pressure can evict a lease unless it runs with
``maxmemory-policy noeviction``. Fences keep rising through both, as long as the server clock
does not step back past the last fence.
"""

from __future__ import annotations

import codecs
import functools
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Callable, ClassVar, ContextManager, Optional, TypeVar, Union, cast

from redis.exceptions import ResponseError

from ...errors import BackendUnavailableError, ReplicationError, ValidationError
from ...validation import check_duration
from ..base import (
    Capabilities,
    ExtendRequest,
    Holder,
    LockState,
    ReleaseWatcher,
    WaitingLine,
    limit_mismatch,
    parse_url_options,
)
from ..handoff import HandoffWatcher
from ..line import FRESH_SHARE, AnnouncedLine, Announcements, LineSlots, claim_for
from ..service import ServiceStore, check_amount
from . import _scripts
from ._connections import DirectCommands
from ._line import BURST, RedisWaitingLine
from ._scripts import GRANTED_PREFIX, LIMIT_HELD, Script
from ._url import (
    URL_OPTIONS,
    build_client,
    check_option_types,
    retries_seen,
    start_counting_retries,
)
from ._watch import (
    HANDOFF_CONTROL_PREFIX,
    OUTSTANDING_MS,
    WAKE_MS,
    RedisHandoffWatcher,
    RedisReleaseWatcher,
    Turns,
    release_channel,
)

__all__ = [
    "RedisBackend", "beside", "fence_key", "handoff_keys", "hash_tag", "is_fence_key", "line_keys",
    "store_structure",
]

#: A fence counter outlives the last grant of its key by a day (or by the lease, if longer).
_COUNTER_LIFETIME_MS = 86_400_000
#: Batched reads and extensions go out in pipelines of at most this many commands.
_BATCH = 1000
_COUNTER_PREFIX = "lease_lock:window:"


def hash_tag(key: str) -> Optional[str]:
    """The part of ``key`` Redis Cluster hashes when it has a hash tag (``{...}``), else None."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return None


#: The structures the backend keeps beside a key, by the name that ends theirs (see
#: :func:`beside`). A lock key named like one is refused (see :meth:`RedisBackend.check_key`);
#: a structure added later is added here.
_BESIDE_KEY = {
    "fence": "fence counter",
    "waiting": "waiting marker",
    "wake": "wake list",
    "line": "waiting line",
    "entries": "waiting line's entries",
}
#: The structures the backend keeps under names of its own, by prefix; lock keys may not start
#: with one.
_RESERVED_PREFIXES = {
    _COUNTER_PREFIX: "rate counter",
    HANDOFF_CONTROL_PREFIX: "hand-off control list",
    GRANTED_PREFIX: "waiter's grant list",
}


def beside(key: str, structure: str) -> str:
    """The name of ``key``'s ``structure`` (``"fence"``, ``"line"``...), in ``key``'s hash slot.

    A key with a hash tag is followed by ``:<structure>``: the name keeps the tag. Any other key
    is put in braces, which make it the name's tag, and followed by ``/<structure>``. No two
    keys share a name: a name ending in ``:<structure>`` can only be ``<key>:<structure>`` of a
    key with a tag, and one ending in ``}/<structure>`` only ``{<key>}/<structure>`` of a key
    without, so each name gives back its one key; and each name is refused as a lock key. The
    braces give the slot of ``key`` itself unless ``key`` contains ``}``, which a Cluster
    therefore refuses (see :meth:`RedisBackend.check_key`).
    """
    return f"{key}:{structure}" if hash_tag(key) is not None else f"{{{key}}}/{structure}"


# The names below are pure functions of the key, asked for on every call about it (a release
# names five of them): the names of the keys used last are kept.
_NAMES_KEPT = 1024


@functools.lru_cache(maxsize=_NAMES_KEPT)
def fence_key(key: str) -> str:
    """The name of ``key``'s fence counter, in the same hash slot as ``key`` (see :func:`beside`)."""
    return beside(key, "fence")


@functools.lru_cache(maxsize=_NAMES_KEPT)
def handoff_keys(key: str) -> tuple[str, str]:
    """The names of ``key``'s waiting marker and wake list, in the same hash slot as ``key``
    (see :func:`beside` and :mod:`lease_lock.backends.handoff`). Neither is a string, so
    :meth:`RedisBackend.scan` never lists them."""
    return beside(key, "waiting"), beside(key, "wake")


@functools.lru_cache(maxsize=_NAMES_KEPT)
def line_keys(key: str) -> tuple[str, str]:
    """The names of ``key``'s waiting line (a list of tokens) and its entries (a hash), in
    the same hash slot as ``key`` (see :func:`beside`)."""
    return beside(key, "line"), beside(key, "entries")


@functools.lru_cache(maxsize=_NAMES_KEPT)
def store_structure(key: str) -> Optional[str]:
    """What ``key`` names among the backend's own structures (``"fence counter"``,
    ``"wake list"``, ...) when it is the name of one for some other key, else ``None``."""
    for prefix, what in _RESERVED_PREFIXES.items():
        if key.startswith(prefix):
            return what
    for structure, what in _BESIDE_KEY.items():
        tagged = key[: -len(structure) - 1]
        if key.endswith(":" + structure) and hash_tag(tagged) is not None:
            return what
        plain = key[1 : -len(structure) - 2]
        if key.startswith("{") and key.endswith("}/" + structure) and hash_tag(plain) is None:
            return what
    return None


def is_fence_key(key: str) -> bool:
    """``True`` if ``key`` is the name of another key's fence counter (see :func:`fence_key`)."""
    return store_structure(key) == _BESIDE_KEY["fence"]


_Call = TypeVar("_Call", bound=Callable[..., Any])

#: Replies of a server that cannot serve now but will: still loading its dataset, running a
#: script past its time limit, its primary down, its cluster down or resharding.
_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN")


def _is_unavailable(exc: BaseException) -> bool:
    """``True`` for a connection-level failure; a refused login or a bad command is not one."""
    from redis import exceptions

    if isinstance(exc, (exceptions.AuthenticationError, exceptions.AuthorizationError)):
        return False
    if isinstance(exc, (exceptions.ConnectionError, exceptions.TimeoutError)):
        return True
    if isinstance(exc, exceptions.ReadOnlyError):
        # A write that reached a replica: the client still talks to a primary that failed
        # over (Sentinel and cluster clients find the new one on the next call).
        return True
    if isinstance(exc, (exceptions.ClusterDownError, exceptions.TryAgainError)):
        return True
    if isinstance(exc, exceptions.ResponseError):
        return str(exc).split(" ", 1)[0] in _UNAVAILABLE_REPLIES
    return False


def _unavailable(exc: BaseException) -> BackendUnavailableError:
    # redis-py's messages name host and port, never the password.
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return BackendUnavailableError(f"Redis backend unavailable: {detail}", backend="redis")


def _translate_unavailable(exc: BaseException) -> Optional[BaseException]:
    """The :class:`BackendUnavailableError` for a connection-level driver error, else ``None``
    (the error passes through): what the backend's watchers and lines raise."""
    return _unavailable(exc) if _is_unavailable(exc) else None


def _reports_unavailable(method: _Call) -> _Call:
    """Raise :class:`BackendUnavailableError` from a connection-level driver error."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except BackendUnavailableError:
            raise
        except Exception as exc:
            if _is_unavailable(exc):
                raise _unavailable(exc) from exc
            raise

    return cast(_Call, wrapper)


def _millis(seconds: float) -> int:
    # PX and PEXPIRE take whole milliseconds and refuse 0.
    return max(1, round(seconds * 1000))


def _parse_value(value: Any) -> Optional[tuple[str, Optional[int], str]]:
    """``<token>|<fence>|<owner>`` -> (token, fence, owner); None for anything else."""
    if not isinstance(value, bytes):
        return None
    try:
        token, fence, owner = value.decode("utf-8").split("|", 2)
    except (UnicodeDecodeError, ValueError):
        return None
    if not token or (fence and not fence.isdigit()):
        return None
    return token, int(fence) if fence else None, owner


#: The field of a counting key's hash that holds its limit (no token can be named so).
_LIMIT_FIELD = b"#limit"


def _counting_state(key: str, fields: Sequence[Any], seconds: int, micros: int) -> LockState:
    """The state of a counting key from its hash (flat fields and values, see ``_scripts``),
    read at the server time ``seconds`` + ``micros``: its live places, by their lease ends."""
    values = dict(zip(fields[::2], fields[1::2]))
    limit = values.pop(_LIMIT_FIELD, b"")
    if not limit.isdigit():
        return LockState.free(key)  # a hash that is no counting key holds no lease
    now = seconds + micros / 1_000_000
    holders = []
    for value in values.values():
        ends, _, rest = value.partition(b"|")
        fence, _, owner = rest.partition(b"|")
        if not (ends.isdigit() and fence.isdigit()):
            continue
        left = int(ends) / 1000 - now
        if left > 0:
            expires_at = datetime.fromtimestamp(int(ends) / 1000, tz=timezone.utc)
            holders.append(Holder(owner.decode("utf-8", "replace"), int(fence), expires_at, left))
    return LockState.counting(key, int(limit), holders)


def _escape_glob(text: str) -> str:
    return "".join(f"\\{char}" if char in "\\*?[]" else char for char in text)


def _is_cluster(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def _check_client(client: Any) -> None:
    from redis.client import Pipeline
    from redis.cluster import ClusterPipeline

    if isinstance(client, (Pipeline, ClusterPipeline)):
        raise ValidationError(
            "client must be a redis.Redis or redis.cluster.RedisCluster, not a pipeline: "
            "pass the client the pipeline was made from"
        )
    if not callable(getattr(client, "execute_command", None)) or not callable(
        getattr(client, "pipeline", None)
    ):
        raise ValidationError(
            f"client must be a redis.Redis, a Sentinel master client or a "
            f"redis.cluster.RedisCluster, not {type(client).__name__}"
        )
    encoder = client.get_encoder() if callable(getattr(client, "get_encoder", None)) else None
    if getattr(encoder, "decode_responses", False):
        raise ValidationError(
            "client must be made with decode_responses=False (the default): the backend "
            "reads raw replies; create a second client for lease_lock or drop that option"
        )
    encoding = getattr(encoder, "encoding", "utf-8")
    try:
        utf8 = codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        utf8 = False
    if not utf8:
        # Leases are read back as UTF-8 by every process: one written in another encoding
        # would read as a free key.
        raise ValidationError(
            f"client must be made with encoding='utf-8' (the default), not {encoding!r}: "
            "lease_lock stores keys, tokens and owner labels as UTF-8 so that every process "
            "reads them alike"
        )


def _check_replicas(value: object, cluster: bool) -> Optional[tuple[int, float]]:
    if value is None:
        return None
    if cluster:
        raise ValidationError(
            "wait_for_replicas cannot be used with a RedisCluster client: WAIT must run on the "
            "connection that wrote the lease, which a cluster client does not guarantee; "
            "drop wait_for_replicas or use a standalone or Sentinel client"
        )
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValidationError(
            "wait_for_replicas must be a (replicas, timeout) pair such as (1, 0.5)"
        )
    replicas, timeout = value
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValidationError("wait_for_replicas replicas must be an int >= 1")
    return replicas, check_duration(timeout, "wait_for_replicas timeout")


class RedisBackend(ServiceStore):
    """Leases in Redis through a redis-py client.

    ``client`` is a ``redis.Redis``, a Sentinel master client (``Sentinel.master_for``) or a
    ``redis.cluster.RedisCluster``, made with ``decode_responses=False``. The backend registers
    nothing on it, so several backends (and the application) may share one client; ``close()``
    leaves a client passed in open.

    ``wait_for_replicas=(replicas, timeout)`` runs ``WAIT`` after every acquisition and
    extension, on the connection that wrote it. When fewer replicas acknowledge in time,
    :class:`~lease_lock.errors.ReplicationError` is raised: an acquisition first gives the key
    back; an extension keeps the lease it wrote (the heartbeat retries). A cluster client
    refuses it.

    ``close_client=True`` hands the client over: :meth:`close` then closes it (``from_url``
    does this for the client it builds).
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        server_clock=True,
        fencing=True,
        release_notify=True,
        replica_wait=True,
        scan=True,
        batch_extend=True,
        counting=True,
        min_ttl=0.0,
        clock="the Redis server's clock (key expiry and TIME)",
        wake=(
            "a direct line in the store (up to 8 threads of a backend), else wake-one through a"
            " shared BLPOP watcher; pub/sub on a Cluster"
        ),
    )
    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = URL_OPTIONS

    def __init__(
        self,
        client: Any,
        *,
        wait_for_replicas: Optional[tuple[int, float]] = None,
        close_client: bool = False,
    ) -> None:
        _check_client(client)
        self._cluster = _is_cluster(client)
        self.wait_for_replicas = _check_replicas(wait_for_replicas, self._cluster)
        #: The redis-py client the backend talks through.
        self.client = client
        # Single commands go out on connections kept between calls (see _connections).
        self._commands = DirectCommands(client)
        self._close_client = close_client
        db = 0 if self._cluster else int(client.get_connection_kwargs().get("db") or 0)
        #: The database whose keys this backend locks (always 0 on a Cluster).
        self.db = db
        self._channel = release_channel(db)
        self._watchers: list[Union[RedisReleaseWatcher, RedisHandoffWatcher]] = []
        self._watchers_lock = threading.Lock()
        #: The wakes this process took and has not answered yet, and the turns its waiters
        #: keep after losing a race (see _grant and the scripts).
        self._turns = Turns()
        #: The threads waiting in line (see join_line), and whether the server can have them
        #: (``None``: not asked yet).
        self._line_slots = LineSlots()
        self._lines_ok: Optional[bool] = None
        #: The shared watcher of the waiters beyond the line (see join_line).
        self._announcements = Announcements(self)
        # Whether the client counts its failed tries (only the clients from_url builds do): a
        # release then reads its answer in that light, and other clients skip the counting.
        self._counts_retries = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
        ``redis+sentinel://[:password@]host:26379[,host:26379]/SERVICE[/DB]``.

        Options (query string or keyword): ``wait_for_replicas=REPLICAS,TIMEOUT``,
        ``cluster=true`` (a RedisCluster from any node's URL), ``socket_timeout``,
        ``socket_connect_timeout``, ``health_check_interval``, ``client_name``, ``username``,
        ``password``, ``ssl_cert_reqs``, ``ssl_ca_certs``, ``sentinel_password``, and the
        options of redis-py's own URLs (``max_connections``, ``protocol``, ``db``,
        ``retry_on_timeout``, ``socket_keepalive``, ``socket_read_size``, ``timeout``, and for
        ``rediss://`` ``ssl_check_hostname`` and ``ssl_min_version``), which go to redis-py;
        any other name is a ``ValidationError``. The client retries twice on a fresh
        connection after a connection error or a timeout, 50 to 500 ms apart (every operation
        may be repeated safely, see :meth:`release`); a failure that outlasts the retries
        raises :class:`~lease_lock.errors.BackendUnavailableError`. The backend owns the
        client it builds and closes it in :meth:`close`.
        """
        parsed = check_option_types(parse_url_options(url, URL_OPTIONS, options, backend="redis"))
        replicas = parsed.pop("wait_for_replicas", None)
        client_options = {name: value for name, value in parsed.items() if name != "cluster"}
        if parsed.get("cluster"):
            client_options["cluster"] = True
        _check_replicas(replicas, bool(parsed.get("cluster")))
        client = build_client(url, client_options)
        try:
            backend = cls(client, wait_for_replicas=replicas, close_client=True)
        except BaseException:
            client.close()
            raise
        backend._counts_retries = True
        return backend

    # -- helpers -------------------------------------------------------------------------------

    def _fence_key(self, key: str) -> str:
        counter = fence_key(key)
        if self._cluster and hash_tag(key) is None and "}" in key:
            raise ValidationError(
                f"key {key!r} contains '}}' but no hash tag, so its fence counter cannot share "
                "its Redis Cluster hash slot; put the part to hash in braces, e.g. "
                "'{orders}:42', or remove the '}'"
            )
        return counter

    def _batch(
        self, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]], *, wait: bool
    ) -> list[Any]:
        """Run scripts in pipelines (one round trip per ``_BATCH``); raise the first error.

        With ``wait`` (and ``wait_for_replicas`` set) every pipeline ends with ``WAIT``, which
        covers the writes of its own connection; the smallest acknowledgement count is
        appended to the replies.
        """
        wait = wait and self.wait_for_replicas is not None
        replies: list[Any] = []
        acknowledged: Optional[int] = None
        for start in range(0, len(calls), _BATCH):
            chunk = calls[start : start + _BATCH]
            answers, acks = self._pipeline(chunk, by_hash=True, wait=wait)
            missing = [index for index, answer in enumerate(answers) if self._is_noscript(answer)]
            if missing:
                retried, retried_acks = self._pipeline(
                    [chunk[i] for i in missing], by_hash=False, wait=wait
                )
                for index, answer in zip(missing, retried):
                    answers[index] = answer
                if acks is not None and retried_acks is not None:
                    acks = min(acks, retried_acks)
            for answer in answers:
                if isinstance(answer, Exception):
                    raise answer
            replies.extend(answers)
            if acks is not None:
                acknowledged = acks if acknowledged is None else min(acknowledged, acks)
        if acknowledged is not None:
            replies.append(acknowledged)
        return replies

    def _pipeline(
        self,
        calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]],
        *,
        by_hash: bool,
        wait: bool,
    ) -> tuple[list[Any], Optional[int]]:
        pipe = self.client.pipeline(transaction=False)
        for script, keys, argv in calls:
            if by_hash:
                pipe.execute_command("EVALSHA", script.sha, *script.args(keys, argv))
            else:
                pipe.execute_command("EVAL", script.lua, *script.args(keys, argv))
        if wait and self.wait_for_replicas is not None:
            replicas, timeout = self.wait_for_replicas
            pipe.execute_command("WAIT", replicas, _millis(timeout))
        answers = list(pipe.execute(raise_on_error=False))
        if not wait:
            return answers, None
        acks = answers.pop()
        if isinstance(acks, Exception):
            raise acks
        return answers, int(acks)

    @staticmethod
    def _is_noscript(answer: Any) -> bool:
        from redis.exceptions import NoScriptError

        return isinstance(answer, NoScriptError)

    def _replication_error(self, acknowledged: int, what: str) -> ReplicationError:
        assert self.wait_for_replicas is not None
        replicas, timeout = self.wait_for_replicas
        return ReplicationError(
            f"{what}: {acknowledged} of {replicas} replica(s) acknowledged within {timeout}s",
            replicas=replicas,
            acknowledged=acknowledged,
        )

    # -- primitives ----------------------------------------------------------------------------

    def _answer_wake(self, key: str, keys: list[str], argv: list[Any], keep_turn: bool) -> int:
        """When this process was woken for ``key``, make the attempt being built answer the
        wake (see the scripts): if it wins, the next release wakes a waiter again; if it loses
        and ``keep_turn``, the store keeps the turn for the milliseconds returned (``0``: the
        turn is given up, or the attempt answers no wake)."""
        kept = self._turns.answering(key, keep_turn)
        if kept is None:
            return 0
        keys.append(handoff_keys(key)[0])
        argv += ["1", kept]
        return kept

    def _grant(self, key: str, token: str, ttl: float, owner: str, fenced: bool) -> Optional[str]:
        ms = _millis(ttl)
        argv = [f"{token}|", ms, owner, "1" if fenced else "0", max(_COUNTER_LIFETIME_MS, ms)]
        keys = [key, self._fence_key(key)] if fenced else [key]
        if not self._answer_wake(key, keys, argv, keep_turn=True):
            return self._ask_grant(key, token, keys, argv)
        try:
            fence = self._ask_grant(key, token, keys, argv)
        except BaseException:
            self._turns.answered(key, lost=False)
            raise
        self._turns.answered(key, lost=fence is None)
        return fence

    def _ask_grant(
        self, key: str, token: str, keys: list[str], argv: list[Any], script: Script = _scripts.ACQUIRE
    ) -> Optional[str]:
        """Run ACQUIRE (or ``script``, which answers like it): the fence as text (``""``
        unfenced) on a grant, ``None`` on contention."""
        if self.wait_for_replicas is None:
            reply = script(self._commands, keys, argv)
            return None if reply is None else reply.decode("ascii")
        reply, acknowledged = self._batch([(script, keys, argv)], wait=True)
        if reply is None:
            return None
        if acknowledged < self.wait_for_replicas[0]:
            # A grant the replicas may not have could vanish in a failover: give it back.
            self.release(key, token)
            raise self._replication_error(acknowledged, f"acquiring {key!r}")
        return str(reply.decode("ascii"))

    @_reports_unavailable
    def acquire(self, key: str, token: str, ttl: float, owner: str) -> bool:
        """Grant ``key`` to ``token`` (or renew it for the same token) in one script."""
        return self._grant(key, token, ttl, owner, fenced=False) is not None

    @_reports_unavailable
    def acquire_fenced(self, key: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Grant ``key`` with a fence of at least the server time in microseconds.

        The fence is larger than the key's counter and than the server clock, and is taken in
        the same script as the grant; a same-token re-acquire returns the fence it has.
        """
        fence = self._grant(key, token, ttl, owner, fenced=True)
        return None if fence is None else int(fence)

    @_reports_unavailable
    def acquire_counted(self, key: str, token: str, ttl: float, owner: str, limit: int) -> Optional[int]:
        """Grant ``token`` one of the ``limit`` places of ``key`` (or renew its own) in one
        script: the places are a hash under the key's name, judged on the server's clock, and
        a new place's fence comes from the key's fence counter, as for an exclusive grant."""
        ms = _millis(ttl)
        argv: list[Any] = [f"{token}|", ms, owner, limit, max(_COUNTER_LIFETIME_MS, ms)]
        keys = [key, self._fence_key(key)]
        # A counting waiter keeps no turn: its line does not try again on its own (see
        # AnnouncedLine), so a loss lets the next release wake a waiter at once.
        self._answer_wake(key, keys, argv, keep_turn=False)
        try:
            fence = self._ask_grant(key, token, keys, argv, _scripts.ACQUIRE_COUNTED)
        except ResponseError as exc:
            code, _, held = str(exc).partition(" ")
            if code != LIMIT_HELD or not held.isdigit():
                raise
            raise limit_mismatch(key, limit, int(held)) from None
        return None if fence is None else int(fence)

    @_reports_unavailable
    def adopt(self, key: str, claim_token: str, token: str, ttl: float, owner: str) -> Optional[int]:
        """Replace the claim ``claim_token`` on ``key`` (or a free key) with a new fenced grant:
        one script, the fence counter in the key's hash slot as for every fenced grant."""
        ms = _millis(ttl)
        argv = [f"{token}|", ms, owner, f"{claim_token}|", max(_COUNTER_LIFETIME_MS, ms)]
        fence = self._ask_grant(key, token, [key, self._fence_key(key)], argv, _scripts.ADOPT)
        return None if fence is None else int(fence)

    @_reports_unavailable
    def grant_if_free(self, key: str, token: str, ttl: float, owner: str) -> Union[int, LockState]:
        """Grant a key no lease holds, else read its state: one script, one round trip.

        With ``wait_for_replicas`` it reads, then grants through :meth:`acquire_fenced` (which
        waits for the replicas).
        """
        if self.wait_for_replicas is not None:
            return super().grant_if_free(key, token, ttl, owner)
        ms = _millis(ttl)
        argv = [f"{token}|", ms, owner, "1", max(_COUNTER_LIFETIME_MS, ms)]
        keys = [key, self._fence_key(key)]
        # The lock service's waiting requests answer a wake too, but keep no turn: they wait
        # for the next wake instead.
        self._answer_wake(key, keys, argv, keep_turn=False)
        reply = _scripts.GRANT_IF_FREE(self._commands, keys, argv)
        if isinstance(reply, list):
            return self._state(key, reply)
        return int(reply)

    def _release_call(self, key: str, token: Optional[str]) -> tuple[list[str], list[Any]]:
        """The keys and arguments of RELEASE (``token``'s release) or FORCE_RELEASE (``None``)."""
        keys = [key, *handoff_keys(key), fence_key(key), *line_keys(key)]
        argv: list[Any] = [self._channel, key, WAKE_MS, OUTSTANDING_MS, _COUNTER_LIFETIME_MS]
        if token is not None:
            argv.insert(0, f"{token}|")
        return keys, argv

    @_reports_unavailable
    def release(self, key: str, token: str) -> bool:
        """Delete ``key`` if ``token`` holds it and announce the release to watchers.

        A client built by :meth:`from_url` tries again on a fresh connection after a
        connection error or a timeout. When such a retry no longer finds the token on the key,
        the answer is ``True`` (released): the failed try may have run the script and lost
        only its reply (a waiter may even hold the key again by then), and nothing left in
        Redis tells that from a loss; reporting a loss would be wrong in that common case.
        It can hide a loss only when the lease ran out or was force-released during that one
        failing call. (A client passed in retries as it was configured, unseen here.)
        """
        keys, argv = self._release_call(key, token)
        if not self._counts_retries:
            return bool(_scripts.RELEASE(self._commands, keys, argv))
        start_counting_retries()
        reply = _scripts.RELEASE(self._commands, keys, argv)
        return bool(reply) or retries_seen() > 0

    @_reports_unavailable
    def extend(self, key: str, token: str, ttl: float) -> bool:
        """Replace the lease of ``key`` with ``ttl`` seconds from now if ``token`` holds it."""
        return self.extend_many([ExtendRequest(key, token, ttl)])[0]

    @_reports_unavailable
    def extend_many(self, requests: Sequence[ExtendRequest]) -> list[bool]:
        """Extend several leases in pipelined round trips; one answer per request, in order.

        With ``wait_for_replicas`` one ``WAIT`` covers the whole batch, and too few
        acknowledgements raise :class:`~lease_lock.errors.ReplicationError` for all of it.
        """
        if not requests:
            return []
        calls = [
            (_scripts.EXTEND, [item.key], [f"{item.token}|", _millis(item.ttl)])
            for item in requests
        ]
        if self.wait_for_replicas is None and len(calls) == 1:
            script, keys, argv = calls[0]
            return [bool(script(self._commands, keys, argv))]
        replies = self._batch(calls, wait=True)
        if self.wait_for_replicas is not None:
            acknowledged = replies.pop()
            if acknowledged < self.wait_for_replicas[0]:
                raise self._replication_error(acknowledged, f"extending {len(requests)} lease(s)")
        return [bool(reply) for reply in replies]

    @_reports_unavailable
    def is_held(self, key: str, token: str) -> bool:
        """``True`` if ``token`` holds a live lease on ``key`` (one ``GET``), or a live place
        of it when ``key`` is a counting key (which ``GET`` refuses; then one script more)."""
        try:
            value = self._commands.execute_command("GET", key)
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            return bool(_scripts.IS_HELD_PLACE(self._commands, [key], [token]))
        parsed = _parse_value(value)
        return parsed is not None and parsed[0] == token

    def _state(self, key: str, reply: Sequence[Any]) -> LockState:
        value, pttl, seconds, micros = reply
        if isinstance(value, list):
            return _counting_state(key, value, int(seconds), int(micros))
        parsed = _parse_value(value)
        # PTTL is -2 for a missing key; -1 (no expiry) is never written by this backend.
        if parsed is None or int(pttl) == -2:
            return LockState.free(key)
        _token, fence, owner = parsed
        if int(pttl) < 0:
            return LockState(key=key, held=True, fence=fence, owner=owner)
        now = int(seconds) + int(micros) / 1_000_000
        return LockState(
            key=key,
            held=True,
            expires_at=datetime.fromtimestamp(now + int(pttl) / 1000, tz=timezone.utc),
            fence=fence,
            owner=owner,
            expires_in=int(pttl) / 1000,
        )

    @_reports_unavailable
    def inspect(self, key: str) -> LockState:
        """The holder's fence, owner and remaining lease (PTTL), or every place of a counting
        key, read in one script."""
        return self._state(key, _scripts.INSPECT(self._commands, [key], ["0"]))

    @_reports_unavailable
    def force_release(self, key: str) -> bool:
        """Delete ``key`` (every place of a counting key) whoever holds it and announce the
        release to watchers."""
        keys, argv = self._release_call(key, None)
        return bool(_scripts.FORCE_RELEASE(self._commands, keys, argv))

    def close(self) -> None:
        """Stop the watchers this backend started; close the client if it built it."""
        self._announcements.close()
        with self._watchers_lock:
            watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            watcher.close()
        self._commands.close()
        if self._close_client:
            self.client.close()
            # redis-py before 5.0 leaves the pool of a client it built from a URL open on close();
            # later releases have already disconnected it, and a second disconnect is a no-op.
            pool = getattr(self.client, "connection_pool", None)
            if pool is not None:
                pool.disconnect()
            # A sentinel:// URL also built the clients that ask the sentinels where the primary
            # is; recent redis-py no longer closes them when they are collected.
            for sentinel_client in getattr(getattr(pool, "sentinel_manager", None), "sentinels", ()):
                sentinel_client.close()
                sentinel_client.connection_pool.disconnect()

    # -- optional capabilities -----------------------------------------------------------------

    @_reports_unavailable
    def scan(self, prefix: str) -> Iterator[LockState]:
        """Held keys starting with ``prefix``, sorted; SCAN on every primary, then pipelined reads.

        Not a snapshot: a key granted or released during the scan may or may not be listed.
        """
        pattern = _escape_glob(prefix) + "*"
        # Leases are strings and counting keys hashes: every type is listed, and the backend's
        # own structures (some of which are hashes too) are left out by their names.
        names = sorted(
            {name.decode("utf-8", "replace") for name in self.client.scan_iter(match=pattern, count=1000)}
        )
        names = [name for name in names if name.startswith(prefix) and store_structure(name) is None]
        replies = self._batch([(_scripts.INSPECT, [name], ["1"]) for name in names], wait=False)
        states = [self._state(name, reply) for name, reply in zip(names, replies)]
        return iter([state for state in states if state.held])

    def watch_releases(self, callback: Callable[[str], None]) -> ReleaseWatcher:
        """Call ``callback(key)`` for every release and force release in this database.

        Each watcher holds one pub/sub connection on a thread of its own and reconnects when it
        drops (``active`` is ``False`` meanwhile).
        """
        watcher = RedisReleaseWatcher(self.client, self._channel, callback)
        with self._watchers_lock:
            self._watchers = [item for item in self._watchers if not item.closed] + [watcher]
        return watcher

    @property
    def handoff_ready(self) -> bool:
        """Whether :meth:`watch_handoffs` can serve: not on a Cluster, where one ``BLPOP``
        cannot wait on keys of several hash slots."""
        return not self._cluster

    def watch_handoffs(self, callback: Callable[[str], bool]) -> HandoffWatcher:
        """Wake one waiting process per release (see :mod:`lease_lock.backends.handoff`).

        Each watcher blocks in ``BLPOP`` on a connection of the client's pool, on a thread of
        its own, and retries with a growing pause when the connection drops.
        """
        if self._cluster:
            raise NotImplementedError("wake-one hand-off needs a single Redis server, not a Cluster")

        def deliver(key: str) -> bool:
            # Noted before the waiter wakes, since its attempt may start at once.
            self._turns.woken(key)
            taken = callback(key)
            if not taken:
                self._turns.unwoken(key)
            return taken

        watcher = RedisHandoffWatcher(self.client, handoff_keys, deliver, _translate_unavailable, self._turns)
        with self._watchers_lock:
            self._watchers = [item for item in self._watchers if not item.closed] + [watcher]
        return watcher

    def call_budget(self, seconds: float) -> ContextManager[None]:
        """Bound this thread's commands inside the block to ``seconds`` plus ``CALL_MARGIN``
        (0.5 s) in all, retries and reconnects included: a command with no reply by then raises
        ``BackendUnavailableError``. Clients whose commands go through ``execute_command``
        (a Cluster, RESP3, a single-connection or caching client) and the ``WAIT`` batch of
        ``wait_for_replicas`` keep their own socket timeouts."""
        return self._commands.budget.block(seconds)

    def join_line(
        self, key: str, token: str, ttl: float, owner: str, fenced: bool, clock: Callable[[], float],
        limit: int = 1,
    ) -> Optional[WaitingLine]:
        """A waiting line for ``key`` (see :meth:`Backend.join_line`).

        A direct line where it can be had: a release hands the key straight to the first live
        waiter in line, who is blocked in ``BLPOP`` on a connection of the client's pool. At
        most :data:`~lease_lock.backends.line.LINE_WAITERS` threads of one backend wait this
        way at once, and none on a Cluster (one grant list per waiter cannot share every key's
        hash slot) or on a server older than Redis 6 (``BLPOP`` takes whole seconds there).
        Other waiters are woken by the backend's shared watcher (wake-one, or the release
        channel on a Cluster; see :class:`~lease_lock.backends.line.AnnouncedLine`), and so are
        the waiters for a place of a counting key (``limit`` > 1), whose releases announce
        themselves the same way.
        """
        if limit > 1 or not self._lines_usable() or not self._line_slots.take():
            return AnnouncedLine(self._announcements, self, key, token, ttl, owner, fenced, clock, limit)
        claim = claim_for(ttl)
        ms, claim_ms = _millis(ttl), _millis(claim)
        granted = GRANTED_PREFIX + token
        join_keys = [key, fence_key(key), *line_keys(key), granted]
        join_argv = [
            f"{token}|", ms, owner, "1" if fenced else "0", max(_COUNTER_LIFETIME_MS, ms), claim_ms,
            _millis(claim * FRESH_SHARE), token, _millis(BURST),
        ]
        leave_keys, leave_argv = self._release_call(key, token)
        line = RedisWaitingLine(
            self._commands,
            join=(join_keys, join_argv),
            leave=([*leave_keys, granted], [*leave_argv, token]),
            granted=granted,
            ttl=ttl,
            claim=claim,
            clock=clock,
            translate=_translate_unavailable,
            slots=self._line_slots,
        )
        line.watch_lease(lambda: self.inspect(key).expires_in)
        return line

    def _lines_usable(self) -> bool:
        usable = self._lines_ok
        if usable is None:
            if self._cluster:
                usable = False
            else:
                try:
                    version = str(self.client.info("server").get("redis_version", "0"))
                except Exception as exc:  # noqa: BLE001 - no line; the waiter waits as before
                    if _is_unavailable(exc):
                        return False  # asked again by the next waiter
                    # A user whose ACL forbids INFO: waiters wait without a line from now on.
                    version = "0"
                usable = int(version.split(".", 1)[0] or 0) >= 6
            self._lines_ok = usable
        return usable

    @_reports_unavailable
    def count_in_window(self, name: str, window: float, amount: int = 1) -> tuple[int, float]:
        """Add ``amount`` to ``name`` in the current window, atomically on the server clock.

        The counter is the hash ``lease_lock:window:<name>``; it expires a second after its
        window ends.
        """
        if not isinstance(name, str) or not name:
            raise ValidationError("name must be a non-empty str")
        micros = round(check_duration(window, "window") * 1_000_000)
        if micros < 1000:
            raise ValidationError("window must be at least 0.001 seconds")
        check_amount(amount)
        count, left = _scripts.COUNT_IN_WINDOW(self._commands, [_COUNTER_PREFIX + name], [micros, amount])
        return int(count), int(left) / 1_000_000

    # -- validation hooks ----------------------------------------------------------------------

    def check_key(self, key: str) -> None:
        """Refuse keys named like one of the backend's own structures (a structure beside
        another key, see :func:`beside`; a rate counter, a hand-off control list, a grant list),
        and on a Cluster keys whose structures could not share their hash slot."""
        what = store_structure(key)
        if what is not None:
            structures = "|".join(_BESIDE_KEY)
            raise ValidationError(
                f"key {key!r} is the name of a {what} of lease_lock on Redis; choose a key that "
                f"is neither '<key with a hash tag>:{{{structures}}}' nor '{{<key>}}/{{{structures}}}' "
                f"and does not start with {', '.join(repr(prefix) for prefix in _RESERVED_PREFIXES)}"
            )
        self._fence_key(key)
