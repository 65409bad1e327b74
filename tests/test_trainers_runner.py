"""The job wrapper run locally with the ai-toolkit STAND-IN (tests/standins/ai-toolkit): the
loss SQLite becomes metrics.jsonl, checkpoints and samples land in the run folder, STOP ends the
trainer at its next save, and a rerun continues from the pulled checkpoint."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapod.spec import load_spec
from lorapod.trainers.runner import run_trainer

STANDIN = Path(__file__).resolve().parent / "standins" / "ai-toolkit"


def flux_spec(tmp: Path, steps: int, every: int) -> Path:
    (tmp / "mug").mkdir()
    for i in range(2):
        (tmp / "mug" / f"{i}.jpg").write_bytes(b"")
    raw = {"model": {"id": "black-forest-labs/FLUX.2-klein-base-4B", "family": "flux2", "variant": "4b"},
           "data": {"path": "mug", "format": "images", "trigger": "zxq"},
           "train": {"max_steps": steps}, "save": {"every_steps": every, "keep_last": 2},
           "samples": {"prompts": ["zxq mug"], "every_steps": every}, "output": {"name": "mug"}}
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_ai_toolkit_job_fills_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_STANDIN_STEP_S", "0.01")
    spec = load_spec(flux_spec(tmp_path, steps=30, every=10))
    lines: list[str] = []
    state = run_trainer(spec, "ai-toolkit", tmp_path / "run", tmp_path / "work", src=str(STANDIN), poll_s=0.1,
                        say=lines.append)
    assert state == "done", lines
    run = tmp_path / "run"
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # ai-toolkit's step k (from 0, the first never logged) is the run's step k + 1
    assert [r["step"] for r in recs] == list(range(2, 31))
    assert recs[2]["step"] == 4 and recs[2]["loss"] == 0.125 and recs[2]["lr"] == 2e-4  # the spec default
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-11", "step-21"]
    assert (run / "checkpoints" / "step-21" / "mug_000000020.safetensors").is_file()
    assert len(list((run / "samples").glob("*__0000000[12]0_0.jpg"))) == 2
    assert (run / "adapter" / "mug.safetensors").read_bytes() == b"final"


def test_stop_waits_for_the_next_save_then_resume_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_STANDIN_STEP_S", "0.02")
    spec = load_spec(flux_spec(tmp_path, steps=2000, every=25))
    run = tmp_path / "run"

    def stop_soon() -> None:
        while not (run / "metrics.jsonl").is_file() or len((run / "metrics.jsonl").read_text().splitlines()) < 30:
            time.sleep(0.05)
        (run / "STOP").write_text("test\n")

    threading.Thread(target=stop_soon, daemon=True).start()
    t0 = time.monotonic()
    state = run_trainer(spec, "ai-toolkit", run, tmp_path / "work", src=str(STANDIN), poll_s=0.1, say=print)
    assert state == "stopped" and time.monotonic() - t0 < 30
    keys = sorted((p.name for p in (run / "checkpoints").iterdir()), key=lambda k: int(k.split("-")[1]))
    assert int(keys[-1].split("-")[1]) >= 50  # a save that came after STOP (at step >= 30)
    assert not (run / "adapter").exists()
    # lorapod run --resume: the newest checkpoint is put back where ai-toolkit resumes from
    (run / "STOP").unlink()
    from lorapod.trainers import get
    from lorapod.trainers.base import Layout
    from lorapod.trainers.runner import newest_checkpoint

    trainer = get("ai-toolkit")
    job = trainer.build(spec, Layout(str(tmp_path / "work")))
    trainer.resume(job, newest_checkpoint(run))
    link = [p for p, text in job.files.items() if text.startswith("@link:")]
    assert link == [f"{tmp_path / 'work'}/trainer/out/mug/mug_{int(keys[-1].split('-')[1]) - 1:09d}.safetensors"]


def _sd_scripts_mug(tmp_path: Path) -> tuple[Path, Any]:
    """The sd-scripts stand-in and an SDXL spec of three images x 20 repeats, 2 epochs, its state
    saved every 20 steps (two kept)."""
    sd = Path(__file__).resolve().parent / "standins" / "sd-scripts"
    (tmp_path / "mug").mkdir()
    for i in range(3):
        (tmp_path / "mug" / f"{i}.png").write_bytes(b"")
    raw = {"model": {"id": "stabilityai/stable-diffusion-xl-base-1.0", "family": "sdxl"},
           "data": {"path": "mug", "format": "images", "repeats": 20}, "train": {"epochs": 2},
           "save": {"every_steps": 20, "every_epochs": None, "keep_last": 2}, "output": {"name": "mug"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    return sd, load_spec(tmp_path / "s.yaml")


@pytest.mark.slow
def test_sd_scripts_stop_then_resume_gives_one_unbroken_curve(tmp_path):
    """STOP mid-run (the stand-in saves state every 20 steps), then a rerun on the same run folder
    continues from the newest state folder: metrics 1..N once each, the final LoRA at the end."""
    sd, spec = _sd_scripts_mug(tmp_path)
    run, work = tmp_path / "run", tmp_path / "work"

    def stop_after_a_save() -> None:
        while not (run / "checkpoints" / "step-20").is_dir():
            time.sleep(0.05)
        (run / "STOP").write_text("test\n")

    threading.Thread(target=stop_after_a_save, daemon=True).start()
    assert run_trainer(spec, "sd-scripts", run, work, src=str(sd), poll_s=0.2, say=print) == "stopped"
    stopped_at = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    assert stopped_at >= 40 and not (run / "adapter").exists()  # it waited for the save after STOP
    (run / "STOP").unlink()
    assert run_trainer(spec, "sd-scripts", run, work, src=str(sd), poll_s=0.2, say=print) == "done"
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 121))
    assert (run / "adapter" / "mug.safetensors").is_file()


def test_axolotl_stop_asks_for_a_checkpoint_now(tmp_path, monkeypatch):
    """axolotl's dynamic checkpoint: on STOP the wrapper drops the trigger file and the next
    checkpoint is the one it was asked for (the regular cadence would be at step 1000)."""
    standin = Path(__file__).resolve().parent / "standins" / "axolotl"
    monkeypatch.setenv("PYTHONPATH", f"{standin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    (tmp_path / "chat.jsonl").write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n"
        for _ in range(10)))
    raw = {"model": {"id": "org/llm", "family": "llm"}, "data": {"path": "chat.jsonl"},
           "train": {"max_steps": 3000}, "save": {"every_steps": 1000}, "output": {"name": "chat"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    spec = load_spec(tmp_path / "s.yaml")
    run = tmp_path / "run"

    def stop_soon() -> None:
        while not (run / "metrics.jsonl").is_file() or len((run / "metrics.jsonl").read_text().splitlines()) < 20:
            time.sleep(0.05)
        (run / "STOP").write_text("test\n")

    threading.Thread(target=stop_soon, daemon=True).start()
    state = run_trainer(spec, "axolotl", run, tmp_path / "work", src=str(standin), poll_s=0.1, say=print)
    assert state == "stopped"
    (ck,) = (run / "checkpoints").iterdir()
    step = int(ck.name.split("-")[1])
    assert 20 <= step < 1000 and (ck / "trainer_state.json").is_file()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[0] == {"time": recs[0]["time"], "step": 1, "loss": 2.0, "grad_norm": 0.5, "lr": 0.0002,
                       "epoch": 0.001}
    assert not (run / "adapter").exists()


def test_resume_continues_with_the_trainer_the_run_was_started_with(tmp_path, monkeypatch, capsys):
    """`lorapod train --resume RUN` alone must not hand ai-toolkit's checkpoints to lorapod's
    engine: the run folder says which trainer it was started with (trainer.json)."""
    from lorapod.rundir import RunDir

    from .cli_helpers import run_cli

    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    run = RunDir.create(tmp_path / "runs", "mug")
    run.write_spec(load_spec(flux_spec(tmp_path, steps=30, every=10)))
    run.write_trainer("ai-toolkit")

    def cli(*args: str) -> tuple[int, str, str]:
        return run_cli(["train", "--resume", str(run.root), *args], capsys)

    code, out, err = cli("--print")
    assert code == 0 and out.startswith("# trainer: ai-toolkit\n") and "continuing with ai-toolkit" in err
    assert cli("--print", "--trainer", "aitk")[1].startswith("# trainer: ai-toolkit\n")  # an alias of the same one
    code, out, err = cli("--trainer", "kohya")
    assert code != 0 and "was started with --trainer ai-toolkit, not kohya" in err and "Traceback" not in err
    run.trainer_file.write_text("{not json")
    code, out, err = cli("--print")
    assert code != 0 and "trainer.json cannot be read" in err and "Traceback" not in err


def test_for_resume_keeps_lorapods_engine_for_runs_without_a_trainer(tmp_path):
    from lorapod.errors import SpecError
    from lorapod.rundir import RunDir
    from lorapod.trainers import for_resume

    run = RunDir(tmp_path)
    said: list[str] = []
    assert for_resume(run, None, "run", said.append) is None  # lorapod's engine, as before
    assert for_resume(run, "kohya", "run", said.append) == "sd-scripts"  # a folder from before trainer.json
    assert said == []
    run.write_trainer("sd-scripts")
    assert for_resume(run, None, "run", said.append) == "sd-scripts"
    assert said == ["continuing with sd-scripts, the trainer run was started with"]
    with pytest.raises(SpecError, match="not musubi"):
        for_resume(run, "musubi", "run", said.append)


def _sigterm_when(cond) -> threading.Thread:
    """SIGTERM to this process (what job.sh passes on at a preemption) once ``cond()`` holds."""
    import signal

    def go() -> None:
        while not cond():
            time.sleep(0.05)
        go.at = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)

    go.at = None
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.fn = go
    return t


@pytest.mark.slow
def test_sigterm_ends_a_trainer_that_cannot_save_on_demand_at_once_and_the_resume_continues(tmp_path):
    """sd-scripts saves state every save.every_steps and nowhere else: at a preemption it loses
    what it trained since (docs/trainers.md). The wrapper does not wait for a save that will not
    come inside RunPod's 5 s: it returns ``preempted`` at once; a rerun resumes from the newest
    state with one unbroken curve."""
    sd, spec = _sd_scripts_mug(tmp_path)
    run, work = tmp_path / "run", tmp_path / "work"
    t = _sigterm_when(lambda: (run / "checkpoints" / "step-20").is_dir())
    assert run_trainer(spec, "sd-scripts", run, work, src=str(sd), poll_s=0.2, say=print) == "preempted"
    assert time.monotonic() - t.fn.at < 3.0  # well inside the 5 s
    assert (run / "checkpoints" / "step-20" / "state").is_dir() and not (run / "adapter").exists()
    assert run_trainer(spec, "sd-scripts", run, work, src=str(sd), poll_s=0.2, say=print) == "done"
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 121))


def test_sigterm_asks_axolotl_for_a_checkpoint_within_the_window(tmp_path, monkeypatch):
    standin = Path(__file__).resolve().parent / "standins" / "axolotl"
    monkeypatch.setenv("PYTHONPATH", f"{standin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    (tmp_path / "chat.jsonl").write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n"
        for _ in range(10)))
    raw = {"model": {"id": "org/llm", "family": "llm"}, "data": {"path": "chat.jsonl"},
           "train": {"max_steps": 3000}, "save": {"every_steps": 1000}, "output": {"name": "chat"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    spec = load_spec(tmp_path / "s.yaml")
    run = tmp_path / "run"
    t = _sigterm_when(lambda: (run / "metrics.jsonl").is_file()
                      and len((run / "metrics.jsonl").read_text().splitlines()) >= 20)
    state = run_trainer(spec, "axolotl", run, tmp_path / "work", src=str(standin), poll_s=0.1, say=print)
    assert state == "preempted" and time.monotonic() - t.fn.at < 5.0
    (ck,) = (run / "checkpoints").iterdir()  # the one it was asked for (the cadence would be step 1000)
    assert 20 <= int(ck.name.split("-")[1]) < 1000 and (ck / "trainer_state.json").is_file()


def test_the_final_state_records_the_step_it_was_saved_at(tmp_path, monkeypatch):
    """A kohya trainer's final state (``NAME-state``, the run folder's ``checkpoints/last``) has no
    step in its name, and musubi-tuner's holds no train_state.json: the runner writes the run's
    step beside it when the trainer ends, and a resume from it counts on from there (the real
    musubi-tuner resume from ``last`` trained all 4 steps again and logged steps 1, 2 twice)."""
    from lorapod.trainers import get
    from lorapod.trainers.job import Command, TrainerJob
    from lorapod.trainers.runner import FINAL_STATE_STEP

    monkeypatch.setenv("LORAPOD_STANDIN_STEP_S", "0.01")
    sd, _ = _sd_scripts_mug(tmp_path)
    raw = yaml.safe_load((tmp_path / "s.yaml").read_text())
    raw["data"]["repeats"] = 2
    raw["train"] = {"max_steps": 6}
    raw["save"] = {"every_steps": 2, "every_epochs": None, "keep_last": 2}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    run = tmp_path / "run"
    assert run_trainer(load_spec(tmp_path / "s.yaml"), "sd-scripts", run, tmp_path / "work", src=str(sd),
                       poll_s=0.1, say=print) == "done"
    last = run / "checkpoints" / "last"
    assert (last / "state" / "train_state.json").is_file()
    assert json.loads((last / FINAL_STATE_STEP).read_text()) == {"step": 6}
    # musubi-tuner's final state: no train_state.json, the runner's step.json says where it stood
    (last / "state" / "train_state.json").unlink()
    job = TrainerJob("musubi-tuner", {}, [], [Command("train", ["python", "wan_train_network.py",
                                                                "--max_train_steps", "10"], "train")], "/o", "real")
    get("musubi-tuner").resume(job, last)
    assert job.step_offset == 6 and job.commands[-1].argv[2:4] == ["--max_train_steps", "4"]


def test_a_mirrored_final_state_drops_the_step_an_earlier_launch_wrote(tmp_path):
    """Until the runner writes the new step, a replaced final state has none (a crash in between
    must not leave the older launch's step beside a newer state)."""
    from lorapod.trainers import get
    from lorapod.trainers.base import Layout
    from lorapod.trainers.runner import FINAL_STATE_STEP, Mirror

    layout = Layout(str(tmp_path / "work"))
    (Path(layout.out) / "real-state").mkdir(parents=True)
    (Path(layout.out) / "real-state" / "model.safetensors").write_bytes(b"x")
    run = tmp_path / "run"
    (run / "checkpoints" / "last").mkdir(parents=True)
    (run / "checkpoints" / "last" / FINAL_STATE_STEP).write_text('{"step": 2}\n')
    mirror = Mirror(get("musubi-tuner"), layout, "real", run, keep_last=2)
    assert ("state", "last") in mirror.sync(settled=True)
    assert mirror.final_state and not (run / "checkpoints" / "last" / FINAL_STATE_STEP).exists()


def test_musubi_refuses_a_final_state_whose_step_it_cannot_tell(tmp_path):
    from lorapod.trainers import get
    from lorapod.trainers.job import Command, TrainerJob, TrainerRefused

    last = tmp_path / "run" / "checkpoints" / "last"
    (last / "state").mkdir(parents=True)
    job = TrainerJob("musubi-tuner", {}, [], [Command("train", ["python", "zimage_train_network.py",
                                                                "--max_train_steps", "10"], "train")], "/o", "real")
    with pytest.raises(TrainerRefused, match="cannot tell the step") as info:
        get("musubi-tuner").resume(job, last)
    assert f"remove {last}" in (info.value.hint or "")


def test_an_epoch_counted_musubi_job_resumes_as_the_steps_left(tmp_path):
    """musubi-tuner restarts its epochs at 0 on --resume: the examples' Z-Image and Qwen-Image jobs
    (10 epochs) would train all ten again. The run's metrics hold its bar's total; the resumed job
    trains that less the steps done, by step count."""
    from lorapod.trainers import get
    from lorapod.trainers.job import Command, TrainerJob, TrainerRefused

    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step-20"
    (ckpt / "state").mkdir(parents=True)
    argv = ["python", "zimage_train_network.py", "--max_train_epochs", "10", "--seed", "42"]
    job = TrainerJob("musubi-tuner", {}, [], [Command("train", list(argv), "train")], "/o", "real")
    with pytest.raises(TrainerRefused, match="no total step count"):
        get("musubi-tuner").resume(job, ckpt)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "total_steps": 50, "loss": 0.1}) + "\n"
                                               for s in range(1, 21)))
    job = TrainerJob("musubi-tuner", {}, [], [Command("train", list(argv), "train")], "/o", "real")
    get("musubi-tuner").resume(job, ckpt)
    assert job.commands[-1].argv[2:6] == ["--max_train_steps", "30", "--seed", "42"]
    assert job.step_offset == 20 and job.total_offset == 20
