"""Waiting, once: every deadline, backoff and timeout error of the remote lifecycle.

DESIGN: "waiting (with deadlines, backoff, and a clear timeout error) lives once". Providers only
ask (``create`` returns at once, ``refresh`` reports); the stages wait here, each wait bounded by a
monotonic deadline. Three shapes cover every wait: :func:`backoff_until` (until a check holds),
:func:`retrying` (until an operation stops losing its connection) and :class:`Backoff` (the delays
of a hand-made loop that must do something between tries, such as a destroy that is confirmed).

(``watchdog.py`` keeps its own loop: it runs on the instance, standard library only.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from lorapod.compute.transport import ConnectionLost
from lorapod.errors import RemoteError

_T = TypeVar("_T")


class WaitTimedOut(RemoteError):
    """A bounded wait ran out."""


def deadline_in(seconds: float) -> float:
    """The monotonic time ``seconds`` from now."""
    return time.monotonic() + seconds


class Backoff:
    """Exponential delays (``first`` doubling up to ``most``) until a monotonic deadline.

    ``for _ in Backoff(deadline): ...`` runs the body at once, then again after each delay, and
    stops before a sleep would pass the deadline or once ``give_up()`` is true; ``expired`` then
    says whether the deadline ended it."""

    def __init__(self, deadline: float, first: float = 0.5, most: float = 10.0,
                 give_up: Callable[[], bool] = lambda: False) -> None:
        self.deadline, self.first, self.most, self.give_up = deadline, first, most, give_up
        self.expired = False

    def __iter__(self) -> Iterator[int]:
        delay, attempt = self.first, 0
        while True:
            yield attempt
            attempt += 1
            if time.monotonic() + delay > self.deadline:
                self.expired = True
                return
            if self.give_up():
                return
            time.sleep(delay)
            delay = min(self.most, delay * 2)


def backoff_until(check: Callable[[], bool], deadline: float | dict[str, float], what: str, hint: str,
                  first: float = 0.5, most: float = 10.0) -> None:
    """Call ``check`` with exponential backoff until it is true or the monotonic ``deadline``
    passes; a ``{"deadline": t}`` dict is re-read each round, so ``check`` may extend it."""
    limit = deadline if isinstance(deadline, dict) else {"deadline": deadline}
    delay = first
    while not check():
        if time.monotonic() >= limit["deadline"]:
            raise WaitTimedOut(f"timed out waiting for {what}", hint=hint)
        time.sleep(min(delay, max(0.0, limit["deadline"] - time.monotonic())))
        delay = min(most, delay * 2)


def retrying(fn: Callable[[], _T], deadline: float, what: str, first_delay: float = 0.5,
             max_delay: float = 10.0, on_retry: Callable[[Exception], None] | None = None) -> _T:
    """Call ``fn`` until it stops raising :class:`ConnectionLost` or ``deadline`` (monotonic) passes."""
    delay = first_delay
    while True:
        try:
            return fn()
        except ConnectionLost as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectionLost(f"{what}: connection lost and not back before the deadline ({exc.message})",
                                     hint="check the host is up and reachable, then `lorapod pull JOB`") from exc
            if on_retry:
                on_retry(exc)
            time.sleep(delay)
            delay = min(max_delay, delay * 2)
