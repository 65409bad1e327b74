"""Image ``lorapod eval`` recommends a checkpoint without ``--clip`` (issue 38, item 5): from the
run's logged losses (validation at the checkpoints, else the training curve before each), the
earliest within the noise of the lowest, or it says why it cannot."""

from __future__ import annotations

import json
from pathlib import Path

from lorapod.evaluate.images import ImageEval, page, recommend


def _metrics(path: Path, train: dict[int, float], evals: dict[int, float] | None = None) -> Path:
    recs = [(s, 0, {"step": s, "epoch": s / 10, "loss": v, "lr": 1e-4}) for s, v in train.items()]
    recs += [(s, 1, {"step": s, "epoch": s / 10, "event": "eval", "fixed_noise_loss": v}) for s, v in (evals or {}).items()]
    # in the order the engine writes them (an eval right after its step): the one reader of
    # metrics.jsonl (rundir/metrics.py) drops a line whose step goes back
    path.write_text("".join(json.dumps(r) + "\n" for _, _, r in sorted(recs, key=lambda x: (x[0], x[1]))))
    return path


def test_the_validation_loss_at_each_checkpoint_decides_and_an_upturn_is_named(tmp_path):
    m = _metrics(tmp_path / "metrics.jsonl", {s: 0.5 for s in range(1, 41)},
                 {10: 0.30, 20: 0.20, 30: 0.203, 40: 0.26})
    best, why = recommend(m, ["step-10", "step-20", "step-30", "step-40"], {"step-20": 0.05})
    assert best == "step-20"
    assert why.startswith("fixed-noise validation loss: step-10 0.3000, step-20 0.2000")
    assert "turned up after it (to 0.2600 at step-40): later checkpoints over-fit" in why
    assert "leakage at full strength 0.050" in why


def test_without_evaluations_the_training_curve_before_each_checkpoint_decides(tmp_path):
    # falling until step 10, then flat within the noise: the earliest flat checkpoint is the one
    curve = {s: 1.0 - 0.08 * s if s <= 10 else 0.2 + 0.001 * (s % 3) for s in range(1, 61)}
    m = _metrics(tmp_path / "metrics.jsonl", curve, {60: 0.3})  # one eval, at the end only
    best, why = recommend(m, ["step-20", "step-40", "step-60"])
    assert best == "step-20"
    assert why.startswith("training loss, mean of the 10 step(s) before each checkpoint")
    assert "within 2% of it: more steps, no better fit" in why
    # still falling at the last checkpoint: it is the one, and more training may help
    m = _metrics(tmp_path / "falling.jsonl", {s: 1.0 - 0.01 * s for s in range(1, 61)})
    best, why = recommend(m, ["step-20", "step-40", "step-60"])
    assert best == "step-60" and "last checkpoint and the loss still fell" in why and "more training" in why


def test_no_loss_logged_says_why_nothing_is_recommended_and_the_page_says_it(tmp_path):
    best, why = recommend(tmp_path / "missing.jsonl", ["step-10"])
    assert best is None and "no loss logged at the checkpoints' steps" in why
    text = page(ImageEval([], [1.0], None, best=best, reason=why), "run")
    assert "no checkpoint recommended: no loss logged" in text
    text = page(ImageEval([], [1.0], None, best="step-10", reason="r"), "run")
    assert "<b>recommended: step-10</b> (r)" in text
