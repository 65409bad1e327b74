"""Video data: frame windows and buckets as the spec asks, and `lorapod data check` on planted
defects (a 5-frame clip, a corrupt file, a variable-fps clip, an audio-only file, a missing caption)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from lorapod.data.clips import probe, read_frames, resample, windows, write_clip
from lorapod.data.video import check_video
from lorapod.demo_video import moving_square, write_clips
from lorapod.engine.diffusion import video_data as vd
from lorapod.errors import DataError, SpecError
from lorapod.spec import load_spec

from .cli_helpers import run_cli

av = pytest.importorskip("av")


def _vfr_clip(path: Path, n: int = 20) -> Path:
    """Frames 40 ms and 100 ms apart, alternately (a phone's variable frame rate)."""
    frames = moving_square(n, (48, 32), (200, 0, 0), (255, 255, 255))
    with av.open(str(path), "w") as out:
        s = out.add_stream("mpeg4", rate=24)
        s.width, s.height, s.pix_fmt = 48, 32, "yuv420p"
        s.codec_context.time_base = Fraction(1, 1000)
        t = 0
        for i, a in enumerate(frames):
            f = av.VideoFrame.from_ndarray(a, format="rgb24")
            f.pts, f.time_base = t, Fraction(1, 1000)
            t += 40 if i % 2 else 100
            for pk in s.encode(f):
                out.mux(pk)
        for pk in s.encode():
            out.mux(pk)
    return path


def _audio_only(path: Path) -> Path:
    with av.open(str(path), "w") as out:
        s = out.add_stream("aac", rate=16000)
        for i in range(10):
            fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            fr.sample_rate, fr.pts = 16000, i * 1024
            for pk in s.encode(fr):
                out.mux(pk)
        for pk in s.encode():
            out.mux(pk)
    return path


def test_windows_head_uniform_slide_and_fps_resampling():
    assert windows(40, [1, 17, 33], "head") == [(1, 0), (17, 0), (33, 0)]
    assert windows(40, [17], "uniform", sample=3) == [(17, 0), (17, 12), (17, 23)]
    assert windows(40, [17], "slide", stride=10) == [(17, 0), (17, 10), (17, 20)]
    assert windows(16, [17, 33], "head") == []  # shorter than every target: no window
    # 30 fps -> 16 fps: frame k is the source frame nearest to k/16 s
    assert resample(30, 30.0, 16.0) == [round(k * 30 / 16) for k in range(16)]
    assert resample(30, 16.0, 16.0) == list(range(30))
    assert resample(30, 30.0, None) == list(range(30))


def test_scan_cuts_windows_of_4n1_frames_into_frame_size_buckets(tmp_path):
    data = write_clips(tmp_path / "d", n=2, frames=24, fps=32.0, sizes=[(64, 48), (48, 48)], images=1)
    rule = vd.FrameRule((1, 5, 9), "slide", 1, 4, 16.0)
    items, findings = vd.scan([data], 64, ".txt", 1, rule)
    assert findings == []
    clip0 = [it for it in items if it.path.name == "clip00.mp4"]
    # 24 frames at 32 fps -> 12 at 16 fps (every other source frame); a window every 4 of those
    assert sorted((len(it.frames), it.frames[0]) for it in clip0) == [
        (1, 0), (1, 8), (1, 16), (5, 0), (5, 8), (9, 0)]
    nine = next(it for it in clip0 if len(it.frames) == 9)
    assert nine.frames == tuple(range(0, 18, 2))
    assert nine.bucket == (9, 64, 64)  # frames, width, height (64x48 ties to the larger square bucket)
    still = [it for it in items if it.is_image]
    assert len(still) == 1 and still[0].frames == (0,) and still[0].bucket[0] == 1
    x = vd.load_window(nine)
    assert tuple(x.shape) == (3, 9, 64, 64) and float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    # the frames decoded are the ones asked for: the square moves 2 px per source frame
    assert len(read_frames(nine.path, [0, 2])) == 2


def test_scan_skips_undecodable_and_too_short_clips_with_findings(tmp_path):
    data = write_clips(tmp_path / "d", n=1, frames=12, images=0)
    (data / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    (data / "broken.txt").write_text("zxq, broken", encoding="utf-8")
    write_clip(data / "tiny.mp4", moving_square(3, (32, 32), (0, 0, 255), (255, 255, 255)), 16)
    (data / "tiny.txt").write_text("zxq, tiny", encoding="utf-8")
    items, findings = vd.scan([data], 64, ".txt", 1, vd.FrameRule((5, 9), "head", 1, 10, 16.0))
    codes = {(Path(f.path).name, f.code) for f in findings}
    assert codes == {("broken.mp4", "video-unreadable"), ("tiny.mp4", "video-too-short")}
    assert {it.path.name for it in items} == {"clip00.mp4"}


def test_mixed_folder_without_any_caption_is_refused_before_training(tmp_path):
    data = write_clips(tmp_path / "d", n=2, frames=8, images=1)
    for t in data.glob("*.txt"):
        t.unlink()
    with pytest.raises(DataError, match="none of the 3 clips/images") as exc:
        vd.scan([data], 64, ".txt", 1, vd.FrameRule((1, 5), "head", 1, 10, 16.0))
    assert "data.trigger" in exc.value.hint
    # with a trigger they train on it (warned per file)
    items, findings = vd.scan([data], 64, ".txt", 1, vd.FrameRule((1, 5), "head", 1, 10, 16.0), trigger="zxq")
    assert {it.caption for it in items} == {"zxq"}
    assert sum(f.code == "caption-missing" for f in findings) == 3


def test_target_frames_must_be_4n_plus_1():
    raw = {"model": {"id": "x", "family": "wan21"}, "data": {"path": "d", "target_frames": [1, 16]}}
    with pytest.raises(SpecError, match="4n\\+1"):
        load_spec(raw=raw)


def test_data_check_flags_each_planted_video_defect(tmp_path, capsys):
    data = write_clips(tmp_path / "d", n=2, frames=40, images=1)
    write_clip(data / "five.mp4", moving_square(5, (48, 48), (0, 0, 255), (255, 255, 255)), 16)
    (data / "five.txt").write_text("zxq, five frames", encoding="utf-8")
    (data / "corrupt.mp4").write_bytes(b"this is not a video" * 20)
    (data / "corrupt.txt").write_text("zxq", encoding="utf-8")
    _vfr_clip(data / "vfr.mp4")
    (data / "vfr.txt").write_text("zxq, phone clip", encoding="utf-8")
    _audio_only(data / "voice.mp4")
    (data / "voice.txt").write_text("zxq", encoding="utf-8")
    (data / "clip01.txt").unlink()  # a missing caption
    assert probe(data / "vfr.mp4").variable_fps and not probe(data / "clip00.mp4").variable_fps

    report = check_video(data, family="wan21", trigger="zxq", target_frames=(1, 17, 33), fps=16.0)
    got = {(f.path, f.code, f.severity) for f in report.findings}
    assert ("five.mp4", "video-short", "warning") in got  # trains only as 1-frame windows
    assert ("corrupt.mp4", "video-unreadable", "error") in got
    assert ("vfr.mp4", "video-variable-fps", "error") in got
    assert ("voice.mp4", "video-audio-only", "error") in got
    assert ("clip01.mp4", "caption-missing", "error") in got
    assert ("clip00.mp4", "video-low-resolution", "warning") in got
    assert not any(p.startswith("clip00") and sev == "error" for p, _, sev in got)
    s = report.summary
    assert s["kind"] == "video" and s["clips"] == 6 and s["images"] == 1
    # 40 frames at 16 fps: one window of 1, 17 and 33 frames per good clip
    plan = {r["bucket"]: r["windows"] for r in s["windows"]}
    assert plan["33x1088x832"] == 1 and plan["33x832x1088"] == 1 and plan["1x1088x832"] == 2  # + the still

    # with target 9 the 5-frame clip gives no window at all: an error, as training skips it
    short = check_video(data, family="wan21", target_frames=(9,), fps=16.0)
    assert ("five.mp4", "video-too-short", "error") in {(f.path, f.code, f.severity) for f in short.findings}

    code, stdout, _ = run_cli(["data", "check", str(data), "--family", "wan21", "--json", "--frames", "1,17,33"], capsys)
    assert code == 1
    out = json.loads(stdout)
    assert {f["code"] for f in out["findings"]} >= {"video-unreadable", "video-variable-fps", "video-short",
                                                    "caption-missing", "video-audio-only"}
    code, _, err = run_cli(["data", "check", str(data), "--family", "wan21", "--frames", "1,16"], capsys)
    assert code == 2 and "4n+1" in err
    # the HTML report lists the clips with their facts and flags
    code, _, _ = run_cli(["data", "report", str(data), "--family", "wan21", "--out", str(tmp_path / "r.html")], capsys)
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert code == 0 and "<h2>Clips</h2>" in page and "video-variable-fps" in page and "33x1088x832" in page
    # the image check (default family) says where the clips went
    code, stdout, _ = run_cli(["data", "check", str(data), "--json"], capsys)
    assert any(f["code"] == "video-files" and "--family wan21" in f["message"] for f in json.loads(stdout)["findings"])


def _config_only_wan14b(folder: Path) -> Path:
    """A Wan2.1 14B folder with only its config files: enough for the pre-rent fit check."""
    (folder / "transformer").mkdir(parents=True)
    (folder / "vae").mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline",
                                                         "transformer": ["diffusers", "WanTransformer3DModel"]}))
    (folder / "transformer" / "config.json").write_text(json.dumps({
        "_class_name": "WanTransformer3DModel", "num_attention_heads": 40, "attention_head_dim": 128,
        "ffn_dim": 13824, "num_layers": 40, "text_dim": 4096, "freq_dim": 256, "in_channels": 16,
        "patch_size": [1, 2, 2]}))
    (folder / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLWan", "z_dim": 16}))
    return folder


def test_lorapod_run_refuses_a_video_job_before_renting(tmp_path, capsys, monkeypatch):
    """No provider call happens (no API key is set): the data scan and the fit check stop it first."""
    import yaml

    for key in ("VAST_API_KEY", "RUNPOD_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    model = _config_only_wan14b(tmp_path / "wan14b")
    data = write_clips(tmp_path / "d", n=1, frames=84, images=0)
    path = tmp_path / "job.yaml"

    def run(frames: int, swap: int) -> tuple[int, str]:
        spec = {"model": {"id": str(model), "family": "wan21"},
                "data": {"path": str(data), "resolution": 960, "target_frames": [frames]},
                "train": {"blocks_to_swap": swap, "gradient_checkpointing": True}}
        path.write_text(yaml.safe_dump(spec))
        code, _, err = run_cli(["run", str(path), "--on", "vast", "--gpu", "RTX 4090"], capsys)
        return code, " ".join(err.split())

    # 81 frames at 1088x832 in bf16: no number of swapped blocks makes it fit 24 GB
    code, err = run(81, 0)
    assert code == 1 and "even with 39 of 40 blocks swapped" in err and "RTX 4090" in err
    # 33 frames: it fits with enough blocks swapped; the hint says how many, and with them the
    # check passes (the run then stops at the provider: no API key in this test)
    code, err = run(33, 0)
    assert code == 1 and "set train.blocks_to_swap:" in err
    k = int(err.split("set train.blocks_to_swap: ")[1].split()[0])
    code, err = run(33, k)
    assert code == 1 and f"fits RTX 4090 (24 GB) with train.blocks_to_swap: {k}" in err and "no vast API key" in err
    (data / "clip00.txt").unlink()  # now nothing is captioned and there is no trigger
    code, err = run(33, k)
    assert code == 1 and "has a .txt caption" in err


def test_the_engine_and_the_planner_count_one_wan_job_alike(tmp_path):
    """One Wan memory model: the engine's pre-rent fit check (engine/diffusion/wan.py) is the planner's
    estimate (plan/vram.py) on the planner's description of the model, so the two give the same peak
    for the same settings and refuse exactly the jobs the planner calls "does-not-fit"."""
    from dataclasses import replace

    from lorapod.catalog.gpus import GPU
    from lorapod.catalog.models import find_model
    from lorapod.engine.diffusion import memory as wan
    from lorapod.errors import HardwareError
    from lorapod.plan.vram import Settings, estimate
    from lorapod.spec import JobSpec

    folder = _config_only_wan14b(tmp_path / "local-model")  # a name no catalog alias matches
    spec = JobSpec.model_validate({"model": {"id": str(folder), "family": "wan21", "dtype": "fp8"},
                                   "data": {"path": str(tmp_path / "d"), "resolution": 960, "target_frames": [33],
                                            "format": "video"},
                                   "train": {"gradient_checkpointing": True}})
    planned = find_model(spec.model.id, spec.model.family)
    model = wan.memory_model(spec)
    assert model == planned and model.blocks == 40 and model.trained_params_b == pytest.approx(14.29, abs=0.01)
    tokens = model.window_tokens(33, 960, 960)
    assert tokens == model.image_tokens(960, 33) == 9 * 60 * 60
    settings = replace(Settings.from_spec(spec, planned), framework="lorapod")
    assert wan.check_fits(spec, model, 500.0, dtype="fp8", tokens=tokens, what="x").peak_gb == \
        estimate(planned, settings).peak_gb
    seen = set()
    for swap in (0, 20, 39):
        spec.train.blocks_to_swap = swap
        s = replace(settings, blocks_to_swap=swap)
        for gb in (16.0, 24.0, 32.0, 48.0):
            refused = estimate(planned, s).verdict(GPU("card", gb, 100.0, 1000.0, "hopper", "9.0", "datacenter")) == "does-not-fit"
            try:
                wan.check_fits(spec, model, gb, dtype="fp8", tokens=tokens, what="x")
            except HardwareError:
                assert refused, (swap, gb)
            else:
                assert not refused, (swap, gb)
            seen.add(refused)
    assert seen == {True, False}
