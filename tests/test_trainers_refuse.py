"""Bad input, refused before anything is rented: what a trainer cannot honour, a flag the pinned
version lacks, a dataset its format cannot express."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from lorapod.errors import SpecError
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger
from lorapod.trainers import prepare
from lorapod.trainers.base import Layout
from lorapod.trainers.contracts import ContractError
from lorapod.trainers.job import TrainerRefused

from .remote_helpers import cli_argv, cli_env

REPO = Path(__file__).resolve().parents[1]


def spec_with(tmp: Path, family: str = "sdxl", files=("a.png",), **sections) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    for f in files:
        (data / f).write_bytes(b"")
    raw = {"model": {"id": "org/model", "family": family}, "data": {"path": "data", "format": "images"},
           "train": {"max_steps": 10}, "output": {"dir": str(tmp / "runs")}}
    for key, val in sections.items():
        raw.setdefault(key, {}).update(val)
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def refused(path: Path, trainer: str) -> str:
    with pytest.raises(TrainerRefused) as info:
        prepare(load_spec(path), trainer, Layout("/w"))
    return str(info.value)


def test_a_dataset_the_format_cannot_express(tmp_path):
    msg = refused(spec_with(tmp_path, files=("a.png", "clip.mp4")), "sd-scripts")
    assert "the data has 1 video file(s) such as clip.mp4: use --trainer musubi-tuner" in msg
    with pytest.raises(SpecError, match=r"data.target_frames must be frame counts of the form 4n\+1"):
        load_spec(spec_with(tmp_path, "wan21", files=("clip.mp4",), data={"target_frames": [1, 24, 45]}))


def test_a_flag_the_pinned_version_lacks(tmp_path):
    # musubi-tuner's wan_train_network.py has no --noise_offset: the contract check says so
    with pytest.raises(ContractError) as info:
        prepare(load_spec(spec_with(tmp_path, "wan21", train={"noise_offset": 0.05})), "musubi-tuner", Layout("/w"))
    assert "kohya musubi-tuner at 30c658c4f4b0bf05038b3346eff9670259b10fc7 would reject" in str(info.value)
    assert "wan_train_network.py has no option --noise_offset" in str(info.value)


def test_settings_a_trainer_cannot_honour(tmp_path):
    assert "sdxl_train_network.py has no block swap" in refused(spec_with(tmp_path, train={"blocks_to_swap": 8}),
                                                                "sd-scripts")
    assert "does not train model.family 'flux2' here (it takes: sd15, sdxl, flux1)" in refused(
        spec_with(tmp_path, "flux2"), "sd-scripts")
    assert "cached text-encoder outputs need U-Net-only training" in refused(
        spec_with(tmp_path, method={"train_text_encoder": True}), "sd-scripts")
    assert "model.variant must be one of 4b, 9b" in refused(spec_with(tmp_path, "flux2"), "ai-toolkit")
    assert "lorapod's built-in test model" in refused(REPO / "examples" / "demo.yaml", "axolotl")
    assert "set model.family (sd15, sdxl, flux1): kohya sd-scripts needs it" in refused(spec_with(tmp_path, "auto"),
                                                                                         "sd-scripts")


def test_ai_toolkit_needs_a_step_count(tmp_path):
    path = spec_with(tmp_path, "flux1", files=(), train={"max_steps": None})
    assert "ai-toolkit counts steps, and the image count is unknown here" in refused(path, "ai-toolkit")


def test_run_refuses_before_renting(tmp_path):
    """`lorapod run --trainer` checks the job before it contacts any machine."""
    path = spec_with(tmp_path, "flux2")
    proc = subprocess.run([*cli_argv(), "run", str(path), "--trainer", "sd-scripts", "--on", "ssh://nobody@127.0.0.1:9"],
                          capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "kohya sd-scripts cannot run this spec" in proc.stderr
    assert Ledger().jobs() == [] and Ledger().instances() == []


def test_train_print_shows_the_job(tmp_path):
    path = spec_with(tmp_path, files=("a.png", "b.png"))
    proc = subprocess.run([*cli_argv(), "train", str(path), "--trainer", "kohya", "--print"],
                          capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# trainer: sd-scripts\n# ---- file $WORK/trainer/job/dataset.toml\n")
    assert 'image_dir = "$WORK/data/0-data"' in proc.stdout
    assert "--max_train_steps 10" in proc.stdout
    assert not (tmp_path / "runs").exists()  # --print runs nothing


def test_musubi_video_dataset_and_block_swap_from_the_planner(tmp_path):
    from lorapod.catalog.gpus import find_gpu
    from lorapod.plan.job import build_job
    from lorapod.plan.vram import make_fit
    from lorapod.trainers.contracts import check_dataset_toml

    path = spec_with(tmp_path, "wan21", files=("a.txt",),
                     data={"format": "video", "target_frames": [1, 45], "frame_extraction": "slide",
                           "resolution": 480},
                     method={"r": 128}, compute={"gpu": "RTX 4090"})
    import numpy as np

    from lorapod.data.clips import write_clip

    write_clip(tmp_path / "data" / "a.mp4", [np.zeros((16, 16, 3), np.uint8)] * 3)  # 16 fps: no source_fps
    spec = load_spec(path)
    spec.model.id = "Wan-AI/Wan2.1-T2V-14B"
    _, job = prepare(spec, "musubi-tuner", Layout("/w"))
    toml = job.files["/w/trainer/job/dataset.toml"]
    assert 'video_directory = "' in toml and "target_frames = [1, 45]" in toml
    assert 'frame_extraction = "slide"' in toml and "frame_stride = 10" in toml
    assert check_dataset_toml("kohya_musubi_tuner.json", toml) == []
    # The swap musubi gets is the planner's own fit for this job on this card (whatever its figure).
    planned = build_job(spec)
    assert planned.estimate.verdict(find_gpu("RTX 4090")) == "does-not-fit"
    fix = make_fit(planned.model, planned.settings, find_gpu("RTX 4090").vram_gb)
    swap = next(s.split("=", 1)[1] for s in fix.sets if s.startswith("train.blocks_to_swap="))
    train = job.commands[-1].argv
    assert train[train.index("--blocks_to_swap") + 1] == swap
    assert job.notes == [f"--blocks_to_swap {swap}: the planner says the job does not fit RTX 4090 as is; its fit: "
                         + " ".join(f"--set {x}" for x in fix.sets)]


def test_setup_is_clone_install_torch_or_nothing_with_a_checkout():
    from lorapod.trainers import get, names

    for name in names():
        t = get(name)
        assert t.setup_commands(Layout("/w"), "py", "/opt/checkout") == []  # used as is, nothing installed
        cmds = t.setup_commands(Layout("/w"), "py")
        assert [c.name.split(" ")[0] for c in cmds] == (["clone", "torch", "install"] if t.repo else ["torch", "install"])
        if t.repo:
            assert f"checkout --quiet {t.commit}" in cmds[0].argv[0]
            mirror = t.setup_commands(Layout("/w"), "py", "file:///srv/mirror.git")
            assert "git clone --quiet file:///srv/mirror.git" in mirror[0].argv[0]
