"""``service-keys create|list|revoke`` and ``serve`` as commands, run as real child processes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import requests
from lease_lock.server.keys import list_keys
from lease_lock.testing import wait_until
from lease_lock.validation import install_hint

from tests.support.http_server import start_serve, stop_serve


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lease_lock.server", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_keys_create_prints_only_the_key_and_stores_only_a_hash(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    created = _run(
        "service-keys", "create", "--keys", str(keys_file), "--project", "billing", "--scope", "locks.manage"
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert created.stdout == key + "\n" and key.startswith("llk_")
    text = keys_file.read_text()
    assert key not in text and key.split(".", 1)[1] not in text
    assert keys_file.stat().st_mode & 0o077 == 0
    [record] = list_keys(keys_file)
    assert (record.project, record.scope) == ("billing", "locks.manage")


def test_keys_list_and_revoke(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    secrets = [
        _run("service-keys", "create", "--keys", str(keys_file), "--project", "p", "--scope", scope).stdout.strip()
        for scope in ("full", "locks.read")
    ]
    listed = _run("service-keys", "list", "--keys", str(keys_file), "--json")
    rows = json.loads(listed.stdout)
    assert [(row["project"], row["scope"]) for row in rows] == [("p", "full"), ("p", "locks.read")]
    table = _run("service-keys", "list", "--keys", str(keys_file)).stdout
    assert all(secret not in table and secret not in listed.stdout for secret in secrets)
    assert rows[0]["id"] in table
    assert _run("service-keys", "revoke", "--keys", str(keys_file), rows[0]["id"]).returncode == 0
    assert [record.id for record in list_keys(keys_file)] == [rows[1]["id"]]
    missing = _run("service-keys", "revoke", "--keys", str(keys_file), rows[0]["id"])
    assert missing.returncode == 1 and "no key" in missing.stderr


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    bad_project = _run(
        "service-keys", "create", "--keys", str(tmp_path / "k.toml"), "--project", "a b", "--scope", "full"
    )
    assert bad_project.returncode == 2 and bad_project.stderr.count("\n") == 1
    bad_scope = _run("service-keys", "create", "--keys", str(tmp_path / "k.toml"), "--project", "a", "--scope", "root")
    assert bad_scope.returncode == 2
    no_keys = _run("serve", "--url", "memory://", "--keys", str(tmp_path / "absent.toml"), "--bind", "127.0.0.1:0")
    assert no_keys.returncode == 2 and "does not exist" in no_keys.stderr
    bad_bind = _run("serve", "--url", "memory://", "--keys", str(tmp_path / "absent.toml"), "--bind", "nowhere")
    assert bad_bind.returncode == 2 and "--bind" in bad_bind.stderr


def test_serve_logs_requests_but_never_keys_or_tokens(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    key = _run("service-keys", "create", "--keys", str(keys_file), "--project", "p", "--scope", "full").stdout.strip()
    process, url, log = start_serve(tmp_path, "memory://", keys_file)
    token = str(uuid.uuid4())
    try:
        response = requests.post(
            f"{url}/locks/job/lease",
            json={"ttl_seconds": 10},
            headers={"Authorization": f"Bearer {key}", "X-Volcano-Lock-Token": token},
            timeout=10,
        )
        assert response.status_code == 201
        requests.get(f"{url}/locks/job", headers={"Authorization": "Bearer wrong-" + key}, timeout=10)
        # A request's access line is written as its answer is closed, moments after it was sent.
        assert wait_until(lambda: "GET /locks/{key} -> 401" in log.read_text(), 10)
    finally:
        stop_serve(process)
    text = log.read_text()
    assert "POST /locks/{key}/lease -> 201 project=p" in text
    assert "/locks/job" not in text  # route templates only: lock names stay out of the log
    assert key.split(".", 1)[1] not in text and token not in text


def test_serve_without_waitress_names_the_extra_and_exits_2(tmp_path: Path) -> None:
    from tests.support.http_server import make_keys

    keys_file = tmp_path / "keys.toml"
    make_keys(keys_file)
    # ``None`` in sys.modules makes ``import waitress`` fail as if it were not installed.
    program = (
        "import sys; sys.modules['waitress'] = None; from lease_lock.cli import main; "
        f"sys.exit(main(['serve', '--url', 'memory://', '--keys', {str(keys_file)!r}, '--bind', '127.0.0.1:0']))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert install_hint("server") in done.stderr and "Traceback" not in done.stderr


def test_service_keys_creates_a_key_and_keys_is_no_command(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    for command, status in (("keys", 2), ("service-keys", 0)):
        run = subprocess.run(
            [sys.executable, "-m", "lease_lock", command, "create", "--keys", str(keys_file), "--project", "p",
             "--scope", "full"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert run.returncode == status, run.stderr
    assert run.stdout.startswith("llk_") and run.stderr == ""
    assert len(list_keys(keys_file)) == 1


def test_service_keys_without_the_server_extra_names_the_extra_and_exits_2(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    program = (
        "import sys; sys.modules['tomli_w'] = None; from lease_lock.cli import main; "
        f"sys.exit(main(['service-keys', 'create', '--keys', {str(keys_file)!r}, '--project', 'p', '--scope', 'full']))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"lease-lock: writing a keys file needs tomli-w: {install_hint('server')}"]
    assert not keys_file.exists()
