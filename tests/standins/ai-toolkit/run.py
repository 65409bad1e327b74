"""STAND-IN for ostris/ai-toolkit's run.py (tests only; trains nothing).

``python run.py CONFIG.yaml`` reads the job YAML and writes ai-toolkit's real output layout under
``<training_folder>/<name>/``: ``config.yaml``, ``<name>_<step:09d>.safetensors`` every
``save.save_every`` steps (older ones beyond ``max_step_saves_to_keep`` removed),
``optimizer.pt``, ``samples/<ms>__<step:09d>_<i>.jpg`` every ``sample.sample_every`` steps,
``loss_log.db`` (WAL, tables steps / metric_keys / metrics as toolkit/logging_aitk.py UILogger
creates them, keys ``learning_rate`` and ``loss/loss`` as jobs/process/BaseSDTrainProcess.py logs
them; tests/recorded/ai-toolkit/loss_log.sql is the real logger's) when ``logging.use_ui_logger`` is true, and the final ``<name>.safetensors``. One step per
LORAPOD_STANDIN_STEP_S seconds (default 0.05). Steps are numbered from 0 and the first is neither
logged nor saved, as ai-toolkit does (tests/recorded/aitk-sd15: a real 2-step run logs step 1 only).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

import yaml


def main() -> int:
    cfg = yaml.safe_load(Path(sys.argv[1]).read_text())
    name = cfg["config"]["name"]
    p = cfg["config"]["process"][0]
    root = Path(p["training_folder"]) / name
    (root / "samples").mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    db = None
    if p.get("logging", {}).get("use_ui_logger"):
        db = sqlite3.connect(root / "loss_log.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL;")
        db.execute("CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, wall_time REAL NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS metric_keys (key TEXT PRIMARY KEY, first_seen_step INTEGER, "
                   "last_seen_step INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS metrics (step INTEGER NOT NULL, key TEXT NOT NULL, value_real REAL, "
                   "value_text TEXT, PRIMARY KEY (step, key), "
                   "FOREIGN KEY (step) REFERENCES steps(step) ON DELETE CASCADE)")
    steps, every = p["train"]["steps"], p["save"]["save_every"]
    keep = p["save"]["max_step_saves_to_keep"]
    sample_every = p.get("sample", {}).get("sample_every")
    pace = float(os.environ.get("LORAPOD_STANDIN_STEP_S", "0.05"))
    for step in range(steps):
        time.sleep(pace)
        loss = 0.5 / (1 + step)
        print(f"{name}:  {100 * step // steps}%|#| {step}/{steps} [00:01<00:01, 2.0it/s, lr: 1.0e-04 loss: {loss:.3e}]",
              flush=True)
        if db is not None and step:  # BaseSDTrainProcess logs nothing at its first step (step_num == start_step)
            db.execute("INSERT INTO steps VALUES (?, ?)", (step, time.time()))
            db.executemany("INSERT INTO metrics VALUES (?, ?, ?, NULL)",
                           [(step, "learning_rate", p["train"]["lr"]), (step, "loss/loss", loss)])
        if step and step % every == 0:
            (root / f"{name}_{step:09d}.safetensors").write_bytes(b"w" * 1024)
            (root / "optimizer.pt").write_bytes(b"o" * 1024)
            for old in sorted(root.glob(f"{name}_*.safetensors"))[:-keep]:
                old.unlink()
        if sample_every and step and step % sample_every == 0:
            (root / "samples" / f"{int(time.time() * 1000)}__{step:09d}_0.jpg").write_bytes(b"jpg")
    (root / f"{name}.safetensors").write_bytes(b"final")
    return 0


if __name__ == "__main__":
    sys.exit(main())
