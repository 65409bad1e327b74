"""Training metrics: one JSON object per line in ``metrics.jsonl``, mirrored to TensorBoard.

JSONL is the source of truth (remote runs follow and pull it line by line); TensorBoard event
files are a convenience and are skipped with a warning when tensorboard is not installed.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


class MetricsWriter:
    def __init__(self, path: Path, tensorboard_dir: Path | None = None, resume_step: int | None = None) -> None:
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(tensorboard_dir))
            except ImportError:
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines logged after the checkpoint so the curve has no duplicates."""
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line from a crash
            if rec.get("step", 0) <= step:
                kept.append(line)
        self.path.write_text("".join(k + "\n" for k in kept), encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **{k: _clean(v) for k, v in record.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self._tb is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if key not in ("step", "time", "epoch", "event", "total_steps") and isinstance(value, int | float):
                    self._tb.add_scalar(key.replace("val_", "val/").replace("train_", "train/"), value, step)

    def close(self) -> None:
        """Idempotent: the loop closes early to plot, and again in its ``finally``."""
        if self._fh.closed:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file (a torn last line is ignored)."""
    out = []
    if not Path(path).exists():
        return out
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
