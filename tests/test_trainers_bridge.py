"""Metrics bridges and output mapping on excerpts written in the trainers' own formats.

Where each format comes from:
- sd-scripts / musubi-tuner: train_network.py builds ``tqdm(..., desc="steps")`` and calls
  ``progress_bar.set_postfix(**{"avr_loss": avr_loss})``; tqdm prints ``{desc}: {pct}%|{bar}|
  {n}/{total} [{elapsed}<{remaining}, {rate}, avr_loss=<.3g>]`` with carriage returns; each epoch
  starts with ``accelerator.print(f"\\nepoch {epoch+1}/{num_train_epochs}")`` (a logger line
  ``Epoch N/M`` in some versions).
- axolotl: transformers' ProgressCallback.on_log (transformers 5.x trainer_callback.py) writes
  ``str(logs)`` with floats pre-formatted as ``f"{v:.4g}"`` strings, under a bare tqdm bar.
- ai-toolkit: toolkit/logging_aitk.py UILogger: ``<save_root>/loss_log.db``; the test reads a
  dump of a database the real UILogger wrote (tests/recorded/ai-toolkit/loss_log.sql).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from lorapod.trainers import get
from lorapod.trainers.base import Layout
from lorapod.trainers.bridge import AiToolkitSqlite, HFTrainerLogs, KohyaProgress
from lorapod.trainers.runner import Mirror

KOHYA = (
    "running training / 学習開始\n  num train images * repeats / 学習画像の数×繰り返し回数: 250\n"
    "caching latents...\n100%|██████████| 25/25 [00:04<00:00,  5.61it/s]\n"
    "\nepoch 1/8\n"
    "steps:   0%|          | 1/2000 [00:02<1:14:07,  2.22s/it, avr_loss=0.0912]"
    "\rsteps:   0%|          | 2/2000 [00:03<57:48,  1.74s/it, avr_loss=0.0877]"
    "\rsteps:   0%|          | 2/2000 [00:03<57:48,  1.74s/it, avr_loss=0.0877]"
    "\rsteps:  12%|█▎        | 250/2000 [06:40<46:43,  1.60s/it, avr_loss=nan]"
    "\n2026-12-01 00:10:00 INFO     Epoch 2/8                          train_network.py:1410\n"
    "\rsteps:  13%|█▎        | 251/2000 [06:42<46:41,  1.60s/it, avr_loss=9.84e-05]\n"
)


def test_kohya_bar_becomes_one_record_per_step_in_any_chunking():
    one = KohyaProgress()
    whole = one.feed(KOHYA) + one.flush()  # a step's record is out when the bar moves on, or at the end
    pieces, bridge = [], KohyaProgress()
    for i in range(0, len(KOHYA), 7):  # output arrives in arbitrary chunks
        pieces += bridge.feed(KOHYA[i:i + 7])
    pieces += bridge.flush()
    assert pieces == whole == [
        {"step": 1, "total_steps": 2000, "loss": 0.0912, "epoch": 1},
        {"step": 2, "total_steps": 2000, "loss": 0.0877, "epoch": 1},
        {"step": 250, "total_steps": 2000, "epoch": 1},  # nan is not a loss
        {"step": 251, "total_steps": 2000, "loss": 9.84e-05, "epoch": 2},
    ]


AXOLOTL = (
    "  0%|          | 0/300 [00:00<?, ?it/s]\r  0%|          | 1/300 [00:04<22:13,  4.46s/it]"
    "{'loss': '1.873', 'grad_norm': '0.5504', 'learning_rate': '0', 'epoch': '0.01'}\n"
    "\r  1%|          | 2/300 [00:08<21:02,  4.24s/it]{'loss': '1.812', 'grad_norm': '0.5121', "
    "'learning_rate': '2.222e-05', 'epoch': '0.02'}\n"
    "\r 17%|█▋        | 50/300 [03:30<17:30,  4.20s/it]\n"
    "{'eval_loss': '1.402', 'eval_runtime': '12.5', 'eval_samples_per_second': '12', 'epoch': '0.5'}\n"
    "{'train_runtime': '1260', 'train_samples_per_second': '3.5', 'train_loss': '1.1', 'epoch': '3'}\n"
)


def test_axolotl_trainer_logs_get_the_bar_step():
    assert HFTrainerLogs().feed(AXOLOTL) == [
        {"step": 1, "loss": 1.873, "lr": 0.0, "grad_norm": 0.5504, "epoch": 0.01},
        {"step": 2, "loss": 1.812, "lr": 2.222e-05, "grad_norm": 0.5121, "epoch": 0.02},
        {"step": 50, "epoch": 0.5, "val_loss": 1.402},
    ]


RECORDED = Path(__file__).resolve().parent / "recorded"


def test_ai_toolkit_loss_db_is_read_incrementally(tmp_path):
    """The database ai-toolkit's own UILogger wrote (tools/upstream_check.py record): its loss is
    the key ``loss/loss``, and it reaches metrics.jsonl as ``loss``."""
    db = tmp_path / "loss_log.db"
    bridge = AiToolkitSqlite(db)
    assert bridge.poll() == []  # not written yet
    con = sqlite3.connect(db, isolation_level=None)
    con.executescript((RECORDED / "ai-toolkit" / "loss_log.sql").read_text())
    # its steps are numbered from 0: step k is the run's k + 1 (tests/recorded/aitk-sd15)
    assert bridge.poll() == [{"step": 1, "lr": 2e-05, "loss": 0.5}, {"step": 2, "lr": 2e-05, "loss": 0.4375}]
    # the next step as UILogger._flush writes it; another loss term keeps its own name
    con.execute("INSERT INTO steps VALUES (2, ?)", (time.time(),))
    con.executemany("INSERT INTO metrics VALUES (2, ?, ?, NULL)", [("loss/loss", 0.3), ("loss/diff_output", 0.2)])
    assert bridge.poll() == [{"step": 3, "loss": 0.3, "loss_diff_output": 0.2}]
    assert bridge.poll() == []
    con.close()


def _mirror(trainer: str, work, name: str, run) -> Mirror:
    return Mirror(get(trainer), Layout(str(work)), name, run, keep_last=2)


def test_ai_toolkit_outputs_land_in_the_run_folder(tmp_path):
    root = tmp_path / "trainer" / "out" / "mug"
    (root / "samples").mkdir(parents=True)
    for step in (250, 500):
        (root / f"mug_{step:09d}.safetensors").write_bytes(b"w" * step)
    (root / "samples" / "1764547200000__000000250_0.jpg").write_bytes(b"jpg")
    (root / "optimizer.pt").write_bytes(b"o")
    run = tmp_path / "run"
    mirror = _mirror("ai-toolkit", tmp_path, "mug", run)
    assert mirror.sync() == []  # first sight: not yet known to be complete
    # mug_<k> is saved after ai-toolkit's step k, the run's step k + 1
    assert mirror.sync() == [("checkpoint", "step-251"), ("checkpoint", "step-501")]
    (root / "mug.safetensors").write_bytes(b"final")
    mirror.sync()
    assert not (run / "adapter").exists()  # the final file only once the trainer has exited
    mirror.sync(final=True)
    assert (run / "checkpoints" / "step-501" / "mug_000000500.safetensors").stat().st_size == 500
    assert (run / "samples" / "1764547200000__000000250_0.jpg").read_bytes() == b"jpg"
    assert (run / "adapter" / "mug.safetensors").read_bytes() == b"final"


def test_axolotl_checkpoints_rotate_and_the_adapter_arrives(tmp_path):
    out = tmp_path / "trainer" / "out"
    run = tmp_path / "run"
    mirror = _mirror("axolotl", tmp_path, "chat", run)
    for step in (100, 200, 300):
        ck = out / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        (ck / "adapter_model.safetensors").write_bytes(b"a" * step)
        (ck / "trainer_state.json").write_text("{}")
        mirror.sync()
        mirror.sync()
        time.sleep(0.01)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-200", "step-300"]  # keep_last 2
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        (out / f).write_text(f)
    mirror.sync(final=True)
    assert sorted(p.name for p in (run / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert get("axolotl").stop_trigger(Layout(str(tmp_path))) == out / "axolotl_checkpoint.save"
