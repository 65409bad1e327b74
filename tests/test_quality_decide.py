"""The quality autopilot's decision (quality/decide.py): the composite score, the pick of checkpoint and
strength, and train.stop_when's plateau and target, as pure functions of the scored records."""

from __future__ import annotations

import pytest

from lorapod.quality import decide
from lorapod.quality.holdout import Candidate, count, split
from lorapod.quality.llm import exact_match, normalise, token_f1
from lorapod.quality.prompts import default_prompts, strip_trigger
from lorapod.rundir import quality as files
from lorapod.spec import SpecError, validate


def rec(step: int, scores: dict[str, float], se: float = 0.01, memorised: tuple[str, ...] = ()) -> dict:
    return {"step": step, "checkpoint": f"step-{step}",
            "strengths": {k: {"score": v, "se": se, "memorised": k in memorised} for k, v in scores.items()}}


def test_the_pick_is_the_best_checkpoint_and_strength():
    records = [rec(100, {"0.6": 0.05, "0.8": 0.08, "1": 0.07}), rec(200, {"0.6": 0.10, "0.8": 0.30, "1": 0.20}),
               rec(300, {"0.6": 0.12, "0.8": 0.18, "1": 0.15})]
    pick = decide.pick(records)
    assert (pick["checkpoint"], pick["strength"], pick["score"]) == ("step-200", 0.8, 0.30)
    assert "0.3000" in pick["reason"] and "fell after it" in pick["reason"]
    assert [t["best"]["strength"] for t in pick["table"]] == [0.8, 0.8, 0.8]


def test_an_earlier_checkpoint_within_the_noise_wins():
    records = [rec(100, {"1": 0.10}), rec(200, {"1": 0.295}, se=0.02), rec(300, {"1": 0.30}, se=0.02)]
    pick = decide.pick(records)
    assert pick["checkpoint"] == "step-200" and "within the noise" in pick["reason"]


def test_a_copy_of_a_training_image_is_never_picked_even_when_it_scores_best():
    records = [rec(100, {"0.8": 0.10, "1": 0.12}), rec(200, {"0.8": 0.50, "1": 0.90}, memorised=("0.8", "1")),
               rec(300, {"0.8": 0.15, "1": 0.11}, memorised=("1",))]
    pick = decide.pick(records)
    assert (pick["checkpoint"], pick["strength"]) == ("step-300", 0.8)
    assert "copies of training images" in pick["reason"] and "step-200" in pick["reason"]
    everything_copied = [rec(100, {"1": 0.4}, memorised=("1",))]
    assert decide.pick(everything_copied)["checkpoint"] is None


def test_an_autopilot_that_is_off_picks_nothing_and_says_why():
    pick = decide.pick([rec(100, {"1": 0.2})], off="no held-out reference images")
    assert pick["autopilot"] == "off" and pick["checkpoint"] is None and "reference" in pick["reason"]
    assert pick["table"][0]["best"]["score"] == 0.2  # the scores are still shown


def test_plateau_counts_checkpoints_that_do_not_beat_the_best_by_more_than_its_noise():
    rising = [rec(s, {"1": v}) for s, v in ((10, 0.1), (20, 0.2), (30, 0.3))]
    assert decide.stop_reason(rising, plateau=2, target=None) is None
    flat = [*rising, rec(40, {"1": 0.305}), rec(50, {"1": 0.295})]  # within 0.01 of 0.3
    why = decide.stop_reason(flat, plateau=2, target=None)
    assert why is not None and "step-30" in why and "step-40 +0.3050, step-50 +0.2950" in why
    assert decide.stop_reason(flat, plateau=3, target=None) is None
    # a real improvement resets the count; min_delta widens what counts as noise
    better = [*rising, rec(40, {"1": 0.35}), rec(50, {"1": 0.35})]
    assert decide.stop_reason(better, plateau=2, target=None) is None
    assert decide.stop_reason(better, plateau=2, target=None, min_delta=0.1) is not None
    # never before min_checkpoints
    assert decide.stop_reason(flat[:3], plateau=1, target=None, min_checkpoints=5) is None


def test_a_copied_checkpoint_is_never_the_plateaus_best():
    records = [rec(10, {"1": 0.3}), rec(20, {"1": 0.9}, memorised=("1",)), rec(30, {"1": 0.31}), rec(40, {"1": 0.3})]
    why = decide.stop_reason(records, plateau=3, target=None)
    assert why is not None and "step-10" in why


def test_target_stops_once_reached():
    records = [rec(10, {"1": 0.1}), rec(20, {"1": 0.26})]
    assert "target reached" in decide.stop_reason(records, plateau=None, target=0.25)
    assert decide.stop_reason(records, plateau=None, target=0.3) is None


def test_the_image_score_is_fidelity_less_lost_adherence_less_leakage():
    score, se = decide.image_score([0.2, 0.4], [0.01, 0.03], [0.1, 0.3])
    assert score == pytest.approx(0.3 - 0.5 * 0.2)  # adherence above the base does not add
    score2, _ = decide.image_score([0.2, 0.4], [-0.02, -0.04], [])
    assert score2 == pytest.approx(0.3 - 0.03)
    assert se > 0
    assert decide.image_score([], [0.1], [0.1]) == (None, 0.0)  # no fidelity, no score


def test_stop_when_needs_a_rule_and_is_off_by_default():
    base = {"model": {"id": "x"}, "data": {"path": "d"}}
    assert validate(base).train.stop_when is None
    assert validate({**base, "train": {"stop_when": {"plateau": 3}}}).train.stop_when.plateau == 3
    with pytest.raises(SpecError, match="plateau"):
        validate({**base, "train": {"stop_when": {"min_delta": 0.1}}})


def test_holdout_counts_and_which_images_by_content_hash(tmp_path):
    assert count("auto", 7) == 0 and count("auto", 8) == 1 and count("auto", 40) == 4 and count("auto", 500) == 8
    assert count(3, 5) == 3 and count(9, 5) == 4 and count(0.25, 8) == 2
    cands = [Candidate(tmp_path / f"{i}.png", f"zxq mug {i}" if i < 9 else "a bowl", f"{(i * 7) % 12:02d}")
             for i in range(12)]
    held = split(cands, "auto", "zxq")
    assert len(held.held) == 1 and held.held_digests == {"00"}  # the lowest digest among subject images
    assert "1 of 9 subject images" in held.why
    assert "00" not in held.train and len(held.train) == 11
    few = split(cands[:5], "auto", "zxq")
    assert few.held == [] and "fewer than 8" in few.why and "holdout_path" in few.why
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "a.jpg").write_bytes(b"x")
    given = split(cands, "auto", "zxq", str(refs))
    assert given.held == [refs / "a.jpg"] and len(given.train) == 12  # everything trains


def test_default_prompts_put_the_trigger_in_new_scenes_and_take_it_out_for_leakage():
    out = default_prompts("zxq", ["zxq mug, on a table", "red apple", "zxq mug in hand"])
    assert out[:4] == ["zxq on a sandy beach at sunset", "zxq in a snowy forest",
                       "zxq on a wooden table in a cozy kitchen", "a watercolor painting of zxq"]
    assert out[4:] == ["mug, on a table", "mug in hand"]
    assert strip_trigger("zxq, a red mug", "zxq") == "a red mug"


def test_answer_scores_follow_squads_normalisation():
    assert normalise("The Apple is RED!") == "apple is red"
    assert exact_match("the apple is red.", "Apple is red") == 1.0
    assert token_f1("apple is red", "the apple is green") == pytest.approx(2 / 3)
    assert token_f1("", "x") == 0.0


def test_the_quality_files_are_read_bounded_and_never_through_a_link(tmp_path):
    files.write_json(tmp_path, files.PICK, {"checkpoint": "step-3", "strength": 0.8, "score": float("nan")})
    assert files.read_json(tmp_path, files.PICK)["score"] is None  # NaN written as null
    assert files.pick_summary(tmp_path)["checkpoint"] == "step-3"
    (tmp_path / "quality" / files.STOPPED).symlink_to(tmp_path / "quality" / files.PICK)
    assert files.read_json(tmp_path, files.STOPPED) is None
    (tmp_path / "quality" / files.BASE).write_bytes(b"{" * (files.MAX_JSON_BYTES + 1))
    assert files.read_json(tmp_path, files.BASE) is None
    files.append_score(tmp_path, {"step": 5, "strengths": {"1": {"score": 0.1}}})
    with open(tmp_path / "quality" / files.SCORES, "a") as fh:
        fh.write('{"step": 10**30}\nnot json\n{"step": 7, "strengths": "x"}\n')
    files.append_score(tmp_path, {"step": 5, "strengths": {"1": {"score": 0.2}}})  # a resume scored it again
    got = files.read_scores(tmp_path)
    assert [(r["step"], r["strengths"]["1"]["score"]) for r in got] == [(5, 0.2)]


def test_a_converged_curve_with_no_spread_is_a_plateau_not_an_endless_creep():
    """Every answer right (standard error 0) while the loss creeps down by 1e-5: within the noise floor."""
    creep = [rec(40 * k, {"1": v}, se=0.0) for k, v in enumerate((0.70, 0.9886, 0.9999, 0.99995, 1.0, 1.0), 1)]
    why = decide.stop_reason(creep, plateau=2, target=None)
    assert why is not None and "step-120" in why and f"{decide.NOISE_FLOOR:.4f}" in why
    assert decide.pick(creep)["checkpoint"] == "step-120"


def test_a_scoring_that_fails_ends_the_scoring_not_the_training(tmp_path):
    from lorapod.quality.autopilot import Autopilot

    class Broken:
        kind = "image"

        def measure(self, step):
            if step == 20:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
            return {"kind": "image", "strengths": {"1": {"score": 0.1, "se": 0.01}}, "models": {}}

    spec = validate({"model": {"id": "x"}, "data": {"path": "d"}, "train": {"stop_when": {"plateau": 1}}})
    said: list[str] = []
    pilot = Autopilot(spec, tmp_path, Broken(), log=said.append)
    assert pilot.on_checkpoint(10, 100) is None
    assert pilot.on_checkpoint(20, 100) is None and pilot.scoring is None
    assert pilot.on_checkpoint(30, 100) is None  # not scored any more, training goes on
    pick = files.read_json(tmp_path, files.PICK)
    assert pick["autopilot"] == "off" and "scoring failed at step-20" in pick["reason"] and "out of memory" in said[-1]
    assert [r["step"] for r in files.read_scores(tmp_path)] == [10]
