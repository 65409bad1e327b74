"""A rich progress bar for training: loss, throughput, ETA and dollars so far.

Dollars show when the spec says what the machine costs (``compute.usd_per_hour``), so a user on
a rented box sees the meter running.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainProgress:
    def __init__(self, total_steps: int, start_step: int = 0, usd_per_hour: float | None = None,
                 unit: str = "tok/s", enabled: bool | None = None) -> None:
        self.usd_per_hour = usd_per_hour
        self.unit = unit
        self._t0 = time.monotonic()
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not self.enabled,
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

    def update(self, step: int, loss: float, rate: float) -> None:
        stats = f"loss {loss:.4f}  {rate:,.0f} {self.unit}"
        usd = self.usd_so_far()
        if usd is not None:
            stats += f"  ${usd:.3f}"
        self._progress.update(self._task, completed=step, stats=stats)

    def print(self, message: str) -> None:
        self._progress.console.print(message, highlight=False)
