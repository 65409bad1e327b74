"""lorapod's bridge, mirror and LoRA checks against real sd-scripts / musubi-tuner / ai-toolkit runs.

The fixtures under tests/recorded/<case>/ come from the trainers' own code at lorapod's pinned
commits, trained for real on CPU from lorapod's job (``lorapod train SPEC --trainer X
--trainer-src CHECKOUT``) by tools/upstream/real_run.py ``--record``: the trainer's output as it
printed it (``\\r`` kept), the loss it logged itself (its TensorBoard events / loss_log.db), the
files it wrote and the run folder lorapod made of them, the LoRA's key names and shapes. The runs
themselves are tests/test_trainers_real_runs.py (``upstream``, in .ci/run's trainer stage).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from lorapod.trainers import get
from lorapod.trainers.base import Layout
from lorapod.trainers.bridge import KohyaProgress
from lorapod.trainers.runner import Mirror

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "recorded"


def files(case: str) -> dict:
    return json.loads((RECORDED / case / "files.json").read_text())


def log(case: str, name: str = "two-steps") -> str:
    return (RECORDED / case / f"{name}.log").read_bytes().decode("utf-8", errors="replace")


def bridged(bridge, text: str, chunk: int = 4096) -> list[dict]:
    recs = []
    for i in range(0, len(text), chunk):  # the wrapper reads the output in chunks of any size
        recs += bridge.feed(text[i:i + chunk])
    return recs + bridge.flush()


def bar_value(x: float) -> float:
    """What the kohya bar shows of a logged value: tqdm's format_num, ``{:.3g}``."""
    return float(f"{x:.3g}")


def phase(case: str, name: str = "two-steps") -> dict:
    return files(case)["runs"][name]


@pytest.mark.parametrize("case", ["sd15", "wan", "qwenimage"])
def test_kohya_bridge_gives_each_step_the_loss_the_trainer_logged(case):
    """The trainer (sd-scripts; musubi-tuner, Wan and Qwen-Image) redraws its bar on update(1) with the previous step's
    avr_loss before it sets the new one: lorapod's record for every step, the last included, carries
    that step's own loss, the ``loss/average`` the trainer wrote to TensorBoard (to the bar's 3
    significant digits)."""
    (logged,) = phase(case)["trainer_logged"]
    assert [s for s, _ in logged] == [1, 2]
    for chunk in (4096, 7):
        recs = bridged(KohyaProgress(), log(case), chunk)
        assert [r["step"] for r in recs] == [1, 2]
        assert [r.get("loss") for r in recs] == [bar_value(v) for _, v in logged]
        assert recs == phase(case)["metrics"]


def test_wan_clips_job_as_musubis_dataset_code_reads_it():
    """examples/wan21-video-clips.yaml's job (2 real 30 fps clips + 2 stills in one folder) through
    musubi-tuner's own config sanitizer, datasets and caching: the clips as a video dataset at
    source_fps 30 (resampled to 16) with target_frames 1 and 5, the stills as an image dataset over
    the same folder; 6 items (2 clips x 2 windows + 2 stills), each cached once, all trained."""
    text = log("wan")
    assert 'video_directory: "/r/clips"' in text and 'image_directory: "/r/clips"' in text
    assert "target_frames: (1, 5)" in text and "source_fps: 30.0" in text
    assert re.search(r"num train items / \S+: 6\b", text)
    assert "lorapod trainer-run: done at step 2" in text


def state_of(tmp_path: Path, case: str, name: str, key: str) -> Path:
    """A checkpoint folder with the train_state.json sd-scripts wrote for it (its values from the
    trainer's own log line "save train state to .../NAME-step0000000N-state/train_state.json at epoch E step N")."""
    n = int(key.split("-")[1])
    m = re.search(rf"step{n:08d}-state/train_state\.json at epoch (\d+) step (\d+)", log(case, name))
    ckpt = tmp_path / "pulled" / key
    (ckpt / "state").mkdir(parents=True)
    (ckpt / "state" / "train_state.json").write_text(json.dumps({"current_epoch": int(m.group(1)),
                                                                  "current_step": int(m.group(2))}))
    return ckpt


def resumed_job(tmp_path: Path):
    from lorapod.trainers.job import Command, TrainerJob

    job = TrainerJob("sd-scripts", {}, [], [Command("train", ["python", "train_network.py"], "train")],
                     str(tmp_path / "out"), "real")
    get("sd-scripts").resume(job, state_of(tmp_path, "sd15", "two-steps", "step-2"))
    return job


def test_sd_scripts_resume_continues_at_the_states_step(tmp_path):
    """Resumed from step 2, sd-scripts counts its bar and its step saves from 0 again (its log:
    "skipping 2 steps", then steps 1/4 and 2/4, files step00000001/2); lorapod records steps 3 and 4
    with the losses the resumed trainer logged, and the bar's total, 4."""
    job = resumed_job(tmp_path)
    assert job.commands[-1].argv[-3:] == ["--resume", str(tmp_path / "pulled" / "step-2" / "state"),
                                          "--skip_until_initial_step"]
    assert job.step_offset == 2
    assert "skipping 2 steps" in log("sd15", "resume")
    _first, resumed = phase("sd15", "resume")["trainer_logged"]
    assert [s for s, _ in resumed] == [1, 2]  # the trainer's own numbering after the resume
    recs = bridged(get("sd-scripts").metrics_parser(job), log("sd15", "resume"))
    assert [(r["step"], r["total_steps"]) for r in recs] == [(3, 4), (4, 4)]
    assert [r["loss"] for r in recs] == [bar_value(v) for _, v in resumed]
    assert phase("sd15", "resume")["metrics"] == phase("sd15")["metrics"] + recs


def replay(mirror: Mirror, out: Path, listing: list[str], name: str) -> None:
    """The trainer's files in the order it wrote them: each step's LoRA and state, then the final
    LoRA and state (train_network.py: step saves in the loop, save_state_on_train_end at the end),
    the mirror polling in between as the runner does."""
    def step_of(rel: str) -> int:
        m = re.match(rf"{name}-step(\d+)", rel)
        return int(m.group(1)) if m else 10 ** 9
    groups: dict[int, list[str]] = {}
    for rel in listing:
        groups.setdefault(step_of(rel), []).append(rel)
    for k in sorted(groups):
        for rel in groups[k]:
            p = out / rel
            if rel.endswith("/"):
                p.mkdir(parents=True, exist_ok=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(rel.encode())
        mirror.sync()
        time.sleep(0.02)
        mirror.sync(final=k == 10 ** 9)


def run_listing(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) + ("/" if p.is_dir() else "") for p in run.rglob("*")
                  if p.relative_to(run).parts[0] in ("checkpoints", "adapter"))


def recorded_listing(case: str, name: str) -> list[str]:
    return sorted(r for r in phase(case, name)["run"] if r.startswith(("checkpoints/", "adapter/")))


def test_kohya_final_state_does_not_count_against_keep_last(tmp_path):
    """keep_last 2 with saves every step: sd-scripts kept step 1 and step 2 and its final state;
    the run folder keeps both steps too (the final state is not one of keep_last)."""
    rec = phase("sd15")
    layout = Layout(str(tmp_path))
    mirror = Mirror(get("sd-scripts"), layout, "real", tmp_path / "run", keep_last=2)
    replay(mirror, Path(layout.out), rec["trainer_out"], "real")
    kept_by_trainer = sorted(f"step-{int(m.group(1))}" for r in rec["trainer_out"]
                             if (m := re.fullmatch(r"real-step(\d+)\.safetensors", r)))
    assert kept_by_trainer == ["step-1", "step-2"]
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == sorted([*kept_by_trainer, "last"])
    assert run_listing(tmp_path / "run") == recorded_listing("sd15", "two-steps")


def test_kohya_resumed_saves_are_the_runs_next_steps_and_leave_earlier_ones_alone(tmp_path):
    """The resumed sd-scripts writes real-step00000001/2 again (its own count): they are the run's
    steps 3 and 4, and the run folder's step 1/2 files, hard links of the trainer's, are not
    rewritten through those names (the runner unlinks the trainer's old copies first)."""
    from lorapod.trainers.runner import _clear_outputs

    layout = Layout(str(tmp_path))
    trainer = get("sd-scripts")
    run = tmp_path / "run"
    replay(Mirror(trainer, layout, "real", run, keep_last=2), Path(layout.out), phase("sd15")["trainer_out"], "real")
    step1 = run / "checkpoints" / "step-1" / "real-step00000001.safetensors"
    before = step1.read_bytes()
    job = resumed_job(tmp_path)
    _clear_outputs(trainer, layout, "real")
    assert not any(Path(layout.out).iterdir())
    mirror = Mirror(trainer, layout, "real", run, keep_last=4, step_offset=job.step_offset)
    replay(mirror, Path(layout.out), phase("sd15", "resume")["trainer_out"], "real")
    assert step1.read_bytes() == before
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["last", "step-1", "step-2", "step-3", "step-4"]
    # with the spec's keep_last (2), as the real run's folder
    shutil.rmtree(run)
    replay(Mirror(trainer, layout, "real", run, keep_last=2), Path(layout.out), phase("sd15")["trainer_out"], "real")
    _clear_outputs(trainer, layout, "real")
    replay(Mirror(trainer, layout, "real", run, keep_last=2, step_offset=2), Path(layout.out),
           phase("sd15", "resume")["trainer_out"], "real")
    assert run_listing(run) == recorded_listing("sd15", "resume")


def test_mirror_relinking_the_same_file_leaves_no_temporary(tmp_path):
    """Mirroring a file already linked in place (a resumed runner's first sync) is a no-op; rename()
    of a hard link onto the same file does nothing, and left the .tmp- link behind (seen in the
    real resume's run folder)."""
    from lorapod.trainers.runner import _link_file

    src, dest = tmp_path / "a.safetensors", tmp_path / "run" / "a.safetensors"
    src.write_bytes(b"x")
    _link_file(src, dest)
    _link_file(src, dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["a.safetensors"]


def test_ai_toolkit_real_two_step_run_ends_at_step_2(tmp_path):
    """A real ai-toolkit run of 2 steps logs its loss once, at its step 1 (its steps count from 0 and
    the first is not logged), and saves NAME_000000001 after its second update: lorapod's metrics are
    step 2 with that loss, the checkpoint is step-2, and the job ends "done at step 2"."""
    import sqlite3

    from lorapod.trainers.bridge import AiToolkitSqlite

    rec = phase("aitk-sd15")
    ((logged,),) = [rec["trainer_logged"]]
    assert [s for s, _ in logged] == [1]
    db = tmp_path / "loss_log.db"
    con = sqlite3.connect(db, isolation_level=None)
    schema = (RECORDED / "ai-toolkit" / "loss_log.sql").read_text()  # the real UILogger's tables
    con.executescript("".join(x + ";\n" for x in schema.split(";\n") if x.lstrip().startswith("CREATE")))
    for step, loss in logged:  # the rows it wrote in the real run
        con.execute("INSERT INTO steps VALUES (?, 0)", (step,))
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, NULL)", [(step, "learning_rate", 1e-4),
                                                                        (step, "loss/loss", loss)])
    con.close()
    assert AiToolkitSqlite(db).poll() == rec["metrics"] == [{"step": 2, "lr": 1e-4, "loss": logged[0][1]}]
    assert "lorapod trainer-run: done at step 2" in log("aitk-sd15")
    layout = Layout(str(tmp_path / "w"))
    out = Path(layout.out)
    for rel in rec["trainer_out"]:
        (out / rel).mkdir(parents=True, exist_ok=True) if rel.endswith("/") else (out / rel).write_bytes(b"x")
    run = tmp_path / "run"
    mirror = Mirror(get("ai-toolkit"), layout, "real", run, keep_last=2)
    mirror.sync()
    time.sleep(0.02)
    mirror.sync(final=True)
    assert run_listing(run) == recorded_listing("aitk-sd15", "two-steps")


def write_lora(path: Path, keys: dict[str, list[int]]) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({k: torch.full(shape, 0.01) for k, shape in keys.items()}, str(path))


def sd15_unet_meta():
    import torch
    from diffusers import UNet2DConditionModel

    sys.path.insert(0, str(REPO / "tools" / "upstream"))
    from real_models import SD15_UNET

    with torch.device("meta"):
        return UNet2DConditionModel(**SD15_UNET)


def test_sd_scripts_real_lora_loads_in_comfyui_and_inspect(tmp_path):
    """The LoRA sd-scripts saved (its key names and shapes): ComfyUI's key rule finds every module
    on SD 1.5's U-Net and drops none; ``lorapod inspect`` reads it as a kohya SD 1.5 LoRA."""
    from lorapod.export.inspect import inspect_file

    from .comfy_consumer import unet_keys

    keys = files("sd15")["lora"]["keys"]
    assert keys and all(k.startswith("lora_unet_") for k in keys)  # --network_train_unet_only
    assert files("aitk-sd15")["lora"]["keys"].keys() == keys.keys()  # ai-toolkit's sd1 LoRA: the same modules
    key_map = unet_keys(sd15_unet_meta())
    modules = {k.split(".")[0] for k in keys}
    assert sorted(m for m in modules if m not in key_map) == []
    path = tmp_path / "real.safetensors"
    write_lora(path, keys)
    report = inspect_file(path)
    assert report["format"] == "kohya" and report["rank"] == [4]
    assert report["consumers"]["ComfyUI"]["drops"] == [] and report["consumers"]["ComfyUI"]["loads"] == len(modules)


# The real runs themselves: tests/test_trainers_real_runs.py (`upstream`).


def sd_scripts_bucket_check(resolution: int, min_reso: int, max_reso: int, steps: int = 64) -> None:
    """sd-scripts' own rule, library/train_util.py adjust_min_max_bucket_reso_by_steps at 48d368fa
    (restated, not copied): min rounded down and max rounded up to the step, then asserted."""
    min_reso -= min_reso % steps
    if max_reso % steps:
        max_reso += steps - max_reso % steps
    assert resolution >= min_reso, "min_bucket_reso must be equal or less than resolution"
    assert resolution <= max_reso, "max_bucket_reso must be equal or greater than resolution"


@pytest.mark.parametrize("resolution", [64, 100, 128, 200, 255, 256, 512, 1024, 1100, 1536])
def test_sd_scripts_bucket_bounds_hold_for_every_resolution(tmp_path, resolution):
    """data.resolution below 256 (or above 1024) with buckets: the dataset TOML's bucket bounds pass
    sd-scripts' start-up assertion (sd-scripts' defaults 256/1024 are used when not written)."""
    import tomllib

    import yaml

    from lorapod.spec import load_spec
    from lorapod.trainers import prepare

    (tmp_path / "mug").mkdir()
    raw = {"model": {"id": "stable-diffusion-v1-5/stable-diffusion-v1-5", "family": "sd15"},
           "data": {"path": str(tmp_path / "mug"), "format": "images", "resolution": resolution, "buckets": True,
                    "cache_text_encoder_outputs": False},
           "train": {"max_steps": 2}, "output": {"name": "m"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    _, job = prepare(load_spec(tmp_path / "s.yaml"), "sd-scripts", Layout(str(tmp_path / "w")))
    ds = tomllib.loads(next(t for p, t in job.files.items() if p.endswith("dataset.toml")))["datasets"][0]
    sd_scripts_bucket_check(resolution, ds.get("min_bucket_reso", 256), ds.get("max_bucket_reso", 1024))


def test_sd_scripts_trains_at_resolution_128_with_buckets():
    """The real run at data.resolution 128 with buckets: sd-scripts read lorapod's min_bucket_reso
    128 (its own dataset printout), made a (128, 128) bucket and trained both steps; before, it
    stopped at start-up ("min_bucket_reso must be equal or less than resolution")."""
    text = log("sd15-128")
    assert re.search(r"min_bucket_reso: 128\b", text)
    assert re.search(r"bucket 0: resolution \(128, 128\), count: 2", text)
    assert "lorapod trainer-run: done at step 2" in text
    assert phase("sd15-128")["metrics"][-1]["step"] == 2


def test_musubi_resume_trains_the_steps_left_and_counts_on(tmp_path):
    """musubi-tuner's --resume restores the state but starts at step 0 and would train
    max_train_steps again; lorapod asks for the steps left (4 - 2) and counts them as 3 and 4: the
    real resumed run logged its steps 1 and 2 (bar 2/2), recorded as the run's 3 and 4 of 4."""
    from lorapod.trainers.job import Command, TrainerJob

    ckpt = tmp_path / "step-2"
    (ckpt / "state").mkdir(parents=True)  # musubi's state folder holds no train_state.json
    job = TrainerJob("musubi-tuner", {}, [], [Command("train", ["python", "wan_train_network.py",
                                                                "--max_train_steps", "4"], "train")], "/o", "real")
    trainer = get("musubi-tuner")
    trainer.resume(job, ckpt)
    assert job.commands[-1].argv[2:] == ["--max_train_steps", "2", "--resume", str(ckpt / "state")]
    _first, resumed = phase("wan", "resume")["trainer_logged"]
    assert [s for s, _ in resumed] == [1, 2]
    recs = bridged(trainer.metrics_parser(job), log("wan", "resume"))
    assert [(r["step"], r["total_steps"]) for r in recs] == [(3, 4), (4, 4)]
    assert [r["loss"] for r in recs] == [bar_value(v) for _, v in resumed]
    assert phase("wan", "resume")["metrics"] == phase("wan")["metrics"] + recs
    assert "checkpoints/step-4/state/" in phase("wan", "resume")["run"]
