"""The keys file as the server reads it: a key that passed once is checked again the moment the
file changes, so keeping passed keys never lets a revoked or narrowed key through."""

from __future__ import annotations

from pathlib import Path

from lease_lock.server.keys import KeyFile, create_key, revoke_key


def test_a_key_that_passed_is_refused_on_the_next_check_after_its_revocation(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    revoked, revoked_key = create_key(path, "alpha", "full")
    _kept, kept_key = create_key(path, "alpha", "full")
    keys = KeyFile(path)
    assert keys.authenticate(revoked_key) == revoked
    assert keys.authenticate(revoked_key) == revoked  # passed before: kept
    assert revoke_key(path, revoked.id)
    assert keys.authenticate(revoked_key) is None
    assert keys.authenticate(kept_key) is not None


def test_a_key_whose_scope_is_narrowed_has_the_new_scope_on_the_next_check(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    record, key = create_key(path, "alpha", "full")
    keys = KeyFile(path)
    assert keys.authenticate(key) == record
    path.write_text(path.read_text(encoding="utf-8").replace('"full"', '"locks.read"'), encoding="utf-8")
    narrowed = keys.authenticate(key)
    assert narrowed is not None and narrowed.scope == "locks.read" and not narrowed.allows(True)


def test_a_wrong_secret_never_passes_after_the_right_one_did(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    _record, key = create_key(path, "alpha", "full")
    keys = KeyFile(path)
    assert keys.authenticate(key) is not None
    last = key[-1]
    wrong = key[:-1] + ("A" if last != "A" else "B")
    assert keys.authenticate(wrong) is None
    assert keys.authenticate(key[:-1]) is None
    assert keys.authenticate(key) is not None
