"""The controller's reading of ``run/metrics.jsonl`` from an untrusted instance: bounded, validated.

The instance writes the file; the controller follows it over SSH on every poll. Whatever the host
puts there, following it must never end a healthy run (DESIGN invariant 8): one forged line with
``{"step": 10**26}`` used to crash the ledger write (SQLite integers are 64-bit), a 100 MB line
was read whole on every poll, ``loss: -1e308`` printed 300 digits and ``step: -5`` became the
job's last step.

So, by one policy in one place:

* each poll reads at most :data:`POLL_BYTES` (``tail -c +N | head -c POLL_BYTES`` on the
  instance); a line longer than :data:`MAX_LINE_BYTES` is skipped in bounded chunks, never held;
* a line is used only when it is a JSON object whose ``step`` is an integer (not a bool) in
  ``0 ..`` :data:`MAX_STEP` and not below the last accepted step (eval lines repeat their step);
* everything else is dropped and counted (:attr:`MetricsFeed.dropped`, by reason), never fatal;
* ``loss`` is shown only when it is a finite number of sane magnitude (the engine writes a
  diverged loss as the string ``"inf"``: :func:`lorapod.engine.metrics._clean`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Bytes one poll reads from the instance's metrics.jsonl; a full chunk means "poll again now".
POLL_BYTES = 1 << 20
#: The longest metrics line accepted. The engine's lines are a few hundred bytes
#: (engine/metrics.py: step, loss, lr, tokens/s, memory, time); 64 KiB leaves room for any trainer.
MAX_LINE_BYTES = 64 << 10
#: The highest step accepted: far beyond any real run (10**12 steps), well inside SQLite's
#: 64-bit INTEGER and a float's exact integers (2**53), so the ledger and JSON keep it exactly.
MAX_STEP = 10**12
#: |loss| above this is shown as out of range rather than printed digit by digit.
MAX_SHOWN = 1e9


def shown_number(value: Any) -> str | None:
    """A metric value as the terminal shows it, or None when it is not a sane finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        x = float(value)
    except OverflowError:  # a JSON integer with hundreds of digits
        return None
    if not math.isfinite(x) or abs(x) > MAX_SHOWN:
        return None
    return f"{x:.4f}"


@dataclass
class MetricsFeed:
    """Follows metrics.jsonl by byte offset; :meth:`take` turns one poll's bytes into records.

    ``floor`` is the lowest step accepted next (the last accepted step); ``None`` accepts any
    valid step first (a resumed job legitimately restarts from its checkpoint's step).
    """

    offset: int = 0
    floor: int | None = None
    dropped: Counter[str] = field(default_factory=Counter)
    _skipping: bool = False  # inside an over-long line: drop bytes up to its newline

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def take(self, data: bytes, limit: int = POLL_BYTES) -> tuple[list[dict[str, Any]], bool]:
        """The valid records in ``data`` (bytes from :attr:`offset` on, at most ``limit`` of them)
        and whether the chunk was full (more is waiting: poll again without sleeping)."""
        full = len(data) >= limit
        data = data[:limit]
        records: list[dict[str, Any]] = []
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                rest = len(data) - pos
                if self._skipping or rest >= MAX_LINE_BYTES:
                    # an over-long line with no end in sight: consume it, remember to skip the rest
                    if not self._skipping:
                        self.dropped["line longer than 64 KiB"] += 1
                    self._skipping = True
                    pos = len(data)
                break  # an incomplete line: read again next poll, from its start
            line = data[pos:nl]
            pos = nl + 1
            if self._skipping:
                self._skipping = False
                continue
            if len(line) > MAX_LINE_BYTES:
                self.dropped["line longer than 64 KiB"] += 1
                continue
            rec, why = self._valid(line)
            if rec is None:
                self.dropped[why] += 1
                continue
            records.append(rec)
        self.offset += pos
        return records, full

    def _valid(self, line: bytes) -> tuple[dict[str, Any] | None, str]:
        if not line.strip():
            return None, "empty line"
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return None, "not JSON"
        if not isinstance(rec, dict):
            return None, "not a JSON object"
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            return None, "no integer step"
        if not 0 <= step <= MAX_STEP:
            return None, f"step outside 0..{MAX_STEP}"
        if self.floor is not None and step < self.floor:
            return None, "step lower than the last one"
        self.floor = step
        return rec, ""

    def describe_dropped(self) -> str:
        return ", ".join(f"{n} {why}" for why, n in self.dropped.most_common())
