"""Issue 48's dashboard frictions (F7, F8, F9, F23), through the pages as a browser gets them."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
import yaml
from starlette.testclient import TestClient

from lorapod.ui.app import Dashboard, build_app
from lorapod.ui.guard import cookie_name
from lorapod.ui.runs import RunIndex

from .ui_fixtures import run_folder

TOKEN = "t" * 32
EX = Path(__file__).resolve().parents[1] / "examples"


def client(root: Path, **kw) -> TestClient:
    c = TestClient(build_app(Dashboard(RunIndex([root]), TOKEN, **kw), {"testserver"}, 0), follow_redirects=False)
    c.cookies.set(cookie_name(0), TOKEN)
    return c


def _options(page: str, name: str) -> list[str]:
    select = re.search(rf'<select name="{name}">(.*?)</select>', page, re.S)
    assert select, page
    return [html.unescape(o) for o in re.findall(r"<option[^>]*>([^<]*)</option>", select[1])]


def test_the_plan_page_offers_the_examples_and_never_a_spec_it_would_refuse(tmp_path, monkeypatch):
    """F7: the page offered only the demo run's spec (the built-in model, which it then refused)
    and named examples it did not list."""
    monkeypatch.chdir(tmp_path)  # a folder of runs; the examples come from lorapod's own checkout
    run_folder(tmp_path)  # its spec is on lorapod:tiny-sd15, the built-in demo model
    c = client(tmp_path)
    page = c.get("/plan").text
    offered = _options(page, "spec")
    assert str((EX / "sdxl-object-lora.yaml").resolve()) in offered
    assert str((EX / "llm-chat-lora.yaml").resolve()) in offered
    assert not any(o.endswith("demo.yaml") or "zxq-demo" in o for o in offered)  # built-in model specs
    sdxl = offered.index(str((EX / "sdxl-object-lora.yaml").resolve()))
    planned = c.get(f"/plan?spec={sdxl}")
    assert planned.status_code == 200 and "Phases, #1" in planned.text and "SDXL" in planned.text


def _mug(tmp_path: Path, n: int = 16) -> Path:
    from PIL import Image

    folder = tmp_path / "mug"
    folder.mkdir()
    for i in range(n):
        Image.new("RGB", (256, 256), (9 * i, 90, 120)).save(folder / f"p{i:02d}.jpg")
        (folder / f"p{i:02d}.txt").write_text(f"zxq_mug, a mug {i}")
    (folder / "p03.txt").write_text("a mug without the trigger")
    return folder


def test_the_data_page_checks_as_the_cli_does_with_the_specs_trigger_and_family(tmp_path):
    """F8: the Data page found one error fewer than `lorapod data check --trigger`: it had no
    trigger (nor family) to pass. A run's spec now gives both, and the page has the two fields."""
    pytest.importorskip("PIL")
    from lorapod.data.check import check_path

    folder = _mug(tmp_path)
    runs = tmp_path / "runs"
    root = run_folder(runs, name="mug-20261201-120000-ab12")
    (root / "spec.yaml").write_text(yaml.safe_dump({
        "model": {"id": "stabilityai/stable-diffusion-xl-base-1.0", "family": "sdxl"},
        "data": {"path": str(folder), "trigger": "zxq_mug"}}))
    c = client(runs)
    index = _options(c.get("/data").text, "folder").index(str(folder.resolve()))
    page = c.get(f"/data?folder={index}").text
    assert "--family sdxl --trigger zxq_mug" in html.unescape(page)
    assert "trigger=zxq_mug" in html.unescape(page)  # the report frame is asked with it
    report = c.get(f"/data/report/{index}?family=sdxl&trigger=zxq_mug").text
    cli = check_path(folder, family="sdxl", trigger="zxq_mug")
    counts = cli.counts()
    assert f"{counts['error']} errors</span>, <span class='warning'>{counts['warning']} warnings" in report
    assert any(f.path == "p03.txt" for f in cli.findings) and "p03.txt" in report  # the missing trigger
    spec_only = c.get(f"/data/report/{index}").text  # no fields: the spec's trigger all the same
    assert f"{counts['error']} errors</span>, <span class='warning'>{counts['warning']} warnings" in spec_only
    # without a trigger (a --data folder the page knows nothing of) it says so, and the fields fill it in
    plain = client(runs, data_folders=[folder])
    page = plain.get("/data?folder=0").text
    assert "no trigger word given" in page
    said = html.unescape(plain.get("/data?folder=0&trigger=zxq_mug&family=sdxl").text)
    assert "--family sdxl --trigger zxq_mug" in said


def _llm_run(runs: Path, name: str, prompts: list[str] | None) -> Path:
    root = run_folder(runs, name=name, samples=0)
    spec = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "family": "llm"}, "data": {"path": "chats.jsonl"}}
    if prompts:
        spec["samples"] = {"prompts": prompts, "every_steps": 10}
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    return root


def test_an_llm_runs_samples_are_its_answers_not_samples_0(tmp_path):
    """F23: the run page said "Samples (0)" for an LLM run whose samples are the adapter's answers
    (samples/<tag>-answers.jsonl, engine/llm.py); a run without samples.prompts says why it has none."""
    import json

    from lorapod.rundir.layout import answers_file

    runs = tmp_path / "runs"
    root = _llm_run(runs, "chat-20261201-120000-ab12", ["How many legs has a spider?", "2 + 2?"])
    rows = [{"prompt": "How many legs has a spider?", "answer": "Eight <b>legs</b>."},
            {"prompt": "2 + 2?", "answer": "4"}]
    (root / "samples" / answers_file("step000010")).write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"prompt": 3}\nnot json\n')
    page = client(runs).get("/runs/chat-20261201-120000-ab12").text
    assert "Samples <span class=\"dim\">(2)</span>" in page and "No samples" not in page
    assert "How many legs has a spider?" in page and "Eight &lt;b&gt;legs&lt;/b&gt;." in page  # escaped
    bare = _llm_run(runs, "chat-20261201-130000-cd34", None)
    page = client(runs).get(f"/runs/{bare.name}").text
    assert "No samples: the spec sets no" in page and "samples.prompts" in page
