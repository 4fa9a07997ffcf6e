"""Service keys: a TOML file of hashed keys, each bound to one project and one scope.

A key looks like ``llk_<id>.<secret>``: the id (12 hex digits) finds the record without
revealing anything, and only the SHA-256 of the whole key is stored, compared in constant time.
The secret is 32 random bytes, so a plain (unsalted, fast) hash is enough: there is nothing to
guess. The file is rewritten atomically (temporary file + rename, mode 0600) under an advisory
lock, and a running server notices a new version by its ``stat`` signature, without a restart.

The file::

    [keys.0f3a9c61b2d4]
    project = "billing"
    scope = "locks.manage"
    sha256 = "<64 hex digits>"
    created = 2026-11-30T12:00:00Z
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from ..errors import ValidationError
from ..validation import install_hint

__all__ = [
    "SCOPES",
    "KeyFile",
    "KeyRecord",
    "create_key",
    "list_keys",
    "revoke_key",
]

#: Scopes a key may carry. ``locks.read`` may only read; the others may do everything.
SCOPES = ("locks.read", "locks.manage", "full")
_PROJECT_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY_PATTERN = re.compile(r"llk_(?P<id>[0-9a-f]{12})\.[A-Za-z0-9_-]{43}")
_ID_PATTERN = re.compile(r"[0-9a-f]{12}")
_log = logging.getLogger("lease_lock.server")

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class KeyRecord:
    """One stored key: never the key itself, only its hash."""

    id: str
    project: str
    scope: str
    created: datetime
    sha256: str = ""

    def allows(self, write: bool) -> bool:
        """``True`` if this key's scope permits a read (``write=False``) or a write."""
        return self.scope in ("locks.manage", "full") or (not write and self.scope == "locks.read")


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python < 3.11 only
        try:
            import tomli as tomllib
        except ImportError as exc:
            raise ValidationError(f"reading a keys file needs tomli: {install_hint('server')}") from exc
    with path.open("rb") as handle:
        return tomllib.load(handle)


def _records(data: dict[str, Any], path: Path) -> dict[str, KeyRecord]:
    table = data.get("keys", {})
    if not isinstance(table, dict):
        raise ValidationError(f"keys file {path}: [keys] must be a table")
    records: dict[str, KeyRecord] = {}
    for key_id, entry in table.items():
        try:
            created = entry["created"]
            if not isinstance(created, datetime):
                created = datetime.fromisoformat(str(created))
            record = KeyRecord(
                id=key_id,
                project=str(entry["project"]),
                scope=str(entry["scope"]),
                created=created,
                sha256=str(entry["sha256"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(
                f"keys file {path}: entry {key_id!r} is malformed ({exc})"
            ) from exc
        if record.scope not in SCOPES:
            raise ValidationError(f"keys file {path}: entry {key_id!r} has unknown scope")
        if not _PROJECT_PATTERN.fullmatch(record.project):
            # A "/" would reach into another project's namespace in the store.
            raise ValidationError(
                f"keys file {path}: entry {key_id!r} has an invalid project "
                "(1 to 64 of letters, digits, '.', '_', '-')"
            )
        records[key_id] = record
    return records


def _read(path: Path) -> dict[str, KeyRecord]:
    if not path.exists():
        return {}
    return _records(_load_toml(path), path)


def _write(path: Path, records: dict[str, KeyRecord]) -> None:
    try:
        import tomli_w
    except ImportError as exc:
        raise ValidationError(f"writing a keys file needs tomli-w: {install_hint('server')}") from exc

    document = {
        "keys": {
            record.id: {
                "project": record.project,
                "scope": record.scope,
                "sha256": record.sha256,
                "created": record.created,
            }
            for record in records.values()
        }
    }
    text = "# lease-lock service keys: hashes only; manage with `lease-lock service-keys`.\n"
    text += tomli_w.dumps(document)
    directory = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o600)
        # The rename is atomic, so a server reloading at any moment sees the old or the new file.
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Serialise read-modify-write cycles of ``service-keys create`` / ``revoke`` on one file."""
    import fcntl

    with open(f"{path}.lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def create_key(path: PathLike, project: str, scope: str) -> tuple[KeyRecord, str]:
    """Add a key for ``project`` with ``scope``; return its record and the key (shown once)."""
    if not isinstance(project, str) or not _PROJECT_PATTERN.fullmatch(project):
        raise ValidationError(
            "project must be 1 to 64 characters of letters, digits, '.', '_', '-'"
        )
    if scope not in SCOPES:
        raise ValidationError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    file = Path(path)
    with _exclusive(file):
        records = _read(file)
        key_id = secrets.token_hex(6)
        while key_id in records:
            key_id = secrets.token_hex(6)
        key = f"llk_{key_id}.{secrets.token_urlsafe(32)}"
        record = KeyRecord(
            id=key_id,
            project=project,
            scope=scope,
            created=datetime.now(timezone.utc).replace(microsecond=0),
            sha256=_hash(key),
        )
        records[key_id] = record
        _write(file, records)
    return record, key


def list_keys(path: PathLike) -> list[KeyRecord]:
    """The stored keys, oldest first (new keys are appended to the file)."""
    return list(_read(Path(path)).values())


def revoke_key(path: PathLike, key_id: str) -> bool:
    """Delete key ``key_id``; ``False`` when there was no such key."""
    if not isinstance(key_id, str) or not _ID_PATTERN.fullmatch(key_id):
        raise ValidationError("key id must be the 12 hex digits `service-keys list` shows")
    file = Path(path)
    with _exclusive(file):
        records = _read(file)
        if records.pop(key_id, None) is None:
            return False
        _write(file, records)
    return True


def _still_listed(path: Path, previous: dict[str, KeyRecord]) -> dict[str, KeyRecord]:
    """The ``previous`` records whose id and hash both still occur in the text of ``path``."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return {
        key_id: record
        for key_id, record in previous.items()
        if f"keys.{key_id}]" in text and record.sha256 in text
    }


class KeyFile:
    """The keys file as a running server sees it, re-read whenever it changes on disk.

    A file that disappears means no key is valid (fail closed). A file that cannot be parsed
    is logged as an error and keeps in force only those previous keys whose id and hash still
    appear in its text: an operator's typo does not lock every client out, and a key the
    operator removed in the same edit stops working at once (fail closed for removed keys).
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self._file = os.fspath(self.path)
        if not self.path.exists():
            raise ValidationError(f"keys file {self.path} does not exist (create a key first)")
        try:
            _read(self.path)  # a file broken from the start is a setup error, not a reload problem
        except ValidationError:
            raise
        except (OSError, ValueError) as exc:
            raise ValidationError(f"keys file {self.path} cannot be read: {exc}") from exc
        self._mutex = threading.Lock()
        # The file's stat signature when last read, and its records: one tuple, read and
        # replaced whole, so that a request whose file is unchanged needs no lock.
        self._loaded: tuple[Optional[tuple[int, int, int]], dict[str, KeyRecord]] = (None, {})
        # The records the keys below passed against, and those keys with their records.
        self._passed: tuple[dict[str, KeyRecord], dict[str, KeyRecord]] = ({}, {})
        self._refresh()

    def _refresh(self) -> dict[str, KeyRecord]:
        try:
            # ``os.stat`` on the text of the path: a third cheaper than ``Path.stat``, and this
            # runs on every request.
            stat = os.stat(self._file)
        except FileNotFoundError:
            signature = None
        else:
            signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        known, records = self._loaded
        if signature == known:
            return records
        with self._mutex:
            known, records = self._loaded  # another thread may have read the file meanwhile
            if signature == known:
                return records
            try:
                records = _read(self.path) if signature is not None else {}
            except (OSError, ValueError) as exc:
                records = _still_listed(self.path, records)
                _log.error(
                    "keys file %s is invalid and was not reloaded: %s; keeping %d of the previous "
                    "keys (those still in the file), fix the file to restore the others",
                    self.path,
                    exc,
                    len(records),
                )
            self._loaded = (signature, records)
            return records

    def authenticate(self, key: str) -> Optional[KeyRecord]:
        """The record of ``key``, or ``None`` when it is malformed, unknown or revoked."""
        records = self._refresh()
        checked, passed = self._passed  # one tuple, read and replaced whole: thread-safe
        if checked is records:
            # A key seen to pass against these very records passes again: a client sends the
            # same key with every request. The lookup compares a presented key with a kept one
            # only when their (randomly seeded) hashes match, so it tells a guesser nothing.
            record = passed.get(key)
            if record is not None:
                return record
        match = _KEY_PATTERN.fullmatch(key)
        if match is None:
            return None
        record = records.get(match["id"])
        if record is None or not hmac.compare_digest(record.sha256, _hash(key)):
            return None
        if checked is not records:
            # The file was read again: every key is checked anew against what it holds now.
            passed = {}
            self._passed = (records, passed)
        passed[key] = record  # only keys that passed: at most one per key of the file
        return record
