"""The dashboard shows the library's decisions, never its own (issue 34, item 5): the Plan page is
the planner's ``Plan.to_page``, the last checkpoint is ``rundir.last_checkpoint``, and Compare's
validation loss is the one a sweep ranks runs by (``rundir.last_loss``)."""

from __future__ import annotations

import json
from pathlib import Path

from starlette.testclient import TestClient

from lorapod.ui.app import Dashboard, build_app
from lorapod.ui.guard import cookie_name
from lorapod.ui.runs import RunIndex

from .ui_fixtures import run_folder

TOKEN = "t0ken-for-tests"
EXAMPLE = Path(__file__).parents[1] / "examples" / "sdxl-object-lora.yaml"


def client(dash: Dashboard) -> TestClient:
    c = TestClient(build_app(dash, {"testserver"}, 0), follow_redirects=False)
    c.cookies.set(cookie_name(0), TOKEN)
    return c


def test_the_plan_page_shows_the_planners_own_page_of_the_plan(tmp_path):
    from lorapod.plan.choose import plan_job
    from lorapod.spec import load_spec

    dash = Dashboard(RunIndex([tmp_path]), TOKEN, spec_files=[EXAMPLE])
    page = client(dash).get("/plan?spec=0")
    assert page.status_code == 200 and "Offers ranked by $ per job" in page.text
    want = plan_job(load_spec(EXAMPLE)).to_page()
    assert dash.plan(EXAMPLE.resolve()) == want
    assert want["options"][want["best"]]["fits"] and want["job"]["vram_parts_gb"]
    assert want["note"] in page.text or want["note"].replace("'", "&#39;") in page.text


def test_compare_shows_the_loss_a_sweep_ranks_by(tmp_path):
    from lorapod.compute.sweep import last_loss

    root = run_folder(tmp_path)
    with (root / "metrics.jsonl").open("a") as fh:  # an eval line whose val_loss is null: the image loss counts
        fh.write(json.dumps({"step": 21, "event": "eval", "val_loss": 0.25}) + "\n")
        fh.write(json.dumps({"step": 22, "event": "eval", "val_loss": None, "fixed_noise_loss": 0.125}) + "\n")
    assert last_loss(root) == ("fixed_noise_loss", 0.125)
    page = client(Dashboard(RunIndex([tmp_path]), TOKEN)).get(f"/compare?job={root.name}").text
    assert "<td>0.1250</td>" in page and "<td>0.2500</td>" not in page
