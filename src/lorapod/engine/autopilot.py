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


def _open(path: Path) -> Any:
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
    read = reference_frames or _open
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


def llm_autopilot(spec: JobSpec, run: RunDir, recipe: Any, log: Callable[[str], None],
                  conversations: Sequence[list[dict[str, Any]]], generate: Callable[..., str]) -> Autopilot | None:
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
    examples: list[tuple[list[dict[str, Any]], str]] = []
    for conv in conversations:
        i = next((k for k, m in enumerate(conv) if m.get("role") == "user"), None)
        if i is None:
            continue
        reply = next((m for m in conv[i + 1:] if m.get("role") == "assistant"), None)
        if reply is not None and isinstance(reply.get("content"), str):
            examples.append((conv[: i + 1], reply["content"]))
        if len(examples) >= spec.quality.examples:
            break
    model, q = recipe.model, spec.quality

    def evaluate(adapter: bool) -> float | None:
        if adapter:
            ev = recipe.evaluate()
        else:
            with model.disable_adapter():
                ev = recipe.evaluate()
        recipe.train()
        return ev.get("val_loss")

    def answer(conversations: list[list[dict[str, Any]]], adapter: bool) -> list[str]:
        return generate(model, recipe.tokenizer, conversations, q.max_new_tokens, use_adapter=adapter)

    log(f"quality: {len(examples)} held-out conversation(s) answered per checkpoint, and the held-out loss")
    pilot = Autopilot(spec, run.root, LLMScoring(run.root, evaluate, answer, examples), None, log, run.event)
    pilot.start()
    return pilot


class LoraFiles:
    """An external trainer's LoRA files drawn with a diffusers pipeline of the run's base model
    (``load_lora_weights`` reads the kohya, ai-toolkit and diffusers layouts), one checkpoint at a
    time, in the trainer runner's process: the quality autopilot's ``render`` for runs lorapod's
    engine does not train. The pipeline loads on first use, and only while the GPU has room for it
    beside the trainer (:meth:`room`); otherwise the checkpoint is scored once the trainer has ended."""

    def __init__(self, spec: JobSpec, device: str | None = None) -> None:
        self.spec, self.pipe, self.device, self.file = spec, None, device, None
        self.family: Any = None

    def need_gb(self) -> float:
        """GPU memory the pipeline takes: the catalog's download size (the weights in their dtype) and
        2 GiB of working memory; 12 GiB for a base the catalog does not know."""
        from lorapod.catalog.models import find_model
        from lorapod.errors import LorapodError

        try:
            return float(find_model(self.spec.model.id, self.spec.model.family, self.spec.model.variant).download_gb) + 2.0
        except (LorapodError, AttributeError):
            return 12.0

    def room(self) -> tuple[bool, str]:
        """(the pipeline fits now, why not). Always on a machine without CUDA."""
        import torch

        if self.pipe is not None or not torch.cuda.is_available() or (self.device or "").startswith("cpu"):
            return True, ""
        free = torch.cuda.mem_get_info()[0] / 2**30
        need = self.need_gb()
        return free >= need, f"{free:.1f} GiB free beside the trainer, the scoring pipeline needs ~{need:.0f} GiB"

    def load(self) -> None:
        import torch

        from lorapod.engine.diffusion.families import resolve_family

        if self.pipe is not None:
            return
        self.family = resolve_family(self.spec.model.family, self.spec.model.id, self.spec.model.revision)
        dev = torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        self.pipe = self.family.pipeline_cls().from_pretrained(str(self.spec.model.id), revision=self.spec.model.revision,
                                                                torch_dtype=dtype).to(dev)
        self.pipe.set_progress_bar_config(disable=True)
        self.device = str(dev)

    def use(self, file: Path) -> None:
        self.load()
        if self.file is not None:
            self.pipe.delete_adapters("checkpoint")
        self.pipe.load_lora_weights(str(file.parent), weight_name=file.name, adapter_name="checkpoint")
        self.file = file

    def render(self, sp: ScorePrompt, strength: float) -> list[Any]:
        import torch

        if strength == 0.0:
            self.pipe.disable_lora()
        else:
            self.pipe.enable_lora()
            self.pipe.set_adapters(["checkpoint"], adapter_weights=[float(strength)])
        kw = {"prompt": sp.prompt, "num_inference_steps": sp.steps, "guidance_scale": sp.scale, "width": sp.width,
              "height": sp.height, "generator": torch.Generator(device="cpu").manual_seed(sp.seed), "output_type": "pil"}
        if sp.negative and self.family.name in ("sd15", "sdxl"):
            kw["negative_prompt"] = sp.negative
        with torch.no_grad():
            return [self.pipe(**kw).images[0]]


def lora_file(checkpoint: Path) -> Path | None:
    """The LoRA file an external trainer saved in a mirrored checkpoint folder (its top level; the
    trainer's state folder beside it is not one)."""
    files = sorted(p for p in Path(checkpoint).glob("*.safetensors") if p.is_file() and not p.is_symlink())
    return files[0] if files else None


class ExternalJudge:
    """The quality autopilot of an external trainer's run (trainers/runner.py calls it as each
    checkpoint is mirrored): scores now when the GPU has room beside the trainer, else once the
    trainer has ended (:meth:`finish`), so every checkpoint gets scores before the pull. The scorers
    load at the first checkpoint (``build``), so the trainer's start never waits for them."""

    def __init__(self, build: Callable[[], tuple[Autopilot, LoraFiles | None]]) -> None:
        self._build = build
        self.pilot: Autopilot | None = None
        self.files: LoraFiles | None = None
        self.waiting: list[tuple[str, int]] = []

    def ready(self) -> Autopilot:
        if self.pilot is None:
            self.pilot, self.files = self._build()
        return self.pilot

    def keep(self) -> set[str]:
        return self.pilot.keep() if self.pilot is not None else set()

    def on_checkpoint(self, run_dir: Path, key: str, step: int, total_steps: int | None,
                      metrics: Callable[[dict[str, Any]], None] | None = None, final: bool = False) -> str | None:
        pilot = self.ready()
        if self.files is None or pilot.scoring is None:
            return None
        file = lora_file(Path(run_dir) / "checkpoints" / key)
        if file is None:
            return None
        ok, why = self.files.room()
        if not ok and not final:
            if not self.waiting:
                pilot.log(f"quality: {key} is scored after training ({why})")
            self.waiting.append((key, step))
            return None
        self.files.use(file)
        return pilot.on_checkpoint(step, total_steps if total_steps is not None else step, metrics, label=key)

    def finish(self, run_dir: Path, metrics: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Score what waited for the GPU, now that the trainer has ended (a pick, no stop)."""
        for key, step in self.waiting:
            self.on_checkpoint(run_dir, key, step, None, metrics, final=True)
        self.waiting = []


def external_autopilot(spec: JobSpec, run_dir: Path, log: Callable[[str], None]) -> ExternalJudge | None:
    """The judge of an external trainer's run; None when quality.score is off. Image families only:
    an LLM trainer's (axolotl's) checkpoints are scored after training by `lorapod eval`."""
    if spec.quality.score == "off":
        return None
    return ExternalJudge(lambda: _external(spec, Path(run_dir), log))


def _external(spec: JobSpec, run_dir: Path, log: Callable[[str], None]) -> tuple[Autopilot, LoraFiles | None]:
    run = RunDir(Path(run_dir))
    if not spec.is_image or spec.is_video:
        pilot = Autopilot(spec, run.root, None, "an external trainer's LLM or video checkpoints are scored after "
                          "training, by `lorapod eval` (this run is not scored while it trains)", log, run.event)
        pilot.start()
        return pilot, None
    from lorapod.quality.scorers import load

    scorers = load(spec.quality, log)
    for note in scorers.notes:
        log(f"quality: {note}")
    if not scorers.any_image:
        pilot = Autopilot(spec, run.root, None, "no scorer model loaded (" + "; ".join(scorers.notes) + ")", log,
                          run.event)
        pilot.start()
        return pilot, None
    from lorapod.catalog import families

    lora = LoraFiles(spec)
    # an external trainer trains on the whole folder: the references are data.holdout_path's only
    held = split([], "auto", spec.data.trigger, spec.data.holdout_path) if spec.data.holdout_path else Holdout(
        [], set(), "an external trainer trains on every image of data.path: give references the run does not "
                   "train on in data.holdout_path to score subject fidelity")
    refs = [_open(p) for p in held.held]
    scorers.settle_face(refs, spec.quality.face)
    training = []
    captions = []
    for root in spec.data_paths():
        for p in sorted(Path(root).rglob("*")):
            if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp") and len(training) < MAX_TRAIN_HASHED:
                try:
                    training.append(_open(p))
                except OSError:  # the trainer's own check says what is wrong with it
                    continue
                cap = p.with_suffix(spec.data.caption_extension if spec.data.caption_extension.startswith(".")
                                    else "." + spec.data.caption_extension)
                if cap.is_file():
                    captions.append(cap.read_text(encoding="utf-8", errors="replace").strip())
    fam = spec.model.family if spec.model.family in families.FAMILIES else "sdxl"
    prompts = image_prompts(spec, captions, families.facts(fam).guidance)
    off = None if refs else f"no held-out reference images to score subject fidelity against: {held.why}"
    pilot = Autopilot(spec, run.root, ImageScoring(run.root, scorers, prompts, spec.quality.strengths, refs, training,
                                                  lora.render), off, log, run.event)
    pilot.start()
    return pilot, lora
