"""The quality autopilot after training: score the checkpoints the run did not score while it trained.

A run scores its checkpoints where they are made (quality/autopilot.py). One that could not (its
scorer models were not reachable on the instance, it ran on several processes, an external trainer
that gave the GPU no room) is scored here by ``lorapod eval``, with the same prompts, seeds,
references and rules, into the same ``quality/`` files, so the pick, ``export``'s default, the model
card and the dashboard read one decision however it was made.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lorapod.quality.autopilot import Autopilot, ImageScoring
from lorapod.quality.holdout import Candidate, Holdout, split
from lorapod.rundir import RunDir
from lorapod.rundir import quality as files


def references(spec: Any, run: RunDir) -> Holdout:
    """The images the run held out, recomputed here from its data (the same images by content hash
    as on the machine that trained). Only what the run's holdout.json says it held out: a run that
    trained on every image has no references but ``data.holdout_path``'s (its own training images
    would reward copying)."""
    from lorapod.engine.diffusion.dataset import scan

    d = spec.data
    if d.holdout_path:
        return split([], d.holdout, d.trigger, d.holdout_path)
    said = files.read_json(run.root, files.HOLDOUT)
    if not said or not said.get("count"):
        why = str(said.get("why"))[:500] if said else "the run did not hold any image out of training"
        return Holdout([], set(), f"{why}; give references it did not train on in data.holdout_path")
    try:
        items, _ = scan(spec.data_paths(), d.resolution, d.buckets, d.caption_extension, d.repeats, d.trigger)
    except Exception as exc:  # the data is not on this machine (a pulled run): say so, score without
        return Holdout([], set(), f"the run's data is not readable here ({exc}): no references")
    cands = {it.digest: Candidate(it.path, it.caption, it.digest) for it in items}
    held = split(list(cands.values()), d.holdout, d.trigger, d.holdout_path)
    names = sorted(str(p).rsplit("/", 1)[-1] for p in said.get("held") or [])
    if sorted(p.name for p in held.held) != names:
        return Holdout([], set(), f"the data here is not what the run trained on (it held out {', '.join(names)})")
    return held


def score_images(spec: Any, run: RunDir, family: str, labels: list[str], activate: Callable[[str | None, float], None],
                 draw: Callable[[Any], Any], clip: str | None = None, dino: str | None = None,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Score every checkpoint in ``labels`` (``step-N``) that quality/scores.jsonl lacks, and return
    the decision (pick.json). ``activate(label, strength)`` puts that checkpoint at that strength in
    the pipeline (label None: the LoRA disabled, the base); ``draw(prompt)`` draws one image."""
    from lorapod.engine.autopilot import image_prompts
    from lorapod.quality.scorers import load
    from lorapod.rundir.layout import checkpoint_step

    q = spec.quality.model_copy(update={k: v for k, v in (("clip", clip), ("dino", dino)) if v})
    scorers = load(q, log)
    for note in scorers.notes:
        log(f"quality: {note}")
    held = references(spec, run)
    if not scorers.any_image:
        pilot = Autopilot(spec, run.root, None, "no scorer model loaded (" + "; ".join(scorers.notes) + ")", log)
        pilot.start()
        return files.read_json(run.root, files.PICK) or {}
    from PIL import Image

    refs = []
    for p in held.held:
        with Image.open(p) as im:
            refs.append(im.convert("RGB"))
    scorers.settle_face(refs, q.face)
    training = []
    for root in spec.data_paths():
        for p in sorted(Path(root).rglob("*")):
            if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp") and len(training) < 512:
                with Image.open(p) as im:
                    training.append(im.convert("RGB"))
    from lorapod.catalog import families

    prompts = image_prompts(spec, _captions(spec), families.facts(family).guidance)
    current: dict[str, str | None] = {"label": None}

    def render(sp: Any, strength: float) -> list[Any]:
        activate(current["label"] if strength != 0.0 else None, strength)
        return [draw(sp)]

    off = None if held.held else f"no held-out reference images to score subject fidelity against: {held.why}"
    scoring = ImageScoring(run.root, scorers, prompts, q.strengths, refs, training, render)
    pilot = Autopilot(spec, run.root, scoring, off, log, run.event)
    pilot.start()
    for label in labels:
        step = checkpoint_step(label)
        if step is None or pilot.scored(step):
            continue
        current["label"] = label
        pilot.on_checkpoint(step, step)  # total = step: nothing left to stop
    return files.read_json(run.root, files.PICK) or {}


def _captions(spec: Any) -> list[str]:
    out = []
    for root in spec.data_paths():
        for p in sorted(Path(root).rglob(f"*{spec.data.caption_extension}")):
            try:
                out.append(p.read_text(encoding="utf-8").strip())
            except OSError:
                continue
    return out

