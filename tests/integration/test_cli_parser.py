"""The ``lease-lock`` parser in-process: the subcommand registry other modules use, the ``--``
split, durations and the exit statuses of ``main`` for expected failures."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from lease_lock import cli
from lease_lock.backends.sqlite import SqliteBackend


@pytest.fixture
def registry() -> Iterator[None]:
    """Restore the command registry after a test adds to it."""
    cli.build_parser()  # import the listed modules first, so that what they register is kept
    saved_commands, saved_modules = dict(cli.COMMANDS), list(cli.COMMAND_MODULES)
    yield
    cli.COMMANDS.clear()
    cli.COMMANDS.update(saved_commands)
    cli.COMMAND_MODULES[:] = saved_modules


def test_builtin_commands_are_registered() -> None:
    assert list(cli.COMMANDS)[:3] == ["run", "status", "force-release"]


@pytest.mark.usefixtures("registry")
def test_another_module_can_register_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=8080)
        cli.add_url_argument(parser)
        parser.add_argument("--every", type=cli.duration("--every"), default=1.0)

    def run(args: argparse.Namespace) -> int:
        print(f"serving on {args.port} every {args.every} from {args.url}")
        return 3

    cli.register_command("serve", help="serve the lock API", add_arguments=add_arguments, run=run)
    assert cli.main(["serve", "--port", "9000", "--every", "2m", "--url", "memory://"]) == 3
    assert capsys.readouterr().out == "serving on 9000 every 120.0 from memory://\n"
    assert "serve" in cli.build_parser().format_help()


@pytest.mark.usefixtures("registry")
def test_command_modules_are_imported_when_the_parser_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "lease_lock_test_plugin_cmd.py"
    module.write_text(
        "from lease_lock import cli\n"
        "cli.register_command('hello', help='say hello', add_arguments=lambda p: None,"
        " run=lambda args: 0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cli.COMMAND_MODULES.append("lease_lock_test_plugin_cmd")
    assert "hello" not in cli.COMMANDS
    cli.build_parser()
    assert "hello" in cli.COMMANDS
    assert cli.main(["hello"]) == 0


def test_bad_command_names_are_refused() -> None:
    with pytest.raises(ValueError, match="command name"):
        cli.register_command("--x", help="", add_arguments=lambda p: None, run=lambda a: 0)


@pytest.mark.usefixtures("registry")
def test_command_errors_become_one_line_and_a_status(capsys: pytest.CaptureFixture[str]) -> None:
    def fail(args: argparse.Namespace) -> int:
        raise cli.CommandError("it went wrong", 42)

    def unexpected(args: argparse.Namespace) -> int:
        raise RuntimeError("boom\nsecond line")

    cli.register_command("fail", help="", add_arguments=lambda p: None, run=fail)
    cli.register_command("unexpected", help="", add_arguments=lambda p: None, run=unexpected)
    assert cli.main(["fail"]) == 42
    assert capsys.readouterr().err == "lease-lock: it went wrong\n"
    assert cli.main(["unexpected"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "RuntimeError: boom second line" in err


@pytest.mark.parametrize(
    ("argv", "head", "command"),
    [
        (["run", "k", "--", "ls", "-l", "--", "x"], ["run", "k"], ["ls", "-l", "--", "x"]),
        (["run", "k", "--ttl", "5", "--"], ["run", "k", "--ttl", "5"], []),
        (["status", "--", "-odd-key"], ["status", "--", "-odd-key"], []),
        (["--version"], ["--version"], []),
    ],
)
def test_only_run_splits_at_the_double_dash(
    argv: list[str], head: list[str], command: list[str]
) -> None:
    assert cli._split_command(argv) == (head, command)


def test_status_of_a_key_starting_with_a_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    backend = SqliteBackend(tmp_path / "locks.db")
    assert backend.acquire_fenced("-odd", "t" * 32, 60, "someone") is not None
    backend.close()
    assert cli.main(["status", "--json", "--url", url, "--", "-odd"]) == 0
    (state,) = json.loads(capsys.readouterr().out)
    assert state["key"] == "-odd"
    assert state["held"] is True
    assert state["owner"] == "someone"


def test_durations_accept_the_documented_forms() -> None:
    parse = cli.duration("--ttl")
    assert [parse(text) for text in ("30", "30s", "5m", "1h", "2d", "1.5m")] == [
        30.0, 30.0, 300.0, 3600.0, 172800.0, 90.0,
    ]
    with pytest.raises(argparse.ArgumentTypeError, match="--ttl must look like"):
        parse("5 minutes")


def test_listed_command_modules_register_commands() -> None:
    help_text = cli.build_parser().format_help()
    # The HTTP lock service's commands come from a listed module, not from cli.py itself.
    assert "lease_lock.server.cli" in cli.COMMAND_MODULES
    for name in ("serve", "service-keys"):
        assert name in cli.COMMANDS
        assert name in help_text
    # ``keys`` was an alias for a release that never shipped.
    assert "keys" not in cli.COMMANDS
