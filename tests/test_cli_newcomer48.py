"""Issue 48's frictions, each through the command a newcomer typed (F11, F12, F13, F20, F21, F24)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_train_without_the_data_folder_says_so_before_asking_the_hub(tmp_path, monkeypatch, capsys):
    """F11: the SDXL example's data folder is not in the repository. Training it with no Hub to
    reach used to wait on the Hub's retries, print its raw lines and fail on model_index.json; the
    missing folder is now the one line, and no run folder is made."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    out_dir = tmp_path / "runs"
    code, out, err = run_cli(["train", str(EX / "sdxl-object-lora.yaml"), "--set", f"output.dir={out_dir}",
                              "--set", f"data.path={tmp_path / 'mug'}"], capsys)
    said = " ".join((out + err).split())
    assert code != 0 and "Traceback" not in said
    assert f"data path {tmp_path / 'mug'} does not exist" in said and "--set data.path=PATH" in said
    assert "model_index" not in said and "Retrying" not in said and "127.0.0.1" not in said  # the Hub never asked
    assert not out_dir.exists()


def test_data_fix_leaves_an_empty_caption_for_the_user_and_the_check_still_finds_it(tmp_path, capsys):
    """F15: `data fix --trigger` wrote the trigger alone into an empty caption, and the check's
    caption-empty error vanished with nothing described."""
    Image = pytest.importorskip("PIL.Image")
    src = tmp_path / "mug"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 64), (50 * i, 80, 90)).save(src / f"p{i}.jpg")
        (src / f"p{i}.txt").write_text(f"a mug on a shelf {i}\n" if i else "  \n")
    out = tmp_path / "fixed"
    code, said, err = run_cli(["data", "fix", str(src), "--out", str(out), "--trigger", "zxq_mug"], capsys)
    assert code == 0, err
    assert (out / "p0.txt").read_text().strip() == ""  # not "zxq_mug"
    assert (out / "p1.txt").read_text() == "zxq_mug, a mug on a shelf 1\n"
    assert "p0.txt: left empty: write a caption" in " ".join(said.split())
    from lorapod.data.check import check_path

    assert any(f.code == "caption-empty" and f.path == "p0.txt" for f in check_path(out, trigger="zxq_mug").findings)


def test_train_with_the_data_and_no_hub_is_one_line_without_the_hubs_retries(tmp_path, monkeypatch, capsys):
    """F11, the other half: the data is here and the Hub does not answer: one line saying so, not
    huggingface_hub's five retries printed raw before a cache miss."""
    Image = pytest.importorskip("PIL.Image")
    pytest.importorskip("diffusers")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    data = tmp_path / "mug"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 64), (40 * i, 9, 9)).save(data / f"p{i}.jpg")
        (data / f"p{i}.txt").write_text("zxq_mug, a mug")
    code, out, err = run_cli(["train", str(EX / "sdxl-object-lora.yaml"), "--set", f"output.dir={tmp_path / 'runs'}",
                              "--set", f"data.path={data}", "--device", "cpu"], capsys)
    said = " ".join((out + err).split())
    assert code != 0 and "Traceback" not in said
    assert "the Hugging Face hub cannot be reached" in said and "model_index.json is not in its cache" in said
    assert "Retrying" not in said and "thrown while requesting" not in said


def test_a_mistyped_hub_id_gets_one_did_you_mean_list(tmp_path, monkeypatch, capsys):
    """F12: the hint held two lists ("did you mean 'A', 'B'? check the spelling (did you mean C?)")."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _out, err = run_cli(["plan", str(EX / "llm-chat-lora.yaml"), "--set",
                               "model.id=meta-llama/Llama-3.1-8B-Instrct"], capsys)
    said = " ".join(err.split())
    assert code != 0 and said.count("did you mean") == 1, said
    assert "did you mean 'meta-llama/Llama-3.1-8B-Instruct'," in said  # the closest id first


def test_export_lists_hub_among_the_targets_it_offers(tmp_path, capsys):
    """F20: a target that does not apply listed peft, merged, gguf, ollama, and not hub."""
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    from .llm_fixtures import spec_dict

    spec = load_spec(raw=spec_dict(tmp_path / "base", tmp_path / "t.jsonl", tmp_path / "v.jsonl", tmp_path / "runs"))
    run = RunDir.create(spec.output.dir, "chat")
    run.write_spec(spec)
    code, _out, err = run_cli(["export", str(run.root), "--to", "comfyui"], capsys)
    said = " ".join(err.split())
    assert code != 0 and "not available for an LLM run" in said
    assert "peft, merged, gguf, ollama, or hub" in said and "--repo" in said


def test_a_sweeps_job_names_are_never_a_prefix_of_a_dated_run_id():
    """F21: sweep jobs were named demo-2, whose ids demo-2-2026... share the prefix "demo-2" with
    every dated id demo-2026...; `lorapod logs demo-2` then matched both."""
    from lorapod.compute.sweep import job_specs
    from lorapod.rundir import new_job_id
    from lorapod.spec import load_spec

    spec = load_spec(EX / "demo.yaml", ["output.name=demo"])
    names = [s.output.name for _ov, s in job_specs(spec, ["train.learning_rate=1e-4,2e-4,3e-4"])]
    assert names == ["demo-job1", "demo-job2", "demo-job3"]
    dated = new_job_id("demo")  # demo-YYYYMMDD-HHMMSS-xxxx
    assert not any(dated.startswith(n) for n in names)
    assert not any(new_job_id(n).startswith(other) for n in names for other in names if other != n)


def test_the_demo_prints_a_small_tuned_loss_as_the_number_it_is(tmp_path, monkeypatch, capsys):
    """F24: a tuned validation loss of 0.0004 was printed "tuned 0.000"."""
    import lorapod.demo
    from lorapod.demo import DemoResult

    def fake_demo(out, **_kw):
        return DemoResult(Path(out), 2.318, 0.000412, [("What colour is a lime?", "blue", "green")])

    monkeypatch.setattr(lorapod.demo, "run_demo", fake_demo)
    code, out, err = run_cli(["demo", "--out", str(tmp_path / "d")], capsys)
    assert code == 0, err
    said = " ".join(out.split())
    assert "base 2.318 -> tuned 0.000412" in said and "0.000 " not in said
