"""The smaller frictions a newcomer met in issue #38's trial, each through the command that showed it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_an_image_spec_with_an_llm_family_names_the_fields_in_one_line_not_the_whole_spec(capsys):
    code, _out, err = run_cli(["plan", str(ROOT / "examples" / "sdxl-object-lora.yaml"),
                              "--set", "model.family=llm"], capsys)
    assert code == 2
    assert "model.family = 'llm' cannot train data.format 'images'" in err and "sdxl" in err
    assert "{'model'" not in err and "stabilityai" not in err  # not the spec dumped as a Python dict
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 2  # the headline and the one problem


def _llm_run(tmp_path: Path) -> Path:
    """An LLM run folder as `lorapod train` leaves one (spec.yaml), nothing trained: enough for what
    is decided from the spec alone."""
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    from .llm_fixtures import spec_dict

    spec = load_spec(raw=spec_dict(tmp_path / "base", tmp_path / "t.jsonl", tmp_path / "v.jsonl", tmp_path / "runs"))
    run = RunDir.create(spec.output.dir, "chat")
    run.write_spec(spec)
    return run.root


def test_export_refuses_a_target_that_does_not_apply_before_importing_torch(tmp_path):
    run = _llm_run(tmp_path)
    code = ("import sys\nfrom lorapod.cli.main import main\n"
            f"try:\n    main(['export', {str(run)!r}, '--to', sys.argv[1]])\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for to, says in (("comfyui", "--to comfyui is not available for an LLM run"),
                     ("onnx", "--to onnx is not an export target")):
        got = subprocess.run([sys.executable, "-c", code, to], capture_output=True, text=True, env=env, timeout=60)
        assert got.stdout.strip() == "exit 1 False", got.stdout + got.stderr  # refused, and torch never loaded
        assert says in got.stderr and "peft, merged, gguf, ollama" in got.stderr


def test_data_caption_names_the_missing_package_before_fetching_any_model(tmp_path, monkeypatch, capsys):
    import huggingface_hub
    from PIL import Image

    fetched: list[str] = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: fetched.append(repo) or "/nowhere")
    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "a.png")
    for name, package in (("wd14", "onnxruntime"), ("blip", "transformers")):
        monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError: not installed
        code, _out, err = run_cli(["data", "caption", str(tmp_path), "--with", name], capsys)
        monkeypatch.delitem(sys.modules, package)
        assert code != 0 and f"needs the Python package '{package}'" in err, err
        assert fetched == [], f"{name}: fetched {fetched} before saying {package} is missing"


def test_every_example_specs_data_ships_or_its_header_says_what_to_do_until_it_exists():
    """README's `lorapod train examples/llm-chat-lora.yaml` read a chats.jsonl the repo did not ship.
    Chat data ships; an image or video folder is the user's own photos, and the spec's header says
    how to plan without it."""
    import yaml

    from lorapod.spec import load_spec

    specs = sorted((ROOT / "examples").glob("*.yaml"))
    assert len(specs) >= 6
    for path in specs:
        spec = load_spec(path)
        raw = yaml.safe_load(path.read_text())["data"]
        wanted = [*(raw["path"] if isinstance(raw["path"], list) else [raw["path"]]),
                  *([raw["val_path"]] if raw.get("val_path") else [])]
        header = "".join(ln for ln in path.read_text().splitlines(keepends=True) if ln.startswith("#"))
        for rel in wanted:
            if (path.parent / rel).exists():
                continue
            assert spec.is_image, f"{path.name}: {rel} is not in the repo"
            assert rel.removeprefix("./") in header, f"{path.name}: its header does not say what to do without {rel}"
    chats = (ROOT / "examples" / "data" / "chats.jsonl").read_text().splitlines()
    assert len(chats) == 1500 and len(set(chats)) == 1500
    import importlib.util
    import json

    spec_ = importlib.util.spec_from_file_location("make_example_chats", ROOT / "tools" / "make_example_chats.py")
    gen = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(gen)
    assert [json.dumps(x, ensure_ascii=False) for x in gen.build()] == chats  # the generator's output, as shipped


def test_data_check_on_a_mixed_format_file_reports_every_line_and_every_other_problem(tmp_path, capsys):
    import json

    def m(q: str, a: str) -> dict:
        return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}

    lines = [m("hi", "yo"), {"instruction": "a", "output": "b"}, m("q", "a"),
             {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]},
             {"messages": [{"role": "wizard", "content": "?"}, {"role": "assistant", "content": "!"}]},
             {"instruction": "c", "output": "d"}]
    p = tmp_path / "mixed.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, out, _err = run_cli(["data", "check", str(p), "--json"], capsys)
    assert code != 0
    got = [(f["code"], f["line"]) for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert ("chat-mixed-format", 2) in got and ("chat-mixed-format", 4) in got and ("chat-mixed-format", 6) in got
    assert any(line == 5 and c != "chat-mixed-format" for c, line in got), got  # the bad role is reported too
    mixed = next(f for f in json.loads(out)["findings"] if f["line"] == 2)
    assert "alpaca but the file is messages (line 1)" in mixed["message"]


def test_ps_live_with_only_finished_jobs_says_so_not_no_jobs_yet(capsys):
    from lorapod.rundir import new_job_id
    from lorapod.store.ledger import Ledger

    code, out, _err = run_cli(["ps", "--live"], capsys)
    assert code == 0 and out.strip() == "no live jobs"  # an empty ledger
    ledger = Ledger()
    job = new_job_id("demo")
    ledger.job_started(job, "/tmp/runs/" + job, "runpod", None, None, 1.0, 1.0)
    iid = ledger.instance_creating("runpod", job, 0.44, gpu_name="NVIDIA GeForce RTX 4090")
    ledger.instance_created(iid, "x7k2p9q4r1m3")
    ledger.instance_destroyed(iid)
    ledger.job_ended(job, "done", "40 steps")
    ledger.close()
    code, out, _err = run_cli(["ps", "--live"], capsys)
    assert code == 0 and "no jobs yet" not in out
    assert out.strip() == "no live jobs (1 finished or stopped: `lorapod ps` lists them)"
    code, out, _err = run_cli(["ps"], capsys)
    assert job in out


def test_logs_names_an_ambiguous_prefix_and_shows_a_lorapod_train_runs_log(tmp_path, monkeypatch, capsys):
    import json

    from lorapod.store.ledger import Ledger

    ledger = Ledger()
    for job in ("demo-20261202-100000-aaaa", "demo-20261202-110000-bbbb"):
        ledger.job_started(job, str(tmp_path / "remote" / job), "runpod", None, None, 1.0, 1.0)
        ledger.job_ended(job, "done", "")
    ledger.close()
    code, _out, err = run_cli(["logs", "demo-2026"], capsys)
    assert code == 1
    assert ("'demo-2026' is the start of 2 jobs: demo-20261202-100000-aaaa, demo-20261202-110000-bbbb" in err), err

    monkeypatch.chdir(tmp_path)  # `lorapod train` wrote runs/ here; the ledger knows nothing of it
    run = _llm_run(tmp_path)
    (run / "events.log").write_text("2026-12-02T12:59:31+0000 training base on cpu (fp32)\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "total_steps": 4, "loss": 6.49, "time": 1.0}) + "\n")
    for arg in (str(run), run.name, run.name[:8]):
        code, out, err = run_cli(["logs", arg], capsys)
        assert code == 0, err
        assert "[events.log] 2026-12-02T12:59:31+0000 training base on cpu (fp32)" in out
        assert "[metrics] step 1" in out and "loss 6.49" in out
    _llm_run(tmp_path)  # a second run of the same spec: its prefix is now ambiguous
    code, _out, err = run_cli(["logs", run.name[:5]], capsys)
    assert code == 1 and "is the start of 2 run folders in runs" in err
    code, _out, err = run_cli(["logs", "nothing-like-it"], capsys)
    assert code == 1 and "no job 'nothing-like-it' in the ledger" in err and "lorapod logs runs/JOB" in err


def test_ledger_check_counts_a_lorapod_train_run_as_local_not_as_damage(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.chdir(tmp_path)
    _llm_run(tmp_path)  # what `lorapod train` leaves in ./runs: never a ledger job
    code, out, err = run_cli(["ledger", "check", "--json"], capsys)
    assert code == 0, err
    found = json.loads(out)
    assert (found["missing_jobs"], found["local_runs"]) == (0, 1)
    code, _out, err = run_cli(["ledger", "check"], capsys)
    assert code == 0 and "has no job in the ledger" not in err and "lacks" not in err
    assert "1 run folder(s) from `lorapod train` on this machine" in err
    lost = tmp_path / "runs" / "lost-job"  # a `lorapod run` folder whose ledger row is gone: still missing
    lost.mkdir()
    (lost / "spec.yaml").write_text("model: {id: x}\n")
    (lost / "remote-events.log").write_text("2026-12-02T10:00:00+0000 renting RTX 3090\n")
    code, _out, err = run_cli(["ledger", "check"], capsys)
    assert code == 1 and f"run folder {Path('runs') / 'lost-job'} has no job in the ledger" in err


def _commands(cmd, path=()):
    yield path
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        yield from _commands(sub, (*path, name))


def test_every_help_page_shows_clicks_metavars_and_whole_summaries(monkeypatch, capsys):
    """typer 0.2x printed `--debug <bool>`, `--set <list[str]>`, `logs [OPTIONS] {job}` and kept a
    docstring's line breaks, so a summary broke off mid-sentence ("the job's log," / "live from ...")."""
    import itertools
    import re

    import typer.main

    from lorapod.cli.main import build_app

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TERMINAL_WIDTH", "100")
    pages = list(_commands(typer.main.get_command(build_app())))
    assert len(pages) > 25
    for path in pages:
        code, out, err = run_cli([*path, "--help"], capsys)
        assert code == 0, (path, err)
        where = " ".join(["lorapod", *path])
        assert not re.search(r"<(bool|str|int|float|path|file|directory|list\[[^\]]*\]|int range|float range)>", out), \
            f"{where}: {re.search(r'<[^>]*>', out).group(0)}"
        usage = next(ln for ln in out.splitlines() if "Usage:" in ln)
        assert not re.search(r"\{[a-z_]+\}", usage), f"{where}: {usage.strip()}"
        # in the Commands panel, a line that ends while the next line's first word would have fit is
        # a hard break inside a summary, not the terminal's wrap
        panel = out.split("─ Commands ")[1] if "─ Commands " in out else ""
        rows = [ln[1:-1].rstrip() for ln in panel.splitlines() if ln.startswith("│")]
        conts = [r for r in rows if r.startswith("   ")]
        if not conts:
            continue
        col = min(len(r) - len(r.lstrip()) for r in conts)  # where the summaries start
        inner = max(len(ln) for ln in panel.splitlines() if ln.startswith("│")) - 2
        for this, nxt in itertools.pairwise(rows):
            if not nxt.startswith(" " * col):  # the next row starts another command
                continue
            first = nxt.split()[0]
            assert len(this) + 1 + len(first) > inner - 1, \
                f"{where}: a summary breaks after {this.strip()!r} (next: {first!r})"


def test_plan_prices_the_gpus_the_snapshot_gained_offline_each_entry_dated_and_sourced(capsys):
    """The snapshot had 6 GPUs; A40, A100 40GB, H200 and RTX A6000 gained published figures (issue
    #38), RTX A5000 and L4 on RunPod (issue 48). Each added entry names its own date and source; the
    RTX 4080 has none and says --live."""
    import json

    import yaml

    from lorapod.catalog import snapshot

    spec = str(ROOT / "examples" / "sdxl-object-lora.yaml")
    want = {"A40": {("runpod", "price_page", 0.44)}, "A100 40GB": {("runpod", "cheapest_seen", 1.0)},
            "H200": {("runpod", "price_page", 4.59), ("vast", "from", 3.5)}, "RTX A6000": {("vast", "from", 0.55)},
            "RTX A5000": {("runpod", "cheapest_seen", 0.16), ("runpod", "price_page", 0.27)},
            "L4": {("runpod", "price_page", 0.78)}}
    for gpu, rows in want.items():
        code, out, err = run_cli(["plan", spec, "--images", "25", "--gpu", gpu, "--json"], capsys)
        assert code == 0, (gpu, err)
        assert {(o["provider"], o["tier"], o["usd_per_hour"]) for o in json.loads(out)["options"]} == rows
    code, _out, err = run_cli(["plan", spec, "--images", "25", "--gpu", "RTX 4080"], capsys)
    assert code == 1 and "no price for RTX 4080" in err and "--live" in err
    raw = yaml.safe_load((Path(snapshot.__file__).parent / "data" / "prices.yaml").read_text())
    dated = [p for p in raw["prices"] if "as_of" in p]
    assert len(dated) == 8 and all(p.get("source") for p in dated)


def test_a_mistyped_model_id_with_no_hub_fails_fast_and_names_the_fix_train_takes(tmp_path, monkeypatch, capsys):
    """No network and HF_HUB_OFFLINE unset: huggingface_hub retried each file five times (~25 s, a
    line each) and the hint said `--model`, which `train` does not take."""
    import socket
    import time

    from lorapod import home

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: a refused connect, as with no route to the hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(home, "_unreachable", {})
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    code, _out, err = run_cli(["train", str(ROOT / "examples" / "llm-chat-lora.yaml"),
                               "--set", "model.id=meta-llama/Llama-3.1-8B-Instrct"], capsys)
    took = time.monotonic() - start
    assert code == 1, err
    assert "the Hugging Face hub cannot be reached (127.0.0.1:" in err and "is not in its cache" in err
    assert "did you mean meta-llama/Llama-3.1-8B-Instruct?" in err and "--set model.id=PATH" in err
    assert "point --model" not in err
    assert took < 20, f"{took:.0f} s"  # huggingface_hub's retries alone sleep 1+2+4+8+8 s per file
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_job_stopped_before_its_first_step_never_says_step_none(capsys):
    import json

    from lorapod.rundir import at_step, last_step, new_job_id
    from lorapod.store.ledger import Ledger

    ledger = Ledger()
    job = new_job_id("demo")
    ledger.job_started(job, "/tmp/runs/" + job, "runpod", None, None, 1.0, 1.0)  # booting: no step yet
    ledger.close()
    code, _out, err = run_cli(["down", job], capsys)
    assert code == 0, err
    code, out, _err = run_cli(["ps", "--json"], capsys)
    (row,) = json.loads(out)
    assert row["summary"].startswith("stopped by `lorapod down` before its first step"), row["summary"]
    assert (at_step(None), at_step(0), last_step(None), last_step(7)) == (
        "before its first step", "at step 0", "no step yet", "last step 7")


def test_train_into_a_log_file_writes_whole_lines_not_80_column_wraps(tmp_path, monkeypatch, capsys):
    """A remote (or `run --on local`) job's job.log is `lorapod train`'s stderr in a file: rich
    wrapped it at 80 columns, cutting the run folder's path and the resume command (issue #38).
    Here stderr is pytest's capture, not a terminal, as a job.log is."""
    import yaml

    from .llm_fixtures import make_model_dir, spec_dict, write_data

    monkeypatch.delenv("COLUMNS", raising=False)
    deep = tmp_path / ("a-rather-long-folder-name-" * 3) / "runs"
    raw = spec_dict(make_model_dir(tmp_path, hidden=32, layers=1), *write_data(tmp_path), deep, max_steps=2)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(raw))
    code, _out, err = run_cli(["train", str(spec)], capsys)
    assert code == 0, err
    run_line = next(ln for ln in err.splitlines() if ln.startswith("run folder: "))
    assert run_line.startswith(f"run folder: {deep}") and len(run_line) > 80  # one line, the whole path
    adapter = next(ln for ln in err.splitlines() if ln.startswith("adapter: "))
    assert adapter.endswith("/adapter")


def test_a_failed_llm_train_leaves_no_empty_runs_folder_it_made(tmp_path, monkeypatch, capsys):
    """A failed `lorapod train` removed its run folder but left the `runs/` it had made, empty
    (issue #38); a `runs/` that was there before stays, with what is in it."""
    import yaml

    from .llm_fixtures import spec_dict, write_data

    monkeypatch.chdir(tmp_path)
    tr, va = write_data(tmp_path)  # the data is here (a missing file is refused before any folder)
    raw = spec_dict(tmp_path / "no-such-model", tr, va, "runs")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(raw))
    code, _out, err = run_cli(["train", str(spec)], capsys)
    assert code != 0 and "nothing was trained: removed" in err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "earlier-run").mkdir(parents=True)
    code, _out, err = run_cli(["train", str(spec)], capsys)
    assert code != 0 and [p.name for p in (tmp_path / "runs").iterdir()] == ["earlier-run"]
