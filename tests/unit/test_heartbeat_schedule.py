"""The heartbeat's schedule, rule by rule: the pure functions every lock follows."""

from __future__ import annotations

import math

import pytest
from lease_lock.heartbeat import BeatStep, beat_interval, clamp_to_deadline, next_beat


def test_the_interval_is_a_third_of_the_ttl_unless_one_is_given() -> None:
    assert beat_interval(30.0, None) == pytest.approx(10.0)
    assert beat_interval(30.0, 4.0) == 4.0


@pytest.mark.parametrize("step", ["granted", "extended"])
def test_after_a_grant_or_an_answer_the_next_beat_is_one_interval_after_the_send(step: BeatStep) -> None:
    assert next_beat(step, 100.0, 10.0, extending=True) == 110.0


def test_after_a_failure_the_next_try_comes_after_a_third_of_the_interval() -> None:
    assert next_beat("failed", 100.0, 9.0, extending=True) == pytest.approx(103.0)


@pytest.mark.parametrize("step", ["granted", "extended", "failed"])
def test_a_lock_that_is_not_extending_never_beats(step: BeatStep) -> None:
    assert next_beat(step, 100.0, 10.0, extending=False) == math.inf


def test_each_request_is_cut_to_the_max_hold_deadline() -> None:
    assert clamp_to_deadline(30.0, math.inf, 5.0) == 30.0
    assert clamp_to_deadline(30.0, 20.0, 5.0) == 15.0
    assert clamp_to_deadline(30.0, 20.0, 25.0) <= 0


@pytest.mark.parametrize("extending", [True, False])
def test_a_handed_claim_is_extended_one_claim_interval_after_its_send_even_when_not_extending(
    extending: bool,
) -> None:
    # The claim window ends early unless it is extended once, whatever auto_extend says.
    assert next_beat("claimed", 100.0, 2.0, extending=extending) == 102.0
