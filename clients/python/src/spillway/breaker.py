"""A circuit breaker: after ``failures`` calls in a row that found Spillway unavailable (a
network error, a timeout, a 5xx), stop calling it for ``period`` seconds; then let one trial
call through, whose success closes the breaker and whose failure opens it again.

While Spillway hangs, each call would otherwise wait out the whole timeout; with the breaker a
hung Spillway costs one timeout per period, and every other check is answered at once (as the
failure mode says). Pure bookkeeping: no I/O, time from ``clock``.
"""

from __future__ import annotations

import time
from typing import Callable, Optional


class BreakerOpen(Exception):
    """The breaker answered instead of Spillway; the message says why."""


class Breaker:
    def __init__(self, failures: int, period: float, clock: Callable[[], float] = time.monotonic):
        if not isinstance(failures, int) or failures < 1:
            raise ValueError("breaker_failures must be an int of at least 1 (or None: no breaker)")
        if not period > 0:
            raise ValueError("breaker_period must be more than 0 seconds")
        self.failures = failures
        self.period = period
        self._clock = clock
        self._in_a_row = 0
        self._last = ""
        self._open_until: Optional[float] = None
        self._trial = False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def enter(self) -> bool:
        """Before a call: raises ``BreakerOpen`` when the call must not be made; returns True
        when the call is the trial that decides whether the breaker closes."""
        if self._open_until is None:
            return False
        left = self._open_until - self._clock()
        if left > 0:
            raise BreakerOpen(
                f"circuit breaker open after {self._in_a_row} failures in a row (the last: {self._last}); "
                f"not calling Spillway for another {left:.1f} s"
            )
        if self._trial:
            raise BreakerOpen(
                f"circuit breaker open after {self._in_a_row} failures in a row (the last: {self._last}); "
                "a trial call is under way"
            )
        self._trial = True
        return True

    def succeeded(self) -> bool:
        """Spillway answered (any answer but a 5xx). Returns True when that closed the breaker."""
        was_open = self._open_until is not None
        self._in_a_row = 0
        self._open_until = None
        self._trial = False
        return was_open

    def failed(self, trial: bool, reason: str) -> bool:
        """Spillway was unavailable for a call. Returns True when that opened the breaker (the
        Nth failure in a row, or the trial's)."""
        self._in_a_row += 1
        self._last = reason
        if trial:
            self._trial = False
        elif self._open_until is not None or self._in_a_row < self.failures:
            # A call made before the breaker opened, failing late, does not extend it.
            return False
        self._open_until = self._clock() + self.period
        return True

    def abandoned(self, trial: bool) -> None:
        """The call ended with neither (cancelled): the next call may be the trial."""
        if trial:
            self._trial = False
