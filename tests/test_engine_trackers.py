"""Live trackers: the engine's metrics and samples in W&B (the real client, offline) and TensorBoard.

The rows are read back with W&B's own reader of its transaction log (``wandb leet inspect --json``,
which runs wandb-core's parser of the ``.wandb`` file), not by lorapod's code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorapod.engine.llm import train_llm
from lorapod.engine.metrics import MetricsWriter
from lorapod.engine.trackers import WandbTracker, read_tracking, scalars
from lorapod.errors import SpecError
from lorapod.rundir import RunDir
from lorapod.spec import WandbSpec, apply_report_to, load_spec

from .llm_fixtures import make_assets, spec_dict

wandb = pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch, tmp_path):
    """W&B's documented offline mode: the client writes its run files and sends nothing."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def wandb_records(run_root: Path) -> list[dict]:
    """Every record of the run's .wandb file(s), as W&B's own inspector prints them."""
    files = sorted((run_root / "wandb").glob("*run-*/run-*.wandb"))
    assert files, "no W&B run file written"
    exe = Path(sys.executable).with_name("wandb")
    out: list[dict] = []
    for f in files:
        proc = subprocess.run([str(exe), "leet", "inspect", "--json", str(f)], capture_output=True, text=True,
                              timeout=60, check=True)
        out += [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return out


def history(records: list[dict]) -> dict[int, dict]:
    """step -> the history row W&B committed for it."""
    rows: dict[int, dict] = {}
    for r in records:
        if r["type"] == "history":
            rows.setdefault(int(r["history"]["step"].get("num", 0)), {}).update(r["history"]["item"])
    return rows


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("llm"))


def _spec(assets, tmp_path, **extra):
    _root, model_dir, tr, va = assets
    raw = spec_dict(model_dir, tr, va, tmp_path / "runs", epochs=1, max_steps=6)
    raw["samples"] = {"prompts": ["What colour is a banana?"], "every_steps": 3, "max_new_tokens": 4}
    raw["compute"] = {"usd_per_hour": 0.74}
    raw["tracking"] = {"wandb": {"project": "fruit", "entity": "lorapod-tests", "name": "demo"}}
    for k, v in extra.items():
        raw[k] = v
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


def test_engine_logs_every_metric_and_the_answers_to_wandb(assets, tmp_path):
    spec, run = _spec(assets, tmp_path)
    train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    records = wandb_records(run.root)
    meta = next(r["run"] for r in records if r["type"] == "run")
    assert (meta["project"], meta["entity"], meta["display_name"]) == ("fruit", "lorapod-tests", "demo")
    assert json.loads(json.dumps(meta["config"]["update"]["train"]))["max_steps"] == 6
    rows = history(records)
    for step in range(1, 7):
        row = rows[step]
        for key in ("train/loss", "train/lr", "train/tokens_per_s", "train/real_tokens_per_s", "cost/usd",
                    "system/ram_gb", "train/epoch"):
            assert key in row, (step, key, sorted(row))
    assert rows[6]["cost/usd"] > rows[1]["cost/usd"] > 0
    assert "val/loss" in rows[4] and "val/ppl" in rows[4]  # eval.every_steps 4
    assert "val/loss" in rows[0]  # the base model's, before training
    # the answers at steps 3 and 6 as W&B tables, each a file W&B wrote into the run
    assert rows[3]["samples/answers._type"] == rows[6]["samples/answers._type"] == "table-file"
    assert "samples/answers._type" not in rows[4]
    # metrics.jsonl holds the same losses W&B got
    losses = {r["step"]: r["loss"] for r in map(json.loads, run.metrics_file.read_text().splitlines()) if "loss" in r}
    assert rows[5]["train/loss"] == pytest.approx(losses[5])
    info = read_tracking(run.root)["wandb"]
    assert info["mode"] == "offline" and info["url"] is None and info["id"] == meta["run_id"]
    assert (run.root / info["dir"]).is_dir()


def test_resume_continues_the_same_wandb_run(assets, tmp_path):
    spec, run = _spec(assets, tmp_path)

    class Crash(Exception):
        pass

    def crash(state, loss):
        if state.step == 4:
            raise Crash

    with pytest.raises(Crash):
        train_llm(spec, run, device="cpu", on_step=crash, show_progress=False, log=lambda m: None)
    first = read_tracking(run.root)["wandb"]["id"]
    train_llm(spec, run, resume=True, device="cpu", show_progress=False, log=lambda m: None)
    assert read_tracking(run.root)["wandb"]["id"] == first
    ids = {r["run"]["run_id"] for r in wandb_records(run.root) if r["type"] == "run"}
    assert ids == {first}


def test_image_and_clip_samples_go_to_wandb_and_tensorboard(tmp_path):
    from PIL import Image

    run = RunDir(tmp_path / "run")
    run.samples.mkdir(parents=True)
    tracker = WandbTracker(WandbSpec(project="p"), run.root, {}, "img")
    metrics = MetricsWriter(run.metrics_file, run.tensorboard, trackers=[tracker])
    metrics.samples(run.samples, 0)
    Image.new("RGB", (8, 8), (255, 0, 0)).save(run.samples / "step000002-00.png")
    import numpy as np

    from lorapod.data.clips import write_clip

    write_clip(run.samples / "step000002-01.mp4", [np.full((16, 16, 3), 40 * i, np.uint8) for i in range(5)])
    metrics.log({"step": 2, "loss": 0.5, "step_time_s": 0.25})
    metrics.samples(run.samples, 2)
    metrics.close()
    rows = history(wandb_records(run.root))
    assert rows[2]["train/it_per_s"] == pytest.approx(4.0)
    assert rows[2]["samples/00._type"] == "image-file"
    assert rows[2]["samples/01._type"] == "video-file"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.tensorboard))
    acc.Reload()
    assert "samples/step000002-00" in acc.Tags()["images"]
    assert [e.value for e in acc.Scalars("train/loss")] == [0.5]


def test_a_failing_tracker_never_ends_the_run(tmp_path):
    class Broken:
        name = "broken"

        def log(self, values, step):
            raise ConnectionError("network down")

        def sample(self, path, step):
            raise AssertionError

        def close(self):
            pass

    events: list[str] = []
    m = MetricsWriter(tmp_path / "metrics.jsonl", trackers=[Broken()], event=events.append)
    with pytest.warns(UserWarning, match="broken: stopped logging"):
        m.log({"step": 1, "loss": 1.0})
    m.log({"step": 2, "loss": 0.5})
    m.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert events and "network down" in events[0]


def test_names_are_shared_by_every_tracker():
    got = scalars({"step": 3, "epoch": 0.5, "loss": 1.0, "lr": 1e-4, "mem_gb": 12.5, "usd": 0.1,
                   "tokens_per_s": 900.0, "step_time_s": 0.5})
    assert got == {"train/loss": 1.0, "train/lr": 1e-4, "system/vram_gb": 12.5, "cost/usd": 0.1,
                   "train/tokens_per_s": 900.0, "train/step_time_s": 0.5, "train/epoch": 0.5}
    assert scalars({"step": 4, "event": "eval", "val_loss": 2.0, "val_ppl": 7.4}) == {
        "val/loss": 2.0, "val/ppl": 7.4}


def test_report_to_and_mlflow(assets, tmp_path):
    spec, _run = _spec(assets, tmp_path)
    assert apply_report_to(spec, "none").tracking.wandb is None
    off = apply_report_to(spec, "tensorboard")
    assert off.tracking.tensorboard and off.tracking.wandb is None
    plain = spec.model_copy(deep=True)
    plain.tracking.wandb = None
    on = apply_report_to(plain, "wandb")
    assert on.tracking.wandb.project == "lorapod" and not on.tracking.tensorboard
    with pytest.raises(SpecError, match="--report-to"):
        apply_report_to(spec, "wandb,comet")
    with pytest.raises(SpecError, match="mlflow is not supported"):
        load_spec(raw={"model": {"id": "x"}, "data": {"path": "d"}, "tracking": {"mlflow": {"uri": "file:x"}}})


def test_ps_json_and_the_summary_carry_the_wandb_url(tmp_path):
    from lorapod.compute.jobs import ps_rows
    from lorapod.compute.session import Summary
    from lorapod.engine.trackers import write_tracking
    from lorapod.store.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.db")
    run_dir = tmp_path / "runs" / "job-1"
    run_dir.mkdir(parents=True)
    ledger.job_started("job-1", str(run_dir), "runpod", None, None, 1.0, 1.0)
    assert ps_rows(ledger)[0]["wandb_url"] is None
    write_tracking(run_dir, {"wandb": {"id": "abc", "mode": "online", "url": "https://wandb.ai/team/p/runs/abc"}})
    assert ps_rows(ledger)[0]["wandb_url"] == "https://wandb.ai/team/p/runs/abc"
    assert Summary("job-1", run_dir, "done", 3, 0.1, "ok").to_dict()["wandb_url"] == "https://wandb.ai/team/p/runs/abc"
    # what an instance wrote is bounded: a non-https URL or a huge value is not shown
    write_tracking(run_dir, {"wandb": {"url": "javascript:alert(1)"}})
    assert ps_rows(ledger)[0]["wandb_url"] is None


def test_the_instance_gets_the_wandb_client_only_with_wandb_on(assets, tmp_path):
    from lorapod.compute.bootstrap import extra_for

    spec, _run = _spec(assets, tmp_path)
    assert extra_for(spec) == "llm,track"
    assert extra_for(apply_report_to(spec, "tensorboard")) == "llm"
