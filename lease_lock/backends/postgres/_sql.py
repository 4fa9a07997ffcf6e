"""Names and SQL of the PostgreSQL backend; no driver import, so ``ddl()`` works anywhere.

Every statement below is headed by its parameters and its result. Identifiers are validated
against a strict pattern and double-quoted; values always travel as driver parameters.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Optional

from ...errors import ValidationError
from ...validation import check_bool

__all__ = ["Names", "ddl", "resolve_names"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: PostgreSQL truncates identifiers longer than NAMEDATALEN - 1 bytes.
_MAX_IDENTIFIER = 63
#: Every derived object appends one of these; all are six characters long.
_SUFFIXES = ("_fence", "_count", "_queue", "_place", "_freed", "_turns", "_woken")
_MAX_TABLE = _MAX_IDENTIFIER - max(len(suffix) for suffix in _SUFFIXES)


def _quote(name: str) -> str:
    return f'"{name}"'


@dataclass(frozen=True)
class Names:
    """The validated, quoted names of one lock table and the objects derived from it.

    ``table``/``sequence``/``counters``/``queue`` (the line of waiters, see ``join_line``) and
    ``places`` (the places of counting keys, see ``acquire_counted``) are
    ready to paste into SQL; ``label`` is the
    human-readable qualified table name; ``channel`` is the NOTIFY channel of releases (tables
    of the same name in different schemas share it, which can only cause an extra wake-up) and
    ``turns_channel`` the one on which a waiting process announces a hand-off turn it gave up;
    ``woken_channel`` the one on which a listener says that a release woke a waiter of its
    process; ``gate`` is
    the first half of the two-int advisory lock that serialises the fenced grants of one key.
    """

    label: str
    table: str
    sequence: str
    sequence_literal: str
    counters: str
    queue: str
    places: str
    channel: str
    turns_channel: str
    woken_channel: str
    gate: int


def resolve_names(table: object, schema: object = None) -> Names:
    """Validate ``table`` (optionally ``schema.table``) and ``schema`` and derive every name."""
    if not isinstance(table, str):
        raise ValidationError(f"table must be a str, not {type(table).__name__}")
    if schema is not None and not isinstance(schema, str):
        raise ValidationError(f"schema must be a str or None, not {type(schema).__name__}")
    if "." in table:
        if schema is not None:
            raise ValidationError(
                f"table {table!r} is already schema-qualified; do not also pass schema="
            )
        schema, _, table = table.partition(".")
    if schema is not None and not _IDENTIFIER.fullmatch(schema):
        raise ValidationError(
            f"schema {schema!r} must be letters, digits and '_' not starting with a digit"
        )
    if schema is not None and len(schema) > _MAX_IDENTIFIER:
        raise ValidationError(f"schema {schema!r} is longer than {_MAX_IDENTIFIER} characters")
    if not _IDENTIFIER.fullmatch(table):
        raise ValidationError(
            f"table {table!r} must be letters, digits and '_' not starting with a digit"
        )
    if len(table) > _MAX_TABLE:
        raise ValidationError(
            f"table {table!r} is longer than {_MAX_TABLE} characters, so '{table}_fence' "
            f"would not fit PostgreSQL's {_MAX_IDENTIFIER}-character identifiers"
        )
    prefix = "" if schema is None else f"{_quote(schema)}."
    label = table if schema is None else f"{schema}.{table}"
    sequence = f"{prefix}{_quote(table + '_fence')}"
    # The gate id must be the same in every process, so it comes from a stable checksum of
    # the table's name, never from Python's per-process randomised hash().
    gate = zlib.crc32(label.encode()) - 2**31
    return Names(
        label=label,
        table=f"{prefix}{_quote(table)}",
        sequence=sequence,
        # The identifier pattern admits no quote, so the name is a safe string literal as is.
        sequence_literal=f"'{sequence}'",
        counters=f"{prefix}{_quote(table + '_count')}",
        queue=f"{prefix}{_quote(table + '_queue')}",
        places=f"{prefix}{_quote(table + '_place')}",
        channel=f"{table}_freed",
        turns_channel=f"{table}_turns",
        woken_channel=f"{table}_woken",
        gate=gate,
    )


def ddl(table: str = "lease_lock", *, schema: Optional[str] = None, unlogged: bool = False) -> list[str]:
    """The statements that create the lock table, its fence sequence, its counters table, its
    line of waiters (``<table>_queue``, always ``UNLOGGED``: see below) and the places of its
    counting keys (``<table>_place``).

    A plain list of SQL strings, each idempotent (``IF NOT EXISTS``), to run in order, for
    example from a Django migration: ``migrations.RunSQL(ddl("lease_lock"))``. The schema, if
    given, must already exist. ``unlogged=True`` makes the lock table ``UNLOGGED`` (faster
    writes; every lease is lost when the server crashes, see the docs). The fence sequence
    starts at the server's clock in microseconds, so a sequence that is ever dropped and
    recreated still hands out larger fences than before.

    The line holds one row per thread waiting in line for a key: its token, owner, claim
    window, whether it is fenced, the channel its waiting connection listens on, the ticket of
    its latest refresh, when it joined and until when its place is fresh (both on the server's
    clock). A release hands the key to the oldest fresh row. The rows need no durability (a
    waiter whose row is lost takes a new place at its next refresh), so the table is
    ``UNLOGGED``: a waiter's refresh then waits for no WAL flush.

    The places table holds one row per holder of a counting key (``limit`` > 1): the key, the
    holder's token, its lease's end, its fence and owner; the key's own row in the lock table
    marks the key as counting (see the docs). It is ``UNLOGGED`` exactly when the lock table
    is. Running the list again on a database made by an older release adds just the tables
    that release lacked.
    """
    names = resolve_names(table, schema)
    check_bool(unlogged, "unlogged")
    kind = "UNLOGGED TABLE" if unlogged else "TABLE"
    return [
        # COLLATE "C": keys compare byte for byte, and prefix scans can use the primary key.
        f"CREATE {kind} IF NOT EXISTS {names.table} ("
        ' key text COLLATE "C" PRIMARY KEY,'
        " token text NOT NULL,"
        " expires_at timestamptz NOT NULL,"
        " fence bigint,"
        " owner text NOT NULL DEFAULT '')",
        # A DO block because CREATE SEQUENCE takes no expression for START. No '%' anywhere, so
        # the strings pass unchanged through drivers that interpolate parameters.
        "DO $lease_lock$ BEGIN EXECUTE"
        f" 'CREATE SEQUENCE IF NOT EXISTS {names.sequence}"
        " MINVALUE 1 MAXVALUE 9007199254740991 START '"
        " || floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint; END $lease_lock$",
        f"CREATE TABLE IF NOT EXISTS {names.counters} ("
        ' name text COLLATE "C" PRIMARY KEY,'
        " window_index bigint NOT NULL,"
        " count bigint NOT NULL)",
        f"CREATE UNLOGGED TABLE IF NOT EXISTS {names.queue} ("
        ' key text COLLATE "C" NOT NULL,'
        " token text NOT NULL,"
        " owner text NOT NULL DEFAULT '',"
        " claim float8 NOT NULL,"
        " fenced boolean NOT NULL,"
        " channel text NOT NULL,"
        " ticket text NOT NULL,"
        " joined timestamptz NOT NULL,"
        " fresh_until timestamptz NOT NULL,"
        " PRIMARY KEY (key, token))",
        f"CREATE {kind} IF NOT EXISTS {names.places} ("
        ' key text COLLATE "C" NOT NULL,'
        " token text NOT NULL,"
        " expires_at timestamptz NOT NULL,"
        " fence bigint NOT NULL,"
        " owner text NOT NULL DEFAULT '',"
        " PRIMARY KEY (key, token))",
    ]
