"""What a newcomer meets at the terminal (issue #24), through the installed entry point ``python -m lorapod``:
a pipe where the terminal must not matter, a pty where it does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lorapod

SRC = str(Path(lorapod.__file__).resolve().parents[1])  # the subprocess runs the lorapod these tests import


def lorapod(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """``python -m lorapod ARGS`` as a separate process, stdout and stderr pipes (not a terminal)."""
    e = dict(os.environ, PYTHONPATH=SRC, COLUMNS="100") | (env or {})
    return subprocess.run([sys.executable, "-m", "lorapod", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=e)


def test_eval_on_a_video_run_says_what_to_look_at_instead_of_a_traceback(tmp_path):
    from lorapod.demo_video import demo_spec_dict
    from lorapod.rundir import RunDir
    from lorapod.spec import JobSpec

    raw = demo_spec_dict(tmp_path, str(tmp_path / "base-model"), 2)
    (tmp_path / "data" / "2_zxq").mkdir(parents=True)
    run = RunDir.create(tmp_path / "runs", "video")
    run.write_spec(JobSpec.model_validate(raw))
    got = lorapod("eval", str(run.root))
    assert got.returncode == 2, got.stderr  # a SpecError
    assert "Traceback" not in got.stderr + got.stdout
    assert "is a video run (wan21)" in got.stderr and "samples" in got.stderr


def _findings(folder: Path, *extra: str) -> dict[str, list[str]]:
    import json

    got = lorapod("data", "check", str(folder), "--json", *extra)
    assert "Traceback" not in got.stderr, got.stderr
    out: dict[str, list[str]] = {}
    for f in json.loads(got.stdout)["findings"]:
        out.setdefault(f["path"], []).append(f["code"])
    return out


def test_data_check_judges_size_by_the_bucket_and_gives_one_finding_per_image(tmp_path):
    from PIL import Image

    from .datasets_util import good_folder, photo, save

    root = good_folder(tmp_path / "mug", n=15, size=(1024, 1024))
    save(photo((832, 1216), seed=30), root / "portrait.jpg", quality=92)  # a standard SDXL portrait bucket
    save(photo((800, 600), seed=31), root / "small.jpg", quality=92)
    save(photo((1000, 1000), seed=32), root / "almost.jpg", quality=92)  # x1.02: a note, not a warning
    for n in ("portrait", "small", "almost"):
        (root / f"{n}.txt").write_text(f"zxq_mug, {n}\n")
    Image.new("RGB", (1024, 1024), (4, 4, 4)).save(root / "dark.png")
    (root / "dark.txt").write_text("zxq_mug, dark\n")
    f = _findings(root, "--family", "sdxl")
    assert "portrait.jpg" not in f
    assert f["small.jpg"] == ["image-too-small"]
    assert f["almost.jpg"] == ["bucket-upscale"]
    assert f["dark.png"] == ["image-underexposed"]  # not also 'blurry': a uniform image has no edges


def test_data_fix_converts_what_check_flags_and_their_captions_are_not_orphans(tmp_path):
    from PIL import Image

    from .datasets_util import good_folder, photo, save

    root = good_folder(tmp_path / "mug", n=15)
    save(photo((1024, 1024), seed=40), root / "old.bmp")
    frames = [photo((1024, 1024), seed=s) for s in (41, 42)]
    frames[0].save(root / "anim.gif", save_all=True, append_images=frames[1:])
    save(photo((1024, 1024), seed=43), root / "ispng.jpg", format="PNG")
    for n in ("old", "anim", "ispng"):
        (root / f"{n}.txt").write_text(f"zxq_mug, {n}\n")
    before = _findings(root)
    assert before["old.bmp"] == ["image-format"] and "old.txt" not in before and "anim.txt" not in before
    assert before["ispng.jpg"] == ["image-extension-mismatch"]
    got = lorapod("data", "fix", str(root), "--out", str(tmp_path / "fixed"))
    assert got.returncode == 0, got.stderr
    assert "old.bmp: converted to old.png" in got.stdout and "anim.gif: converted to anim.png (first of 2 frames)" \
        in got.stdout and "ispng.jpg: a PNG file, renamed to ispng.png" in got.stdout
    after = _findings(tmp_path / "fixed")
    assert after == {}, after
    assert Image.open(tmp_path / "fixed" / "anim.png").size == (1024, 1024)
    assert (root / "old.bmp").is_file() and (root / "ispng.jpg").is_file()  # the source is untouched


def test_report_and_fix_on_a_jsonl_say_it_is_chat_data_and_the_report_lands_beside_the_data(tmp_path):
    from .datasets_util import good_folder

    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    for cmd in (["report"], ["fix", "--out", str(tmp_path / "x")]):
        got = lorapod("data", cmd[0], str(chat), *cmd[1:])
        assert got.returncode != 0 and "Traceback" not in got.stderr
        assert "is a chat data file" in got.stderr and f"lorapod data check {chat}" in got.stderr
        assert "is not a folder" not in got.stderr
    data = good_folder(tmp_path / "sets" / "mug", n=3)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    got = lorapod("data", "report", str(data), cwd=elsewhere)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "sets" / "mug-report.html").is_file() and not list(elsewhere.iterdir())
