"""New metrics lines of a remote run, straight from its instance, for the live charts.

The run folder's ``metrics.jsonl`` is the pulled copy, refreshed every ``--pull-every-s`` (30 s
by default), so a chart fed from it alone would lag by that much. While a job runs, the stream
also reads the instance's ``run/metrics.jsonl`` after the bytes already home, the way
``lorapod logs -f`` does (:func:`lorapod.compute.joblogs.follow_logs`: the same guarded, read-only
``tail``, through :func:`lorapod.compute.jobs.reach`). It never uses the session's ``poll``,
which touches ``HEARTBEAT``: an open page must not keep the watchdog believing a dead controller
is alive. What the host sends is bounded (``LIMIT`` bytes a read, whole lines only) and only
parsed as JSON; it is never written anywhere.
"""

from __future__ import annotations

import time

from lorapod.compute.remote import RUN_METRICS
from lorapod.ui.runs import RunIndex

LIMIT = 1024 * 1024  # bytes of new metrics per read
EVERY_S = 2.0  # how often a page's stream reads from the instance
GIVE_UP_AFTER = 5  # failed reads in a row, then the page relies on the pulls alone


class RemoteTail:
    """One SSH connection per open page, opened on first use and closed with the stream."""

    def __init__(self, index: RunIndex, job_id: str, offset: int) -> None:
        self.index = index
        self.job_id = job_id
        self.offset = offset  # bytes of the instance's metrics.jsonl already shown
        self.failures = 0
        self.next_at = 0.0
        self._reach = None

    @property
    def dead(self) -> bool:
        return self.failures >= GIVE_UP_AFTER

    def due(self) -> bool:
        return not self.dead and time.monotonic() >= self.next_at

    def read(self) -> bytes:
        """Whole new lines (maybe none); b'' on any failure, counted."""
        from lorapod.compute.jobs import find_job, reach
        from lorapod.compute.transport import ConnectionLost
        from lorapod.errors import LorapodError

        self.next_at = time.monotonic() + EVERY_S
        try:
            if self._reach is None:
                ledger = self.index.ledger()
                if ledger is None:
                    self.failures = GIVE_UP_AFTER
                    return b""
                try:
                    self._reach = reach(ledger, find_job(ledger, self.job_id))
                finally:
                    ledger.close()
                if self._reach is None:  # no live instance: the pulls have it all
                    self.failures = GIVE_UP_AFTER
                    return b""
            out = self._reach.work.tail(RUN_METRICS, self.offset, LIMIT, timeout=20) or b""
        except (ConnectionLost, LorapodError, OSError):
            self.failures += 1
            self.close()
            return b""
        self.failures = 0
        cut = out.rfind(b"\n")
        if cut < 0:
            return b""
        self.offset += cut + 1
        return out[: cut + 1]

    def close(self) -> None:
        if self._reach is not None:
            try:
                self._reach.close()
            finally:
                self._reach = None
