"""Where the quality autopilot's one decision shows: `lorapod eval`, `export` (which takes the pick by
default), the model card, `ps --json` and the run summary. A tiny Llama run (no downloads) is scored
while it trains; the decision is then read back everywhere."""

from __future__ import annotations

import json

import pytest

from lorapod.rundir import RunDir
from lorapod.rundir import quality as files
from lorapod.spec import load_spec

from .llm_fixtures import make_assets, spec_dict


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory):
    from lorapod.engine.llm import train_llm

    tmp = tmp_path_factory.mktemp("q")
    _, model_dir, train, val = make_assets(tmp)
    raw = spec_dict(model_dir, train, val, tmp / "runs", max_steps=6)
    raw["save"] = {"every_steps": 3, "every_epochs": None, "keep_last": 5}
    raw["quality"] = {"examples": 4, "max_new_tokens": 8}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    assert [r["step"] for r in files.read_scores(run.root)] == [3, 6]
    return run


def pick(run, checkpoint: str, strength: float = 1.0) -> None:
    """Set the decision to ``checkpoint`` (what the autopilot wrote, with another winner)."""
    decision = files.read_json(run.root, files.PICK)
    decision.update(checkpoint=checkpoint, step=int(checkpoint.split("-")[1]), strength=strength,
                    reason=f"best score at {checkpoint}")
    files.write_json(run.root, files.PICK, decision)


def test_export_takes_the_pick_by_default_and_says_so(llm_run, tmp_path):
    from lorapod.export.targets import export_run

    pick(llm_run, "step-3")
    done = export_run(llm_run.root, "peft", out=tmp_path / "a")
    assert "step-3: the quality autopilot's pick" in done.notes[0] and "--final" in done.notes[0]
    events = llm_run.events_file.read_text()
    assert "export peft of step-3" in events
    final = export_run(llm_run.root, "peft", out=tmp_path / "b", final=True)
    assert not any("pick" in n for n in final.notes) and "export peft of final" in llm_run.events_file.read_text()
    explicit = export_run(llm_run.root, "peft", checkpoint=6, out=tmp_path / "c")
    assert not any("pick" in n for n in explicit.notes)
    # a pick whose checkpoint is not on this disk (not pulled): the final adapter, as before
    pick(llm_run, "step-9")
    assert not any("pick" in n for n in export_run(llm_run.root, "peft", out=tmp_path / "d").notes)


def test_the_model_card_names_the_checkpoint_its_strength_and_the_scores(llm_run):
    from lorapod.export.card import CardFile, render
    from lorapod.spec import validate

    pick(llm_run, "step-6", 0.8)
    decision = files.read_json(llm_run.root, files.PICK)
    spec = validate({"model": {"id": "stabilityai/stable-diffusion-xl-base-1.0", "family": "sdxl"},
                     "data": {"path": "d", "format": "images", "trigger": "zxq"}})
    card = render(spec, repo_id="me/mug", what="adapter", files=[CardFile("README.md", "this card")], metrics=[],
                  samples=[], lorapod_version="0.1.0", quality=decision, label="step-6")
    assert "## Checkpoint and strength" in card
    assert "picked **step-6** at strength **0.8**" in card and "This is that checkpoint." in card
    assert "| step-3 |" in card and "| step-6 |" in card and "held-out reference images" in card
    other = render(spec, repo_id="me/mug", what="adapter", files=[], metrics=[], samples=[], lorapod_version="0.1.0",
                   quality=decision, label="final")
    assert "This upload is final, not the pick." in other


def test_ps_json_and_the_summary_carry_the_pick_and_the_stop(llm_run, tmp_path):
    from lorapod.compute.jobs import ps_rows
    from lorapod.compute.session import Summary
    from lorapod.store.ledger import Ledger

    pick(llm_run, "step-3")
    files.write_json(llm_run.root, files.STOPPED, {"step": 6, "reason": "plateau", "steps_saved": 94,
                                                    "seconds_saved": 600.0})
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.job_started("job-1", str(llm_run.root), "runpod", None, None, 1.0, 1.0)
    (row,) = ps_rows(ledger)
    assert row["quality"]["checkpoint"] == "step-3" and row["quality"]["strength"] == 1.0
    assert row["quality"]["stopped"] == {"step": 6, "reason": "plateau", "steps_saved": 94, "seconds_saved": 600.0}
    json.dumps(row)  # what `ps --json` prints
    assert Summary("job-1", llm_run.root, "done", 6, 0.1, "ok").to_dict()["quality"]["checkpoint"] == "step-3"
    assert files.saved_line(row["quality"]["stopped"], 0.74) == ("stopped by train.stop_when at step 6 (plateau): "
                                                                 "94 planned step(s) not run, 10.0 min and $0.12 "
                                                                 "saved against the plan")
    (llm_run.root / "quality" / files.STOPPED).unlink()


def test_eval_shows_the_autopilots_pick_and_scores_what_was_not_scored(llm_run, tmp_path):
    from typer.testing import CliRunner

    from lorapod.cli.main import build_app

    scores = llm_run.root / "quality" / files.SCORES
    kept = scores.read_text().splitlines()
    scores.write_text(kept[0] + "\n")  # as if step-6 had not been scored while training
    r = CliRunner().invoke(build_app(), ["eval", str(llm_run.root), "--device", "cpu", "--n-prompts", "1"])
    assert r.exit_code == 0, r.output
    assert [x["step"] for x in files.read_scores(llm_run.root)] == [3, 6]  # step-6 scored by eval
    decision = files.read_json(llm_run.root, files.PICK)
    eval_md = (llm_run.root / "eval" / "eval.md").read_text()
    assert f"Recommended: **{decision['checkpoint']}**: quality autopilot:" in eval_md
    assert "| checkpoint | quality score (vs base) | ± se |" in eval_md
