"""The quality autopilot wired to lorapod's own engine (quality/ holds the scoring and deciding).

Three things only the engine knows how to do: keep the held-out images out of its data
(:func:`hold_out`), turn the scoring prompts into what its sampler takes (:func:`image_prompts`),
and draw or answer with the model it is training, at a strength, without disturbing the training
(the recipes' ``render`` and the LLM's ``generate``). :func:`image_autopilot` and
:func:`llm_autopilot` put them together into the one :class:`~lorapod.quality.autopilot.Autopilot`
the loop calls at every checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapod.quality.autopilot import Autopilot, ImageScoring, LLMScoring
from lorapod.quality.holdout import Candidate, Holdout, split
from lorapod.quality.prompts import ScorePrompt, score_prompts
from lorapod.quality.scorers import Scorers
from lorapod.rundir import RunDir
from lorapod.rundir import quality as files
from lorapod.spec import JobSpec

#: the most training images hashed for the memorisation check (a copy of any of them counts)
MAX_TRAIN_HASHED = 512
#: the longest clip the quality autopilot draws to score a checkpoint (first, middle, last frame), in
#: lorapod's video engine and through an external trainer's pipeline alike
SCORE_FRAMES = 9


@dataclass
class ImagePlan:
    """What the autopilot of an image or video run will be, known before the data is read: its
    scorers, or why it is off. Images are held out of training only when something will score
    against them (:attr:`holds_out`)."""

    scorers: Scorers | None = None
    off: str | None = None

    @property
    def holds_out(self) -> bool:
        return self.scorers is not None and self.scorers.any_image


def plan_image(spec: JobSpec, world: Any, log: Callable[[str], None]) -> ImagePlan | None:
    """None when ``quality.score`` is off or this is not rank 0; the scorers otherwise (loaded from
    the Hub or a folder, said when they do not load)."""
    if spec.quality.score == "off" or not world.is_main:
        return None
    if world.active:
        return ImagePlan(None, f"a run of {world.size} processes is not scored while it trains (the other processes "
                               "would wait in their next all-reduce while rank 0 draws); score it afterwards with "
                               "`lorapod eval`")
    from lorapod.quality.scorers import load

    scorers = load(spec.quality, log)
    for note in scorers.notes:
        log(f"quality: {note}")
    if not scorers.any_image:
        return ImagePlan(None, "no scorer model loaded (" + "; ".join(scorers.notes) + ")")
    return ImagePlan(scorers)


def hold_out(spec: JobSpec, run: RunDir, items: Sequence[Any], log: Callable[[str], None],
             enabled: bool = True) -> tuple[list[Any], Holdout]:
    """The items that still train, and the held-out split (said in the log, kept in holdout.json).
    ``items`` have ``path``, ``caption`` and ``digest`` (image items, or a video's windows, which
    go out together with their file). ``enabled`` False (nothing will score): nothing held out."""
    if not enabled:
        return list(items), Holdout([], {it.digest for it in items}, "nothing held out: no quality scoring")
    seen: dict[str, Candidate] = {}
    for it in items:
        seen.setdefault(it.digest, Candidate(Path(it.path), it.caption, it.digest))
    held = split(list(seen.values()), spec.data.holdout, spec.data.trigger, spec.data.holdout_path)
    kept = [it for it in items if it.digest not in held.held_digests]
    if not kept:
        from lorapod.errors import DataError

        raise DataError("every image would be held out", hint="lower data.holdout")
    log(f"held out: {held.why}")
    run.event(f"quality held-out split: {held.why}")
    files.write_json(run.root, files.HOLDOUT, held.to_json())
    return kept, held


def image_prompts(spec: JobSpec, captions: Sequence[str], guidance: float, steps: int | None = None) -> list[ScorePrompt]:
    from lorapod.engine.diffusion.samples import parse_line

    q, res = spec.quality, spec.data.resolution
    return score_prompts(q.prompts, spec.data.trigger, list(captions), q.seed, res, res, steps or q.steps, guidance,
                         parse_line)


def open_image(path: Path) -> Any:
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


def image_autopilot(spec: JobSpec, run: RunDir, recipe: Any, plan: ImagePlan | None, device: Any,
                    log: Callable[[str], None], reference_frames: Callable[[Path], Any] | None = None) -> Autopilot | None:
    """The autopilot of an image or video run (None: quality.score off, or not rank 0). ``recipe``
    has ``render(prompt, strength) -> frames``, ``score_prompts``, ``holdout`` and ``items``;
    ``reference_frames`` reads one reference (a video run's clips), else it is opened as an image."""
    if plan is None:
        return None
    if plan.scorers is None:
        pilot = Autopilot(spec, run.root, None, plan.off, log, run.event)
        pilot.start()
        return pilot
    scorers, held = plan.scorers, recipe.holdout
    read = reference_frames or open_image
    refs = [read(p) for p in held.held]
    scorers.settle_face(refs, spec.quality.face)
    seen: set[Path] = set()
    training = []
    for it in recipe.items:
        if Path(it.path) not in seen and len(seen) < MAX_TRAIN_HASHED:
            seen.add(Path(it.path))
            training.append(read(Path(it.path)))
    off = None if refs else f"no held-out reference images to score subject fidelity against: {held.why}"
    scoring = ImageScoring(run.root, scorers, recipe.score_prompts, spec.quality.strengths, refs, training,
                           recipe.render, device)
    log("quality scorers: " + ", ".join(f"{k} {v}" for k, v in scorers.names().items()))
    pilot = Autopilot(spec, run.root, scoring, off, log, run.event)
    pilot.start()
    return pilot


def held_out_examples(conversations: Sequence[list[dict[str, Any]]], limit: int) -> list[tuple[list[dict[str, Any]], str]]:
    """(the conversation up to its first user turn, the reference reply after it), at most ``limit``."""
    examples: list[tuple[list[dict[str, Any]], str]] = []
    for conv in conversations:
        i = next((k for k, m in enumerate(conv) if m.get("role") == "user"), None)
        if i is None:
            continue
        reply = next((m for m in conv[i + 1:] if m.get("role") == "assistant"), None)
        if reply is not None and isinstance(reply.get("content"), str):
            examples.append((conv[: i + 1], reply["content"]))
        if len(examples) >= limit:
            break
    return examples


def llm_scoring(spec: JobSpec, run: RunDir, recipe: Callable[[], Any], examples: Sequence[tuple[list[dict[str, Any]], str]],
                generate: Callable[..., Any]) -> LLMScoring:
    """Held-out loss and greedy answers of the model ``recipe()`` returns (called when measured: an
    external trainer's scoring model loads at its first checkpoint), with and without its adapter."""
    q = spec.quality

    def evaluate(adapter: bool) -> float | None:
        r = recipe()
        if adapter:
            ev = r.evaluate()
        else:
            with r.model.disable_adapter():
                ev = r.evaluate()
        r.train()
        return ev.get("val_loss")

    def answer(conversations: list[list[dict[str, Any]]], adapter: bool) -> list[Any]:
        r = recipe()
        return list(generate(r.model, r.tokenizer, conversations, q.max_new_tokens, use_adapter=adapter))

    return LLMScoring(run.root, evaluate, answer, examples)


def llm_autopilot(spec: JobSpec, run: RunDir, recipe: Any, log: Callable[[str], None],
                  conversations: Sequence[list[dict[str, Any]]], generate: Callable[..., Any]) -> Autopilot | None:
    """The autopilot of an LLM run: held-out loss and greedy answers to ``conversations`` (the
    held-out split), ``generate`` being the engine's batched greedy decoder (engine/llm.py
    ``generate_many``)."""
    if spec.quality.score == "off":
        return None
    if not recipe.val_rows:
        pilot = Autopilot(spec, run.root, None, "no held-out conversations to score against (data.val_split is 0 "
                          "and there is no data.val_path)", log, run.event)
        pilot.start()
        return pilot
    examples = held_out_examples(conversations, spec.quality.examples)
    log(f"quality: {len(examples)} held-out conversation(s) answered per checkpoint, and the held-out loss")
    pilot = Autopilot(spec, run.root, llm_scoring(spec, run, lambda: recipe, examples, generate), None, log, run.event)
    pilot.start()
    return pilot
