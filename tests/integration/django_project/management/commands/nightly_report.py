"""A command that must not run twice at once; it waits on the test's gate while it runs."""

from __future__ import annotations

from typing import Any

from lease_lock.contrib.django import SingletonCommand

from ... import gate

__all__ = ["Command"]


class Command(SingletonCommand):
    """Records its run, then holds the lock until the test lets it finish."""

    help = "Build the nightly report (test command)."

    def handle(self, *args: Any, **options: Any) -> None:
        assert self.lock is not None
        gate.runs.append(self.lock.key)
        gate.started.set()
        if not gate.proceed.wait(30):
            raise RuntimeError("the test never let the command finish")
        self.stdout.write("report built")
