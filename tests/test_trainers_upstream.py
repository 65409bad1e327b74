"""What the trainers' own code does with lorapod's jobs, one test per place where it disagreed.

Each test states the upstream fact it encodes (file at the pinned commit); tools/upstream_check.py
runs the same jobs through that code itself when the checkouts are present (the ``upstream``
tests at the end), and its ``record`` step writes the fixtures under tests/recorded/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorapod.spec import load_spec
from lorapod.trainers import prepare
from lorapod.trainers.base import Layout
from lorapod.trainers.job import TrainerRefused

REPO = Path(__file__).resolve().parents[1]


def write_spec(tmp: Path, raw: dict, files=("a.png", "a.txt")) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    for f in files:
        (data / f).parent.mkdir(parents=True, exist_ok=True)
        (data / f).write_bytes(b"")
    base = {"data": {"path": "data", "format": "images"}, "train": {"max_steps": 10},
            "output": {"dir": str(tmp / "runs"), "name": "t"}}
    for key, val in raw.items():
        base.setdefault(key, {}).update(val)
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def refusal(path: Path, trainer: str) -> str:
    with pytest.raises(TrainerRefused) as info:
        prepare(load_spec(path), trainer, Layout("/w"))
    return str(info.value)


# ------------------------------------------------------------------ item 2: FLUX.2 klein's base


def test_ai_toolkit_klein_is_trained_on_the_base_it_loads(tmp_path):
    """flux2_klein_4b downloads flux-2-klein-base-4b.safetensors from name_or_path
    (flux2_klein_model.py); the distilled repo is refused with the base's id, and the example
    names the base."""
    klein = {"id": "black-forest-labs/FLUX.2-klein-4B", "family": "flux2", "variant": "4b"}
    msg = refusal(write_spec(tmp_path, {"model": klein}), "ai-toolkit")
    assert "loads flux-2-klein-base-4b.safetensors" in msg
    assert "--set model.id=black-forest-labs/FLUX.2-klein-base-4B" in msg
    assert load_spec(REPO / "examples" / "flux2-klein-lora.yaml").model.id == "black-forest-labs/FLUX.2-klein-base-4B"


def test_ai_toolkit_klein_samples_with_its_uis_settings_not_sds(tmp_path):
    """SampleConfig defaults guidance 7 / 20 steps (config_modules.py); ai-toolkit's UI writes 4 / 30
    into a klein job (ui/src/helpers/defaultSamples.ts)."""
    klein = {"id": "black-forest-labs/FLUX.2-klein-base-4B", "family": "flux2", "variant": "4b"}
    _, job = prepare(load_spec(write_spec(tmp_path, {"model": klein, "samples": {"prompts": ["a mug"]}})),
                     "ai-toolkit", Layout("/w"))
    sample = job.config["config"]["process"][0]["sample"]
    assert (sample["guidance_scale"], sample["sample_steps"]) == (4.0, 30)


# ------------------------------------------------------------------ items 3, 4: musubi's clip folders


def clips_folder(tmp: Path, fps=(30.0, 30.0), stills=2) -> Path:
    """Real clips (PyAV) and stills, with captions, plus what musubi does not read: a .gif and a
    clip in a subfolder (dataset/media_utils.py: its extensions, top folder only)."""
    import numpy as np

    from lorapod.data.clips import write_clip

    folder = tmp / "clips"
    (folder / "more").mkdir(parents=True)
    frames = [np.full((32, 32, 3), 10 * i, np.uint8) for i in range(6)]
    for i, rate in enumerate(fps):
        write_clip(folder / f"clip{i}.mp4", frames, fps=rate)
        (folder / f"clip{i}.txt").write_text("zxq walking")
    for i in range(stills):
        (folder / f"still{i}.png").write_bytes(b"")
        (folder / f"still{i}.txt").write_text("zxq standing")
    (folder / "loop.gif").write_bytes(b"")
    write_clip(folder / "more" / "deep.mp4", frames, fps=30.0)
    return folder


def wan_spec(tmp: Path, **data) -> Path:
    folder = clips_folder(tmp, **data.pop("_clips", {}))
    raw = {"model": {"id": "Wan-AI/Wan2.1-T2V-1.3B", "family": "wan21"},
           "data": {"path": str(folder), "format": "video", "target_frames": [1, 5], "fps": 16.0, **data},
           "train": {"max_steps": 10}, "output": {"dir": str(tmp / "runs"), "name": "w"}}
    path = tmp / "w.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_print_shows_the_musubi_job_run_executes_for_clips(tmp_path):
    """--print builds from the data where it is (clips found), then names the instance's paths."""
    import tomllib

    from lorapod.trainers.on_instance import print_trainer_job

    spec = load_spec(wan_spec(tmp_path))
    text = print_trainer_job(spec, "musubi-tuner")
    toml = text.split("# ---- file $WORK/trainer/job/dataset.toml\n", 1)[1].split("# ----", 1)[0]
    video = tomllib.loads(toml)["datasets"][0]
    assert video["video_directory"] == "$WORK/data/0-clips" and video["target_frames"] == [1, 5]
    assert str(tmp_path) not in text
    spec.model.family, spec.model.id, spec.data.format = "sdxl", "org/sdxl", "images"
    with pytest.raises(TrainerRefused, match="sd-scripts trains on images; the data has 3 video file"):
        print_trainer_job(spec, "sd-scripts")  # the refusal run gives, not a job it never runs


def test_musubi_clip_folder_keeps_its_stills_and_its_frame_rate(tmp_path):
    _, job = prepare(load_spec(wan_spec(tmp_path)), "musubi-tuner", Layout("/w"))
    import tomllib

    datasets = tomllib.loads(job.files["/w/trainer/job/dataset.toml"])["datasets"]
    assert [sorted(k for k in ds if k.endswith("_directory") or k == "source_fps") for ds in datasets] == [
        ["cache_directory", "source_fps", "video_directory"], ["cache_directory", "image_directory"]]
    assert datasets[0]["source_fps"] == 30.0  # musubi drops frames from 30 to Wan's 16
    assert datasets[0]["cache_directory"] != datasets[1]["cache_directory"]
    assert any("2 clip(s) train as a video dataset and 2 still(s)" in n for n in job.notes)  # not loop.gif, not more/


def test_musubi_refuses_a_frame_rate_it_cannot_give(tmp_path):
    msg = refusal(wan_spec(tmp_path, fps=24.0), "musubi-tuner")
    assert "resamples Wan2.1 clips to 16 fps only" in msg and "data.fps 16, or null" in msg
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    msg = refusal(wan_spec(mixed, _clips={"fps": (30.0, 24.0)}), "musubi-tuner")
    assert "one source_fps per dataset" in msg and "clip0.mp4 at 30 fps" in msg


def test_musubi_without_fps_uses_every_frame(tmp_path):
    import tomllib

    _, job = prepare(load_spec(wan_spec(tmp_path, fps=None)), "musubi-tuner", Layout("/w"))
    assert "source_fps" not in tomllib.loads(job.files["/w/trainer/job/dataset.toml"])["datasets"][0]


# ------------------------------------------------------------------ item 10: --print in a shell


def test_printed_commands_expand_work_in_a_shell(tmp_path):
    """The printed lines, pasted into bash with $WORK set, name the job's files; unset, they stop."""
    import subprocess

    from lorapod.trainers.on_instance import print_trainer_job

    klein = {"id": "black-forest-labs/FLUX.2-klein-base-4B", "family": "flux2", "variant": "4b"}
    text = print_trainer_job(load_spec(write_spec(tmp_path, {"model": klein})), "ai-toolkit")
    guard = next(ln for ln in text.splitlines() if ln.startswith(": "))
    train = text.split("# ---- run\n# train\n", 1)[1].splitlines()[0]
    work = tmp_path / "job dir"
    (work / "trainer" / "src").mkdir(parents=True)
    script = f'python3() {{ printf "%s\\n" "$@"; }}\nenv() {{ shift; "$@"; }}\n{guard}\n{train}\n'
    out = subprocess.run(["bash", "-c", script], env={"WORK": str(work), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines() == ["run.py", f"{work}/trainer/job/config.yaml"], out.stderr
    out = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0 and "set WORK to the job folder" in out.stderr


# ------------------------------------------------------------------ item 5: ai-toolkit's linear


def aitk_rates(job, steps: int) -> list[float]:
    """The rate per step as ai-toolkit builds its scheduler: BaseSDTrainProcess adds
    ``total_iters = train.steps`` to ``lr_scheduler_params`` and toolkit/scheduler.py's ``linear``
    is ``torch.optim.lr_scheduler.LinearLR(optimizer, **params)`` (the upstream test runs that code)."""
    import torch

    train = job.config["config"]["process"][0]["train"]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=train["lr"])
    sched = torch.optim.lr_scheduler.LinearLR(opt, **{**train.get("lr_scheduler_params", {}), "total_iters": steps})
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_ai_toolkit_linear_decays_as_lorapods_linear(tmp_path):
    klein = {"id": "black-forest-labs/FLUX.2-klein-base-4B", "family": "flux2", "variant": "4b"}
    path = write_spec(tmp_path, {"model": klein, "train": {"max_steps": 4, "scheduler": "linear",
                                                            "learning_rate": 1e-4}})
    _, job = prepare(load_spec(path), "ai-toolkit", Layout("/w"))
    assert job.config["config"]["process"][0]["train"]["lr_scheduler"] == "linear"
    assert aitk_rates(job, 4) == pytest.approx([1e-4, 7.5e-5, 5e-5, 2.5e-5])


def test_ai_toolkit_linear_reads_back_only_when_it_decays():
    from lorapod.trainers.ai_toolkit import from_ai_toolkit

    def imported(train: dict):
        cfg = {"job": "extension", "config": {"name": "x", "process": [{"type": "sd_trainer", "train": train}]}}
        return from_ai_toolkit(cfg)

    assert imported({"lr_scheduler": "linear", "lr_scheduler_params": {"start_factor": 1.0, "end_factor": 0.0}}
                    ).spec["train"]["scheduler"] == "linear"
    warmup = imported({"lr_scheduler": "linear"})
    assert "scheduler" not in warmup.spec.get("train", {})
    assert any(k == "train.lr_scheduler" and "warms up" in why for k, why in warmup.unmapped)


# ------------------------------------------------------------------ items 6, 10: sd-scripts' own refusals


@pytest.mark.parametrize("family", ["sdxl", "flux1"])
@pytest.mark.parametrize("data", [{"shuffle_captions": True}, {"caption_dropout": 0.1}])
def test_sd_scripts_text_encoder_cache_with_caption_changes_is_refused_in_its_words(tmp_path, family, data):
    """sdxl_train_network.py / flux_train_network.py assert_extra_args: the English half of its message."""
    path = write_spec(tmp_path, {"model": {"id": "org/m", "family": family},
                                 "data": {"cache_text_encoder_outputs": True, **data}})
    msg = refusal(path, "sd-scripts")
    assert ("when caching Text Encoder output, either caption_dropout_rate, shuffle_caption, token_warmup_step "
            "or caption_tag_dropout_rate cannot be used") in msg
    assert "--set data.cache_text_encoder_outputs=false" in msg


def test_sd15_text_encoder_cache_is_refused_with_the_fix(tmp_path):
    path = write_spec(tmp_path, {"model": {"id": "org/m", "family": "sd15"}, "data": {"cache_text_encoder_outputs": True}})
    msg = refusal(path, "sd-scripts")
    assert "cannot run this spec" in msg and "would reject" not in msg  # not the contract check's complaint
    assert "train_network.py (SD 1.5) cannot cache text-encoder outputs: --set data.cache_text_encoder_outputs=false" in msg


def test_a_refusal_on_the_instance_is_the_error_the_user_sees(tmp_path, monkeypatch):
    """When the trainer refuses anyway (here: lorapod's own check switched off), the error leads with
    its exception line, found before accelerate's CalledProcessError re-raise, and gives the fix."""
    from lorapod.trainers.runner import TrainerFailed, run_trainer
    from lorapod.trainers.sd_scripts import SdScripts

    monkeypatch.setattr(SdScripts, "refuse", lambda self, spec: [])
    monkeypatch.setenv("LORAPOD_STANDIN_STEP_S", "0.01")
    path = write_spec(tmp_path, {"model": {"id": "org/m", "family": "sdxl"},
                                 "data": {"cache_text_encoder_outputs": True, "shuffle_captions": True}})
    standin = Path(__file__).resolve().parent / "standins" / "sd-scripts"
    with pytest.raises(TrainerFailed) as info:
        run_trainer(load_spec(path), "sd-scripts", tmp_path / "run", tmp_path / "work", src=str(standin),
                    poll_s=0.1, say=lambda m: None)
    first = str(info.value).splitlines()[0]
    assert first.startswith("kohya sd-scripts stopped with: AssertionError: when caching Text Encoder output, either "
                            "caption_dropout_rate, shuffle_caption")
    assert info.value.hint.startswith("--set data.cache_text_encoder_outputs=false")


# ------------------------------------------------------------------ item 7: no clipping


def test_no_clipping_reaches_ai_toolkit_and_axolotl(tmp_path):
    """ai-toolkit's TrainConfig defaults max_grad_norm to 1.0 and SDTrainer always calls
    clip_grad_norm_(params, max_grad_norm); axolotl passes it only when set and transformers
    defaults to 1.0, clipping only when it is > 0. Each gets the value that clips nothing in its code."""
    import torch

    from lorapod.trainers.ai_toolkit import from_ai_toolkit
    from lorapod.trainers.axolotl import from_axolotl

    klein = {"id": "black-forest-labs/FLUX.2-klein-base-4B", "family": "flux2", "variant": "4b"}
    _, aitk = prepare(load_spec(write_spec(tmp_path, {"model": klein, "train": {"max_grad_norm": None}})),
                      "ai-toolkit", Layout("/w"))
    norm = aitk.config["config"]["process"][0]["train"]["max_grad_norm"]
    grad = torch.nn.Parameter(torch.zeros(3))
    grad.grad = torch.tensor([30.0, 40.0, 0.0])
    torch.nn.utils.clip_grad_norm_([grad], norm)  # what accelerator.clip_grad_norm_ runs on one process
    assert grad.grad.tolist() == [30.0, 40.0, 0.0]
    assert yaml.safe_load(next(iter(aitk.files.values())))["config"]["process"][0]["train"]["max_grad_norm"] == norm

    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    llm = write_spec(tmp_path, {"model": {"id": "org/llm", "family": "llm"}, "data": {"path": str(chat), "format": "messages"},
                                "train": {"max_grad_norm": None}})
    _, ax = prepare(load_spec(llm), "axolotl", Layout("/w"))
    assert ax.config["max_grad_norm"] == 0.0  # Trainer: `if self.args.max_grad_norm > 0:` clip
    # and both read back as lorapod's null
    assert from_ai_toolkit(aitk.config).spec["train"]["max_grad_norm"] is None
    assert from_axolotl(ax.config).spec["train"]["max_grad_norm"] is None


# ------------------------------------------------------------------ item 8: packing isolated


def test_axolotl_packing_gets_a_backend_that_isolates_examples(tmp_path):
    """axolotl 0.19.0 AxolotlInputConfig.attn_decontaminates_packing (utils/schemas/config.py) is true
    for sdpa; validate_config warns "does not handle cross-sample decontamination" otherwise. The
    upstream check runs the real validator on this config."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    llm = write_spec(tmp_path, {"model": {"id": "org/llm", "family": "llm"},
                                "data": {"path": str(chat), "format": "messages", "packing": True}})
    _, ax = prepare(load_spec(llm), "axolotl", Layout("/w"))
    assert ax.config["sample_packing"] is True and ax.config["attn_implementation"] in ("sdpa", "eager",
                                                                                        "flash_attention_2")


# ------------------------------------------------------------------ item 9: keep_last step saves


def kohya_kept(argv: list[str], steps: int) -> list[int]:
    """Step saves left on disk under the kohya trainers' rule: at each save, remove step
    ``step - save_last_n_steps - 1`` rounded down to a multiple of save_every_n_steps
    (sd-scripts library/train_util.py get_remove_step_no; musubi utils/train_utils.py the same;
    the upstream check calls the real functions)."""
    every = int(argv[argv.index("--save_every_n_steps") + 1])
    last = int(argv[argv.index("--save_last_n_steps") + 1])
    kept: set[int] = set()
    for step in range(every, steps + 1, every):
        kept.add(step)
        remove = step - last - 1
        remove -= remove % every
        if remove >= 0:
            kept.discard(remove)
    return sorted(kept)


@pytest.mark.parametrize("trainer", ["sd-scripts", "musubi-tuner"])
@pytest.mark.parametrize("keep", [1, 3])
def test_kohya_keep_exactly_keep_last_step_saves(tmp_path, trainer, keep):
    model = {"id": "org/m", "family": "sdxl"} if trainer == "sd-scripts" else {"id": "Wan-AI/Wan2.1-T2V-1.3B",
                                                                             "family": "wan21"}
    path = write_spec(tmp_path, {"model": model, "train": {"max_steps": 500},
                                 "save": {"every_steps": 100, "keep_last": keep}})
    _, job = prepare(load_spec(path), trainer, Layout("/w"))
    argv = job.commands[-1].argv
    assert kohya_kept(argv, 500) == list(range(500 - 100 * (keep - 1), 501, 100))
    if trainer == "sd-scripts":
        assert argv[argv.index("--save_last_n_steps_state") + 1] == argv[argv.index("--save_last_n_steps") + 1]


# ------------------------------------------------------------------ the trainers' own code (upstream)

UPSTREAM_DIR = os.environ.get("LORAPOD_UPSTREAM_DIR")
CHECK = REPO / "tools" / "upstream_check.py"
HOW = (f"set LORAPOD_UPSTREAM_DIR to checkouts at the pinned commits (`python {CHECK.relative_to(REPO)} fetch --dir DIR` "
       "prints the git commands) and LORAPOD_UPSTREAM_PYTHON_<TRAINER> to a Python with each one's requirements "
       "(docs/trainers.md, 'Checked against the trainers' own code')")


def upstream_check(*args: str) -> subprocess.CompletedProcess:
    if not UPSTREAM_DIR:
        pytest.skip(HOW)
    pythons = []
    for name in ("sd-scripts", "musubi-tuner", "ai-toolkit", "axolotl"):
        py = os.environ.get(f"LORAPOD_UPSTREAM_PYTHON_{name.upper().replace('-', '_')}")
        if py:
            pythons += [f"--python-{name}", py]
    return subprocess.run([sys.executable, str(CHECK), *args, "--dir", UPSTREAM_DIR, *pythons],
                          capture_output=True, text=True, timeout=1800)


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["sd-scripts", "musubi-tuner", "ai-toolkit", "axolotl"])
def test_the_trainers_own_code_reads_every_job_as_lorapod_means(trainer):
    proc = upstream_check("check", "--only", trainer)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " 0 mismatch(es)" in proc.stdout


@pytest.mark.upstream
@pytest.mark.slow
def test_the_recorded_contracts_are_what_the_checkouts_say(tmp_path):
    """tools/upstream_check.py record regenerates trainers/contracts/*.json and tests/recorded/ from the
    checkouts; nothing may differ from what is committed."""
    proc = upstream_check("record", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "records rewritten: none changed" in proc.stdout, proc.stdout[-2000:]


def test_musubi_refuses_a_folder_it_would_read_nothing_from(tmp_path):
    """Clips only in a subfolder, or only .gif: musubi's glob_videos/glob_images find nothing."""
    import numpy as np

    from lorapod.data.clips import write_clip

    folder = tmp_path / "clips"
    (folder / "deep").mkdir(parents=True)
    write_clip(folder / "deep" / "a.mp4", [np.zeros((16, 16, 3), np.uint8)] * 3)
    (folder / "loop.gif").write_bytes(b"")
    raw = {"model": {"id": "Wan-AI/Wan2.1-T2V-1.3B", "family": "wan21"},
           "data": {"path": str(folder), "format": "video", "target_frames": [1]}, "train": {"max_steps": 2}}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(raw))
    msg = refusal(path, "musubi-tuner")
    assert "finds no clip or image at the top of" in msg and "no subfolders; there: .gif, .mp4" in msg


def test_print_relocates_each_data_folder_and_no_lookalike(tmp_path):
    from lorapod.trainers.on_instance import print_trainer_job

    for name in ("mug", "mug2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.png").write_bytes(b"")
    path = write_spec(tmp_path, {"model": {"id": "org/m", "family": "sdxl"}})
    spec = load_spec(path)
    spec.data.path = [str(tmp_path / "mug"), str(tmp_path / "mug2")]
    text = print_trainer_job(spec, "sd-scripts")
    assert 'image_dir = "$WORK/data/0-mug"' in text and 'image_dir = "$WORK/data/1-mug2"' in text
