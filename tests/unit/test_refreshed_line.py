"""The shared wait of a thread in line (:class:`~lease_lock.backends.line.RefreshedLine`), with
a scripted store: what each answer of a block leads to."""

from __future__ import annotations

from typing import Optional, Union

from lease_lock.backends.line import FREED, Freed, Handed, Joined, LineSlots, RefreshedLine


class ScriptedLine(RefreshedLine):
    """Answers its joins and blocks from two scripts and records each call."""

    def __init__(self, joins: list[Joined], blocks: list[Union[Handed, Freed, None]]) -> None:
        super().__init__(ttl=10.0, claim=4.0, clock=lambda: 100.0, translate=lambda _error: None, slots=LineSlots())
        self.joins, self.blocks = joins, blocks
        self.calls: list[str] = []

    def _join(self, sent: float) -> Joined:
        self.calls.append("join")
        return self.joins.pop(0)

    def _block(self, seconds: float) -> Union[Handed, Freed, None]:
        self.calls.append("block")
        return self.blocks.pop(0)

    def _quit(self) -> None:
        self.calls.append("quit")


def test_a_key_gone_free_makes_the_waiter_ask_at_once_instead_of_at_its_next_refresh() -> None:
    line = ScriptedLine([Joined(None), Joined(7)], [FREED])
    grant = line.wait(60)
    assert grant is not None and grant.fence == 7 and not grant.claimed and grant.lease == 10.0
    assert line.calls == ["join", "block", "join"]


def test_a_handed_grant_is_the_claim_window_from_the_latest_refresh() -> None:
    line = ScriptedLine([Joined(None)], [Handed(9, 100.0)])
    grant = line.wait(60)
    assert grant is not None and grant.fence == 9 and grant.claimed and grant.lease == 4.0 and grant.sent == 100.0
    line.leave(True)
    assert line.calls == ["join", "block"]


def test_a_freed_key_taken_by_another_sends_the_waiter_back_to_its_block() -> None:
    handed: Optional[Handed] = Handed(3, 100.0)
    line = ScriptedLine([Joined(None), Joined(None)], [FREED, handed])
    grant = line.wait(60)
    assert grant is not None and grant.fence == 3
    assert line.calls == ["join", "block", "join", "block"]
