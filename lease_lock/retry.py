"""Retry policy for acquisitions.

A :class:`Retry` says how many attempts an acquisition may make after its first, how long to
wait between them and how long the whole acquisition may take. Unset fields (``None``) inherit,
field by field: built-in default <- locker's policy <- call's policy.

The waiting rule: with ``delay`` left unset, a waiter on a store that announces releases pauses
until the announcement or the holder's lease end (never polling); on a store that announces
nothing it pauses :data:`~lease_lock.clock.QUIET_PAUSE` (0.2 s). A ``delay`` (or delay function) the caller or the
Locker sets is honoured as written: it bounds every pause, and an announcement ends a pause
early. ``retries`` and ``timeout`` bound every wait on every store.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Optional, Union

from .clock import QUIET_PAUSE
from .errors import ValidationError
from .validation import check_bool, check_duration

__all__ = ["DEFAULT_RETRY", "Delay", "Retry", "RetryState", "exponential_backoff"]

#: The jitter's own generator: waiting threads leave the program's global ``random`` state alone.
_JITTER = random.Random()


@dataclass(frozen=True)
class RetryState:
    """What a delay function is told: attempts made so far (from 1), seconds since the
    acquisition began, and the previous delay (``None`` before the first)."""

    attempt: int
    elapsed: float
    previous_delay: Optional[float]


#: A delay: fixed seconds, or a function of the retry state returning seconds.
Delay = Union[float, int, Callable[[RetryState], float]]


@dataclass(frozen=True)
class Retry:
    """How an acquisition retries. ``None`` fields inherit (see :meth:`merged`).

    - ``retries``: attempts after the first; ``math.inf`` for no limit but the timeout.
    - ``delay``: seconds between attempts, or a callable of :class:`RetryState` (called once
      before each wait). When set it bounds every wait on every backend: an announced release
      only ends a wait early, never makes it longer. Unset (``None``, the default), a waiter
      waits for the announcement or the holder's lease end where the store announces
      releases, and :data:`~lease_lock.clock.QUIET_PAUSE` between attempts where it does not.
    - ``timeout``: seconds the whole acquisition may take; ``math.inf`` waits for ever.
    """

    retries: Optional[Union[int, float]] = None
    delay: Optional[Delay] = None
    timeout: Optional[float] = None

    def __post_init__(self) -> None:
        if self.retries is not None:
            retries = self.retries
            if isinstance(retries, bool) or not isinstance(retries, (int, float)):
                raise ValidationError("retries must be an int >= 0 or math.inf")
            if retries < 0 or (isinstance(retries, float) and not (retries == math.inf or retries.is_integer())):
                raise ValidationError("retries must be an int >= 0 or math.inf")
        if self.delay is not None and not callable(self.delay):
            object.__setattr__(self, "delay", check_duration(self.delay, "retry.delay", allow_zero=True))
        if self.timeout is not None:
            object.__setattr__(
                self, "timeout", check_duration(self.timeout, "retry.timeout", allow_zero=True, allow_inf=True)
            )

    def merged(self, override: Optional[Retry]) -> Retry:
        """This policy with every field that ``override`` sets replaced by its value."""
        if override is None:
            return self
        return Retry(
            retries=self.retries if override.retries is None else override.retries,
            delay=self.delay if override.delay is None else override.delay,
            timeout=self.timeout if override.timeout is None else override.timeout,
        )

    def delay_for(self, state: RetryState) -> float:
        """The wait before the next attempt, validated when it comes from a callable;
        :data:`~lease_lock.clock.QUIET_PAUSE` when unset."""
        delay = self.delay
        if delay is None:
            return QUIET_PAUSE
        if callable(delay):
            return check_duration(delay(state), "retry.delay() result", allow_zero=True)
        return float(delay)


#: The built-in policy: retry until ten seconds have passed, paced by the waiting rule (the
#: delay unset; see the module docstring).
DEFAULT_RETRY = Retry(retries=math.inf, delay=None, timeout=10.0)


def exponential_backoff(
    base: float = 0.1, max: float = 5.0, jitter: bool = True
) -> Callable[[RetryState], float]:
    """A delay function: ``min(max, base * 2 ** (attempt - 1))``, uniformly jittered in
    ``[0, that]`` when ``jitter`` is true."""
    base = check_duration(base, "base")
    ceiling = check_duration(max, "max")
    check_bool(jitter, "jitter")

    def delay(state: RetryState) -> float:
        # Cap the exponent so huge attempt counts cannot overflow a float.
        step = min(ceiling, base * 2.0 ** min(state.attempt - 1, 64))
        return _JITTER.uniform(0, step) if jitter else step

    return delay
