"""What a newcomer meets at the terminal (issue #24), through the installed entry point ``python -m lorapod``:
a pipe where the terminal must not matter, a pty where it does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _tiny_llm_spec(out: Path) -> Path:
    """The LLM demo's tiny model and data (built in code), and a spec long enough to be interrupted."""
    from lorapod import demo
    from lorapod.builtin import llm
    from lorapod.spec import load_spec

    train, val = llm.build_dataset()
    demo.write_jsonl(out / "data" / "train.jsonl", train)
    demo.write_jsonl(out / "data" / "val.jsonl", val)
    model = llm.build_base_model(out / "base-model", llm.demo_texts(train, val))
    raw = demo.demo_spec_dict(out, str(model), 100_000)
    raw["eval"] = {"every_steps": 3, "at_start": False}
    raw["save"] = {"every_steps": 100_000, "keep_last": 2}
    path = out / "spec.yaml"
    path.write_text(load_spec(raw=raw).to_yaml())
    return path


def _read_until(fd: int, want, timeout: float) -> bytes:
    import select
    import time

    buf, end = b"", time.monotonic() + timeout
    while time.monotonic() < end and not want(buf):
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk
    return buf


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_saves_says_how_to_resume_and_exits_130(tmp_path):
    import pty
    import re

    spec = _tiny_llm_spec(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # the child: lorapod on a terminal, as a user runs it
        import signal

        # a user's shell starts it with SIGINT at its default; pytest run as a background job of a
        # shell without job control has it ignored, and an ignored signal stays ignored across exec
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.environ.update(PYTHONPATH=SRC, COLUMNS="100")
        os.execv(sys.executable, [sys.executable, "-m", "lorapod", "train", str(spec)])
    seen = _read_until(fd, lambda b: re.search(rb"\b[1-9]\d*/100000", b) is not None, 240)
    assert re.search(rb"\b[1-9]\d*/100000", seen), seen[-2000:]
    os.write(fd, b"\x03")  # Ctrl-C typed at the terminal: the line discipline sends SIGINT
    seen += _read_until(fd, lambda b: b"resume with" in b and b"\n" in b.split(b"resume with")[-1], 120)
    import time

    end = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < end:
        seen += _read_until(fd, lambda b: False, 0.5)  # keep the terminal drained while it exits
    if done == (0, 0):  # still running a minute after Ctrl-C
        os.kill(pid, 9)
        done = os.waitpid(pid, 0)
    status = done[1]
    text = re.sub(r"\s+", " ", seen.decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 130, text[-2000:]
    m = re.search(r"interrupted \(Ctrl-C\) at step (\d+); checkpoint saved: (\S+)", text)
    assert m, text[-2000:]
    run = next((tmp_path / "runs").iterdir())
    assert Path(m.group(2)) == run / "checkpoints" / f"step-{m.group(1)}" and Path(m.group(2)).is_dir()
    assert f"resume with: lorapod train --resume {run}" in text


@pytest.mark.slow
def test_sigterm_saves_like_ctrl_c_and_a_pipe_gets_progress_lines_and_the_resume_says_where(tmp_path):
    import re
    import signal

    spec = _tiny_llm_spec(tmp_path)
    env = dict(os.environ, PYTHONPATH=SRC, LORAPOD_PROGRESS_SECONDS="0.2")
    proc = subprocess.Popen([sys.executable, "-m", "lorapod", "train", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    # stderr is a pipe, not a terminal: progress lines, not a bar
    seen = _read_until(proc.stderr.fileno(), lambda b: len(re.findall(rb"(?m)^step \d+/", b)) >= 2, 240)
    step_lines = re.findall(r"(?m)^step .*$", seen.decode())
    if len(step_lines) < 2:
        proc.kill()
        proc.wait()
        pytest.fail("no progress lines on a pipe: " + seen.decode()[-2000:])
    assert re.match(r"step \d+/100000 \(\d+%\)  loss \d+\.\d{4}  [\d,.]+ tok/s  eta \S+", step_lines[0])
    proc.send_signal(signal.SIGTERM)  # what timeout, SLURM, Kubernetes and a spot preemption send
    _out, rest = proc.communicate(timeout=120)
    err = seen.decode() + rest.decode()
    assert proc.returncode == 75, err[-2000:]  # preempted, saved (lorapod.errors.PREEMPTED_EXIT)
    m = re.search(r"interrupted \(SIGTERM\) at step (\d+); checkpoint saved: (\S+)", err)
    assert m and Path(m.group(2)).is_dir(), err[-2000:]
    run = next((tmp_path / "runs").iterdir())
    assert f"resume with: lorapod train --resume {run}" in err
    step = int(m.group(1))
    got = lorapod("train", "--resume", str(run), "--set", f"train.max_steps={step + 1}", timeout=240)
    assert got.returncode == 0, got.stderr[-2000:]
    assert f"resuming from step-{step} (step {step}, epoch " in got.stderr
    assert f"step {step + 1}/{step + 1} (100%)" in got.stderr  # the last step's line


def test_down_orphans_with_no_api_keys_says_no_provider_was_asked(tmp_path):
    import json

    env = {"LORAPOD_HOME": str(tmp_path / "home")}
    got = lorapod("down", "--orphans", env=env)
    assert got.returncode == 0, got.stderr
    assert "runpod: not asked (no runpod API key; export RUNPOD_API_KEY=" in got.stderr
    assert "vast: not asked (no vast API key" in got.stderr
    assert "providers asked: none; not asked: runpod, vast" in got.stderr
    counts = json.loads(lorapod("down", "--orphans", "--json", env=env).stdout)
    assert set(counts["providers"]) == {"runpod", "vast"}
    assert all(v.startswith("not asked: no ") for v in counts["providers"].values())


def test_inspect_on_a_checkpoint_reads_alpha_from_the_run_spec_not_alpha_none(tmp_path):
    import torch
    from safetensors.torch import save_file

    from lorapod.demo import demo_spec_dict
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    run = RunDir.create(tmp_path / "runs", "demo")
    run.write_spec(load_spec(raw=demo_spec_dict(tmp_path, str(tmp_path / "base-model"), 3)))  # r 16, alpha 32
    ck = run.checkpoints / "step-3"
    ck.mkdir(parents=True)
    save_file({f"base_model.model.model.layers.0.self_attn.q_proj.lora_{x}.weight": torch.zeros(16, 16)
               for x in "AB"}, str(ck / "adapter.safetensors"))
    (ck / "state.json").write_text("{}")
    for target in (ck, ck / "adapter.safetensors"):
        got = lorapod("inspect", str(target))
        assert got.returncode == 0, got.stderr
        text = " ".join(got.stdout.split())
        assert "alpha [32.0]" in text and "alpha None" not in text, text
        assert "at scale [2.0]" in text and "adapter.lora.alpha / rank" not in text, text


def test_a_failed_start_leaves_no_run_folder_behind(tmp_path):
    from lorapod import demo
    from lorapod.builtin import llm
    from lorapod.spec import load_spec

    train, val = llm.build_dataset()
    demo.write_jsonl(tmp_path / "data" / "train.jsonl", train)
    demo.write_jsonl(tmp_path / "data" / "val.jsonl", val)
    spec = tmp_path / "spec.yaml"
    spec.write_text(load_spec(raw=demo.demo_spec_dict(tmp_path, str(tmp_path / "no-such-model"), 3)).to_yaml())
    got = lorapod("train", str(spec))
    assert got.returncode != 0 and "Traceback" not in got.stderr
    assert "is not a model folder" in got.stderr and "nothing was trained: removed" in got.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_plan_sorts_by_time_marks_the_fastest_under_the_cap_and_says_what_80_columns_leave_out(tmp_path):
    import json
    import re

    spec = str(Path(__file__).resolve().parents[1] / "examples" / "wan21-video-lora.yaml")
    cap = ["--set", "compute.max_usd=5"]
    by_usd = json.loads(lorapod("plan", spec, "--json", "--sort", "usd", *cap).stdout)
    by_time = json.loads(lorapod("plan", spec, "--json", "--sort", "time", *cap).stdout)
    fits = [o for o in by_time["options"] if o["fits"]]
    assert [o["hours_total"] for o in fits] == sorted(o["hours_total"] for o in fits)
    assert by_usd["options"][0]["usd_total"] <= by_usd["options"][1]["usd_total"]
    under = [o for o in fits if o["usd_total"] <= 5]
    fastest = by_time["options"][by_time["fastest_under_cap"]]
    assert fastest["hours_total"] == min(o["hours_total"] for o in under) and fastest["usd_total"] <= 5
    narrow = lorapod("plan", spec, "--sort", "usd", *cap, env={"COLUMNS": "80"}).stdout
    assert "left out at 80 columns" in narrow and "--json has everything" in narrow
    assert re.search(rf"fastest under the \$5\.00 cap: #\d+ {fastest['gpu']} on {fastest['provider']}", narrow)
    wide = lorapod("plan", spec, "--sort", "time", env={"COLUMNS": "160"}).stdout
    assert "Offers ranked by time" in wide and "left out" not in wide
    assert re.search(r"fits \+\d+\.\d GB", wide)
    bad = lorapod("plan", spec, "--sort", "speed")
    assert bad.returncode != 0 and "rank by usd or time" in bad.stderr


@pytest.mark.slow
def test_llm_eval_renders_markdown_writes_a_page_and_plots_on_a_log_axis(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lorapod.evaluate.llm import Row, val_loss_figure

    spec = _tiny_llm_spec(tmp_path)
    got = lorapod("train", str(spec), "--set", "train.max_steps=4", "--set", "save.every_steps=2", timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    run = next((tmp_path / "runs").iterdir())
    got = lorapod("eval", str(run), "--n-prompts", "1", timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "|---|" not in got.stdout and "**" not in got.stdout and "Recommended:" in got.stdout
    html = (run / "eval" / "llm.html").read_text()
    assert "<table>" in html and "Recommended: <b>step-" in html and "val_loss.png" in html
    fig, _best = val_loss_figure([Row("base", None, 8.7, 6000.0), Row("step-2", 2, 0.02, 1.02)], plt)
    assert fig.axes[0].get_yscale() == "log"
    plt.close(fig)


@pytest.mark.slow
def test_image_eval_and_export_say_what_they_show_without_library_chatter(tmp_path):
    from lorapod.demo_image import run_image_demo

    res = run_image_demo(tmp_path / "demo", log=lambda m: None, show_progress=False)
    run_root = res.run
    chatter = ("torchvision", "Loading pipeline components", "Loading weights", "No LoRA keys associated",
               "Writing model shards", "it/s]", "peft_config")
    for to in ("diffusers", "merged"):
        got = lorapod("export", str(run_root), "--to", to, "--out", str(tmp_path / to), timeout=300)
        assert got.returncode == 0, got.stderr[-2000:]
        assert not [c for c in chatter if c in got.stdout + got.stderr], got.stdout + got.stderr
    prompts = tmp_path / "p.txt"
    prompts.write_text("zxq, a red circle\na photo of a cat\n")
    got = lorapod("eval", str(run_root), "--steps", "2", "--prompts", str(prompts), timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert not [c for c in chatter if c in got.stdout + got.stderr], got.stdout + got.stderr
    page = (run_root / "eval" / "images.html").read_text()
    assert "<th>base (no LoRA)</th><td colspan=3>" in page
    assert "checkpoints: step-" in page and "save.keep_last" in page


def test_plan_an_llm_the_catalog_does_not_know_fetches_only_its_config_json(tmp_path):
    import json

    from .test_tokenizer import FakeHub

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
           "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
           "vocab_size": 32000, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}
    hub = FakeHub({"acme/tiny-chat-1b": {"config.json": json.dumps(cfg).encode(), "model.safetensors": b"\0" * 64}},
                  set())
    try:
        spec = Path(__file__).resolve().parents[1] / "examples" / "llm-chat-lora.yaml"
        env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
        got = lorapod("plan", str(spec), "--set", "model.id=acme/tiny-chat-1b", "--examples", "1000", "--json",
                      env=env)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["options"]
        fetched = [p for method, p, _ in hub.requests if method == "GET" and "/resolve/" in p]
        assert fetched and all(p.endswith("/config.json") for p in fetched)
        missing = lorapod("plan", str(spec), "--set", "model.id=acme/nope", "--examples", "1000", env=env)
        assert missing.returncode != 0 and "no model acme/nope on the hub" in missing.stderr
        offline = lorapod("plan", str(spec), "--set", "model.id=acme/other", "--examples", "1000",
                          env=env | {"HF_HUB_OFFLINE": "1"})
        assert offline.returncode != 0 and "offline, and acme/other's config.json is not in the" in offline.stderr
    finally:
        hub.server.shutdown()
