"""Training progress as a renter watches it: a rich bar on a terminal, a line every N seconds elsewhere.

One rendering of a progress line (``progress_line``: step/total, loss, validation loss when there is
one, throughput, ETA, dollars so far against the cap and dollars to finish) serves the bar's stats,
the periodic line printed when stderr is not a terminal (CI, ``nohup``, ``| tee``: a bar there
prints nothing for minutes or floods the log with redraws), ``lorapod run``'s stream and
``lorapod logs JOB``. Dollars show when the spec says what the machine costs
(``compute.usd_per_hour``), so a user on a rented box sees the meter running.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Seconds between progress lines when stderr is not a terminal; LORAPOD_PROGRESS_SECONDS changes it.
LINE_EVERY_S = 30.0


def duration(seconds: float) -> str:
    """``95`` -> ``1m35s``; ``7300`` -> ``2h01m``: short enough for a log line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@dataclass
class ProgressPoint:
    """What is known about a run at one moment; every field but the step may be missing."""

    step: int
    total: int | None = None
    loss: float | None = None
    val_loss: float | None = None
    rate: float | None = None  # throughput in ``unit``
    unit: str = "it/s"
    eta_s: float | None = None
    usd: float | None = None  # spent so far
    usd_cap: float | None = None  # compute.max_usd
    usd_per_hour: float | None = None


def eta_seconds(step: int, total: int | None, start_step: int, elapsed_s: float) -> float | None:
    """Time to finish at the pace of the steps done in this session (not counting resumed ones)."""
    done = step - start_step
    if total is None or done <= 0 or elapsed_s <= 0:
        return None
    return max(0.0, (total - step) * elapsed_s / done)


def progress_line(p: ProgressPoint, with_step: bool = True) -> str:
    """``step 40/320 (12%)  loss 1.2345  val 1.3001  850 tok/s  eta 3m12s  $0.012 of $5.00 cap  ~$0.090 to finish``."""
    parts = []
    if with_step:
        parts.append(f"step {p.step}/{p.total} ({100 * p.step / p.total:.0f}%)" if p.total else f"step {p.step}")
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    if p.val_loss is not None:
        parts.append(f"val {p.val_loss:.4f}")
    if p.rate is not None:
        parts.append(f"{p.rate:,.0f} {p.unit}" if p.rate >= 10 else f"{p.rate:.2f} {p.unit}")
    if p.eta_s is not None:
        parts.append(f"eta {duration(p.eta_s)}")
    if p.usd is not None:
        parts.append(f"${p.usd:.3f}" + (f" of ${p.usd_cap:.2f} cap" if p.usd_cap else ""))
    if p.usd_per_hour is not None and p.eta_s is not None:
        parts.append(f"~${p.usd_per_hour * p.eta_s / 3600:.3f} to finish")
    return "  ".join(parts)


def _line_every() -> float:
    try:
        return max(0.1, float(os.environ.get("LORAPOD_PROGRESS_SECONDS", LINE_EVERY_S)))
    except ValueError:
        return LINE_EVERY_S


class TrainProgress:
    """``enabled``: None = a bar on a terminal, a line every LINE_EVERY_S seconds otherwise; True = the
    bar; False = silent (tests, the demos' own reporting)."""

    def __init__(self, total_steps: int, start_step: int = 0, usd_per_hour: float | None = None,
                 unit: str = "tok/s", enabled: bool | None = None, usd_cap: float | None = None) -> None:
        self.usd_per_hour, self.usd_cap, self.unit = usd_per_hour, usd_cap, unit
        self.total, self.start_step = total_steps, start_step
        self._t0 = time.monotonic()
        tty = sys.stderr.isatty()
        self.bar = tty if enabled is None else enabled
        self.lines = enabled is None and not tty
        self.console = Console(stderr=True, soft_wrap=not tty)  # a job.log gets whole lines, not 80-column wraps
        self._every = _line_every()
        self._last_line = self._t0
        self._last_step = start_step
        self.val_loss: float | None = None
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.bar,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start_step, stats="")

    def __enter__(self) -> TrainProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def usd_so_far(self) -> float | None:
        if self.usd_per_hour is None:
            return None
        return self.usd_per_hour * (time.monotonic() - self._t0) / 3600

    def point(self, step: int, loss: float | None, rate: float | None) -> ProgressPoint:
        eta = eta_seconds(step, self.total, self.start_step, time.monotonic() - self._t0)
        return ProgressPoint(step, self.total, loss, self.val_loss, rate, self.unit, eta, self.usd_so_far(),
                             self.usd_cap, self.usd_per_hour)

    def update(self, step: int, loss: float, rate: float) -> None:
        p = self.point(step, loss, rate)
        if self.bar:
            p.eta_s = None  # the bar has its own ETA column
            self._progress.update(self._task, completed=step, stats=progress_line(p, with_step=False))
        elif self.lines:
            now = time.monotonic()
            # the first step (the pace is known), then every N seconds, and the last step
            if self._last_step == self.start_step or now - self._last_line >= self._every or step >= self.total:
                self.console.print(progress_line(p), markup=False, highlight=False, soft_wrap=True)
                self._last_line = now
        self._last_step = step

    def print(self, message: str) -> None:
        self._progress.console.print(message, highlight=False)


class LineEvery:
    """Which of ``lorapod run``'s progress lines reach an output that is not a terminal: the first
    step, then one every LORAPOD_PROGRESS_SECONDS (30 s), and the last, as ``lorapod train`` prints
    them there (:class:`TrainProgress`); eval and checkpoint lines always. On a terminal, every line."""

    def __init__(self, tty: bool | None = None) -> None:
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.every = _line_every()
        self._last: float | None = None

    def show(self, rec: dict, total: int | None) -> bool:
        if self.tty or rec.get("event") is not None:
            return True
        now, step = time.monotonic(), rec.get("step")
        last = bool(total) and isinstance(step, int) and step >= total  # type: ignore[operator]
        if self._last is None or now - self._last >= self.every or last:
            self._last = now
            return True
        return False


def _num(v) -> float | None:
    """A finite number from a metrics record (a host's records are untrusted: the run folder's one
    rule, rundir.metrics.number), else None; ±1e12 bounds what a line prints (a forged 1e308 would
    print 300 digits)."""
    from lorapod.rundir.metrics import number

    x = number(v)
    return x if x is not None and abs(x) <= 1e12 else None


class MetricsView:
    """metrics.jsonl records (as ``fit`` writes them, here or on an instance) -> what a renter reads:
    ``lorapod run``'s stream and ``lorapod logs JOB``. Train records become progress lines, eval
    records a line of their own whose val loss the next lines carry, checkpoints a short line; other
    records and malformed values are skipped. The ETA is the remaining steps at the median of the
    last 20 step times."""

    def __init__(self, total: int | None = None, usd_cap: float | None = None) -> None:
        self.total, self.usd_cap = total, usd_cap
        self.val_loss: float | None = None
        self._times: list[float] = []

    def feed(self, rec, usd: float | None = None, usd_per_hour: float | None = None) -> str | None:
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec.get("step"), bool):
            return None
        step = rec["step"]
        total = rec.get("total_steps")
        if isinstance(total, int) and not isinstance(total, bool) and 0 < total < 10**9:
            self.total = total
        event = rec.get("event")
        if event == "eval":
            shown = {k: _num(v) for k, v in rec.items() if k not in ("step", "epoch", "time", "event")}
            shown = {k: v for k, v in shown.items() if v is not None}
            if "val_loss" in shown:
                self.val_loss = shown["val_loss"]
            return f"eval at step {step}: " + "  ".join(f"{k[:40]} {v:.4f}" for k, v in list(shown.items())[:6])
        if event == "checkpoint":
            return f"checkpoint at step {step}"
        if event is not None:
            return None
        dt = _num(rec.get("step_time_s"))
        if dt is not None and dt > 0:
            self._times = [*self._times, dt][-20:]
        tok = _num(rec.get("real_tokens_per_s")) or _num(rec.get("tokens_per_s"))
        rate, unit = (tok, "tok/s") if tok is not None else ((1 / dt, "it/s") if dt else (None, "it/s"))
        eta = None
        if self.total and self._times:
            eta = max(0, self.total - step) * sorted(self._times)[len(self._times) // 2]
        return progress_line(ProgressPoint(step, self.total, _num(rec.get("loss")), self.val_loss, rate, unit, eta,
                                           usd, self.usd_cap, usd_per_hour))
