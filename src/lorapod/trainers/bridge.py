"""Turn a trainer's own progress output into lorapod's ``metrics.jsonl`` records.

Three sources, one per family of trainers (the formats are recorded in the comments; excerpts
written from them are in tests/test_trainers_bridge.py):

- kohya sd-scripts and musubi-tuner print a tqdm bar ``desc="steps"`` whose postfix is
  ``avr_loss=<moving average>`` (sd-scripts train_network.py: ``progress_bar.set_postfix(**logs)``
  with ``logs = {"avr_loss": avr_loss}``, set after ``update(1)`` redrew the bar with the previous
  step's: see KohyaProgress; musubi-tuner the same), and
  ``epoch N/M`` at the start of each epoch (``accelerator.print``).
- axolotl (the Hugging Face Trainer) prints each log as a Python dict,
  ``{'loss': 1.23, 'grad_norm': 0.4, 'learning_rate': 0.0002, 'epoch': 0.05}``, and eval results
  as ``{'eval_loss': ...}`` (transformers ProgressCallback.on_log), beside a tqdm bar ``n/total``.
- ai-toolkit with ``logging.use_ui_logger: true`` writes ``<save_root>/loss_log.db`` (SQLite in
  WAL mode, toolkit/logging_aitk.py UILogger): tables ``steps(step, wall_time)``,
  ``metric_keys(key, first_seen_step, last_seen_step)`` and
  ``metrics(step, key, value_real, value_text)``. Each logged step holds ``learning_rate`` and
  one ``loss/<name>`` per entry of the process's loss dict (jobs/process/BaseSDTrainProcess.py
  ``self.logger.log({f'loss/{key}': value})``; SDTrainer's dict is ``{'loss': ...}``, so the loss
  is ``loss/loss``). A dump of a database the real UILogger wrote is tests/recorded/ai-toolkit/.
"""

from __future__ import annotations

import ast
import math
import re
import sqlite3
from pathlib import Path
from typing import Any

_SPLIT = re.compile(r"[\r\n]+")
_BAR = re.compile(r"(?:^|\s)(?P<desc>[\w ]*?):?\s*\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<inner>[^\]]*)\]")
_BARE_BAR = re.compile(r"\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<inner>[^\]]*)\]")
# "epoch 2/8" (accelerator.print) or a logger's "INFO  Epoch 2/8   train_network.py:1234"
_EPOCH = re.compile(r"\bepoch (\d+)/(\d+)\b", re.I)
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"


def _float(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


class LineBridge:
    """Feed it raw output (any chunking, ``\\r`` included); it returns records to log."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, text: str) -> list[dict[str, Any]]:
        self._buf += text
        parts = _SPLIT.split(self._buf)
        self._buf = parts.pop()  # an unfinished line waits for the rest
        out: list[dict[str, Any]] = []
        for line in parts:
            out += self.line(line)
        return out

    def flush(self) -> list[dict[str, Any]]:
        rest, self._buf = self._buf, ""
        return self.line(rest) if rest else []

    def poll(self) -> list[dict[str, Any]]:
        return []

    def line(self, line: str) -> list[dict[str, Any]]:
        raise NotImplementedError


class KohyaProgress(LineBridge):
    """sd-scripts / musubi-tuner: one record per step of the ``steps`` bar, once the step's loss is out.

    Both trainers call ``progress_bar.update(1)`` when a step ends, which redraws the bar with the
    postfix it had (the *previous* step's ``avr_loss``; none at step 1), and only then
    ``progress_bar.set_postfix(avr_loss=...)``, which redraws it with this step's (sd-scripts
    train_network.py, musubi-tuner training/trainer_base.py; a real run's output is
    tests/recorded/sd15/two-steps.log). So the last line drawn for a step carries its loss: a step's
    record is written when the bar moves on, or at the end of the output (``flush``). The bar shows
    tqdm's ``format_num`` of the value (3 significant digits); the trainer logs the same
    ``loss/average`` unrounded to TensorBoard.
    """

    def __init__(self, offset: int = 0, total_offset: int = 0) -> None:
        super().__init__()
        self.step = 0
        self.epoch: int | None = None
        self._pending: dict[str, Any] | None = None
        self.offset, self.total_offset = offset, total_offset  # a resumed job (TrainerJob.step_offset)

    def line(self, line: str) -> list[dict[str, Any]]:
        m = _BAR.search(line)
        if not m or m.group("desc").strip() != "steps":
            e = _EPOCH.search(line)
            if e and not m:
                self.epoch = int(e.group(1))
            return []
        n = int(m.group("n"))
        if n < self.step or n == 0:
            return []
        out: list[dict[str, Any]] = []
        if n > self.step:
            out = self._done()
            self.step = n
            self._pending = {"step": n + self.offset, "total_steps": int(m.group("total")) + self.total_offset}
            if self.epoch is not None:
                self._pending["epoch"] = self.epoch
        loss = re.search(rf"avr_loss=({_NUM})", m.group("inner"))
        if loss and _float(loss.group(1)) is not None and self._pending is not None:
            self._pending["loss"] = _float(loss.group(1))  # the step's last drawing wins
        return out

    def flush(self) -> list[dict[str, Any]]:
        return super().flush() + self._done()

    def _done(self) -> list[dict[str, Any]]:
        rec, self._pending = self._pending, None
        return [rec] if rec else []


_HF_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "epoch": "epoch", "eval_loss": "val_loss"}


class HFTrainerLogs(LineBridge):
    """axolotl: the Trainer's printed log dicts, stamped with the bar's current step."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def line(self, line: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        end = 0
        for m in _BARE_BAR.finditer(line):
            # The Trainer's bar has no description; axolotl also prints described bars before it
            # ("Loading weights: 100%|...| 21/21", datasets' "Map: ...", "Tokenizing Prompts ...").
            if not line[end:m.start()].strip():
                self.step = max(self.step, int(m.group("n")))
            end = m.end()
        start = line.find("{'")
        if start < 0:
            return out
        try:
            logs = ast.literal_eval(line[start:line.rindex("}") + 1])
        except (ValueError, SyntaxError):
            return out
        if not isinstance(logs, dict) or "train_runtime" in logs:
            return out
        rec: dict[str, Any] = {"step": self.step}
        for key, name in _HF_KEYS.items():
            if key in logs:
                v = _float(str(logs[key]))
                if v is not None:
                    rec[name] = v
        if len(rec) > 1:
            out.append(rec)
        return out


# BaseSDTrainProcess logs the rate as ``learning_rate`` and SDTrainer's loss as ``loss/loss``
_AITK_KEYS = {"loss/loss": "loss", "learning_rate": "lr"}


class AiToolkitSqlite(LineBridge):
    """ai-toolkit: new steps of ``loss_log.db`` on every poll (read-only, never locks the writer).

    ai-toolkit numbers its steps from 0 (BaseSDTrainProcess.run: ``for step in range(start_step,
    steps)``, the step logged after that iteration's update) and logs nothing for its first
    (``if self.step_num != self.start_step``): its step k is lorapod's step k + 1, so a 2-step run
    logs only step 2 (tests/recorded/aitk-sd15, a real run) and ends at step 2, not 1."""

    def __init__(self, db: Path) -> None:
        super().__init__()
        self.db = Path(db)
        self.step = -1

    def line(self, line: str) -> list[dict[str, Any]]:
        return []

    def poll(self) -> list[dict[str, Any]]:
        if not self.db.is_file():
            return []
        try:
            con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
            try:
                rows = con.execute("SELECT step, key, value_real FROM metrics WHERE step > ? AND value_real IS NOT NULL "
                                   "ORDER BY step", (self.step,)).fetchall()
            finally:
                con.close()
        except sqlite3.Error:
            return []  # being created, or busy: the next poll reads it
        by_step: dict[int, dict[str, Any]] = {}
        for step, key, value in rows:
            name = _AITK_KEYS.get(key, re.sub(r"[^A-Za-z0-9_]+", "_", key))
            if _float(str(value)) is not None:
                # its step k is the (k+1)-th optimizer step (see the class docstring)
                by_step.setdefault(int(step), {"step": int(step) + 1})[name] = float(value)
        if by_step:
            self.step = max(by_step)
        return [by_step[s] for s in sorted(by_step)]
