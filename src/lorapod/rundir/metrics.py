"""The one reader of a run folder's ``metrics.jsonl``: bounded, validated, the same for everyone.

The file may come from an untrusted instance (a pulled run folder, or the controller following it
over SSH on every poll), and whatever the host puts there, reading it must never end a healthy
run (DESIGN invariant 8) nor answer a page with 500: one forged line with ``{"step": 10**26}`` used
to crash the ledger write (SQLite integers are 64-bit), a 100 MB line was read whole on every poll,
``loss: -1e308`` printed 300 digits and ``step: -5`` became the job's last step.

So every consumer (the controller's feed in compute/, the engine's plots and resume, the planner's
measured runs, the dashboard, ``lorapod logs``, export's model card, the sweep's ranking) reads by
one policy, here:

* a controller poll reads at most :data:`POLL_BYTES` (``tail -c +N | head -c POLL_BYTES`` on the
  instance); a line longer than :data:`MAX_LINE_BYTES` is skipped in bounded chunks, never held;
  :func:`read_records` reads a file whole or only its last bytes, never through a link;
* a line is used only when it is a JSON object whose ``step`` is an integer (not a bool) in
  ``0 ..`` :data:`MAX_STEP` and not below the last accepted step (eval lines repeat their step);
* everything else is dropped and counted (:attr:`MetricsFeed.dropped`, by reason), never fatal;
* a value is a number only when it is a finite one (:func:`number`); ``loss`` is shown only when
  it is a finite number of sane magnitude (the engine writes a diverged loss as the string
  ``"inf"``: :func:`lorapod.engine.metrics._clean`).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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


def number(value: Any) -> float | None:
    """A metric value as a float when it is a finite number (not a bool, not a string, not an
    integer too large for a float); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        x = float(value)
    except OverflowError:  # a JSON integer with hundreds of digits
        return None
    return x if math.isfinite(x) else None


def shown_number(value: Any) -> str | None:
    """A metric value as the terminal shows it, or None when it is not a sane finite number."""
    x = number(value)
    if x is None or abs(x) > MAX_SHOWN:
        return None
    return f"{x:.4f}"


@dataclass
class MetricsFeed:
    """Follows metrics.jsonl by byte offset; :meth:`take` turns one poll's bytes into records.

    ``floor`` is the lowest step accepted next (the last accepted step); ``None`` accepts any
    valid step first (a resumed job legitimately restarts from its checkpoint's step).
    ``ceiling`` is the highest step the job can reach, as lorapod knows it (the spec's
    ``train.max_steps``; None: :data:`MAX_STEP`): a line past it is dropped without moving the
    floor, so one forged ``step: 10**12`` never hides the real lines after it.
    """

    offset: int = 0
    floor: int | None = None
    ceiling: int | None = None
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

    def accept(self, line: bytes | str) -> dict[str, Any] | None:
        """One whole line (without its newline): the record, or None (dropped and counted)."""
        raw = line.encode("utf-8", errors="replace") if isinstance(line, str) else line
        if len(raw) > MAX_LINE_BYTES:
            self.dropped["line longer than 64 KiB"] += 1
            return None
        rec, why = self._valid(raw)
        if rec is None:
            self.dropped[why] += 1
        return rec

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
        if self.ceiling is not None and step > self.ceiling:
            return None, "step past the job's length"
        if self.floor is not None and step < self.floor:
            return None, "step lower than the last one"
        self.floor = step
        return rec, ""

    def describe_dropped(self) -> str:
        return ", ".join(f"{n} {why}" for why, n in self.dropped.most_common())


def iter_records(data: bytes, feed: MetricsFeed | None = None) -> Iterator[dict[str, Any]]:
    """The valid records in ``data``: whole lines, the last one too when it has no newline (a torn
    line is not JSON and is dropped). ``feed`` keeps the floor and the drop counts across calls;
    a fresh one accepts any valid step first."""
    feed = feed if feed is not None else MetricsFeed()
    pos, end = 0, len(data)
    while pos < end:
        nl = data.find(b"\n", pos)
        nl = end if nl < 0 else nl
        rec = feed.accept(data[pos:nl])
        pos = nl + 1
        if rec is not None:
            yield rec


def parse_records(data: bytes | str, feed: MetricsFeed | None = None) -> list[dict[str, Any]]:
    """:func:`iter_records` as a list (text is encoded first)."""
    raw = data.encode("utf-8", errors="replace") if isinstance(data, str) else data
    return list(iter_records(raw, feed))


def read_bytes(path: Path, tail_bytes: int | None = None) -> bytes:
    """A metrics file's bytes: all of them, or only the last ``tail_bytes`` from their first whole
    line. b"" when it is missing, not a regular file, or a link (never followed; a FIFO planted
    in its place does not block the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return b""
        if tail_bytes is None or st.st_size <= tail_bytes:
            return fh.read()
        fh.seek(st.st_size - tail_bytes)
        data = fh.read(tail_bytes)
    return data[data.find(b"\n") + 1:]


def cut_after(path: Path, step: int | None) -> int:
    """Keep only the valid records of a metrics file up to ``step`` (None: none), as the engine
    does on resume: read line by line in bounded pieces (a line longer than :data:`MAX_LINE_BYTES`
    is dropped unread), stopped at a torn last line, never through a link, written back atomically.
    Returns the size of the file left. What survives is what :func:`read_records` would accept, so
    a hostile line a host planted (nested 200,000 deep, a forged step) never stops a resume, and a
    line past ``step`` never hides the ones before it."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return 0
    feed, kept = MetricsFeed(ceiling=-1 if step is None else step), []
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return 0
        skipping = False
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if not line.endswith(b"\n"):
                if len(line) <= MAX_LINE_BYTES:
                    break  # a line cut off by the pull: the end of what came whole
                skipping = True  # too long: read on to its newline, keep nothing of it
                continue
            if skipping:
                skipping = False
                continue
            rec = feed.accept(line[:-1])
            if rec is not None and step is not None and rec["step"] <= step:
                kept.append(line)
    data = b"".join(kept)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.unlink(missing_ok=True)
    tmp.write_bytes(data)
    tmp.replace(path)
    return len(data)


def read_records(path: Path, tail_bytes: int | None = None, feed: MetricsFeed | None = None) -> list[dict[str, Any]]:
    """The valid records of a metrics file (:func:`read_bytes`, then :func:`iter_records`)."""
    return list(iter_records(read_bytes(Path(path), tail_bytes), feed))


#: The validation-type losses a run logs, in the order they are preferred: the LLM engine's
#: held-out loss, the image engine's loss at fixed noise. A sweep ranks runs by the last one, and
#: the dashboard's Compare page shows it.
LOSS_KEYS = ("val_loss", "fixed_noise_loss")


def last_loss(records: Iterable[dict[str, Any]]) -> tuple[str | None, float | None]:
    """The last validation-type loss among metrics records (:data:`LOSS_KEYS`): its key and value,
    or (None, None) when no record has one."""
    for rec in reversed(list(records)):
        for key in LOSS_KEYS:
            if (x := number(rec.get(key))) is not None:
                return key, x
    return None, None
