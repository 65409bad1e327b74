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


class _OnTheBase:
    """A second copy of the run's base model in the trainer runner's process, to score an external
    trainer's checkpoints on: loaded on first use, and only while the GPU has room for it beside the
    trainer (:meth:`room`); otherwise the checkpoints are scored once the trainer has ended."""

    def __init__(self, spec: JobSpec, device: str | None = None) -> None:
        self.spec, self.device, self.file = spec, device, None
        self.loaded = False

    def need_gb(self) -> float:
        """GPU memory the model takes: the catalog's download size (the weights in their dtype) and
        2 GiB of working memory; 12 GiB for a base the catalog does not know."""
        from lorapod.catalog.models import find_model
        from lorapod.errors import LorapodError

        try:
            return float(find_model(self.spec.model.id, self.spec.model.family, self.spec.model.variant).download_gb) + 2.0
        except (LorapodError, AttributeError):
            return 12.0

    def room(self) -> tuple[bool, str]:
        """(the model fits now, why not). Always on a machine without CUDA."""
        import torch

        if self.loaded or not torch.cuda.is_available() or (self.device or "").startswith("cpu"):
            return True, ""
        free = torch.cuda.mem_get_info()[0] / 2**30
        need = self.need_gb()
        return free >= need, f"{free:.1f} GiB free beside the trainer, the scoring model needs ~{need:.0f} GiB"

    def find(self, checkpoint: Path) -> Path | None:
        """The checkpoint's weights file, or None."""
        return lora_file(checkpoint)

    def use(self, file: Path) -> None:
        raise NotImplementedError


class LoraFiles(_OnTheBase):
    """An external trainer's LoRA files drawn with a diffusers pipeline of the run's base model
    (``load_lora_weights`` reads the kohya, ai-toolkit and diffusers layouts, and musubi-tuner's
    ``lora_unet_*`` Wan layout), one checkpoint at a time: the quality autopilot's ``render`` for
    image and video runs lorapod's engine does not train. A video model draws a short clip
    (:data:`~lorapod.engine.diffusion.video.SCORE_FRAMES` frames at most, as the engine's scoring)."""

    def __init__(self, spec: JobSpec, device: str | None = None) -> None:
        super().__init__(spec, device)
        self.pipe: Any = None
        self.family: Any = None
        self.start_image: Any = None  # an image-to-video pipeline's first frame (a training file's)

    def pipeline_id(self) -> str:
        """The diffusers folder or repository of the base: a musubi-tuner Wan run names the Wan-AI
        repository of the original weights, whose diffusers conversion is its ``-Diffusers`` twin."""
        mid = str(self.spec.model.id)
        if self.spec.is_video and mid.startswith("Wan-AI/") and not mid.endswith("-Diffusers"):
            return f"{mid}-Diffusers"
        return mid

    def load(self) -> None:
        import torch

        from lorapod.engine.diffusion.families import resolve_family

        if self.pipe is not None:
            return
        self.family = resolve_family(self.spec.model.family, self.spec.model.id, self.spec.model.revision)
        dev = torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        cls = self.family.pipeline_cls()
        if self.spec.is_video:  # text- or image-to-video, as the model's index says (as the engine loads it)
            import diffusers

            from lorapod.engine.diffusion.families.detect import detect

            cls = getattr(diffusers, str(detect(self.pipeline_id(), self.spec.model.revision)[1]), cls)
        self.pipe = cls.from_pretrained(self.pipeline_id(), revision=self.spec.model.revision, torch_dtype=dtype)
        if dev.type == "cuda" and torch.cuda.mem_get_info(dev)[0] / 2**30 < self.need_gb():
            self.pipe.enable_model_cpu_offload(device=dev)  # a 14B video model after training: a part at a time
        else:
            self.pipe.to(dev)
        self.pipe.set_progress_bar_config(disable=True)
        self.device = str(dev)
        self.loaded = True

    def use(self, file: Path) -> None:
        self.load()
        if self.file is not None:
            self.pipe.delete_adapters("checkpoint")
        self.pipe.load_lora_weights(str(file.parent), weight_name=file.name, adapter_name="checkpoint")
        self.file = file

    def frames(self) -> int:
        """Frames of a scoring clip: the longest trained window up to the engine's scoring length."""
        from lorapod.engine.diffusion.video import SCORE_FRAMES

        fit = [f for f in self.spec.data.target_frames if f <= SCORE_FRAMES]
        return max(fit) if fit else 1

    def render(self, sp: ScorePrompt, strength: float) -> list[Any]:
        import torch

        if strength == 0.0:
            self.pipe.disable_lora()
        else:
            self.pipe.enable_lora()
            self.pipe.set_adapters(["checkpoint"], adapter_weights=[float(strength)])
        kw: dict[str, Any] = {"prompt": sp.prompt, "num_inference_steps": sp.steps, "guidance_scale": sp.scale,
                              "width": sp.width, "height": sp.height,
                              "generator": torch.Generator(device="cpu").manual_seed(sp.seed)}
        if sp.negative and self.family.name in ("sd15", "sdxl"):
            kw["negative_prompt"] = sp.negative
        with torch.no_grad():
            if not self.spec.is_video:
                return [self.pipe(**kw, output_type="pil").images[0]]
            import numpy as np
            from PIL import Image

            if "ImageToVideo" in type(self.pipe).__name__ and self.start_image is not None:
                kw["image"] = self.start_image
            clip = self.pipe(**kw, num_frames=self.frames(), output_type="np").frames[0]
        arr = (np.clip(clip, 0, 1) * 255).round().astype(np.uint8)
        return [Image.fromarray(f) for f in arr]


class AdapterFiles(_OnTheBase):
    """An external LLM trainer's checkpoints (axolotl's: the Hugging Face Trainer's ``checkpoint-N``
    folder, PEFT's ``adapter_model.safetensors`` and ``adapter_config.json`` in it) loaded into
    lorapod's own LLM recipe of the run's base (engine/llm.py ``prepare``: the same model, LoRA
    and held-out rows as a lorapod run of the spec), one at a time: what the autopilot's held-out
    loss and answers are measured on."""

    def __init__(self, spec: JobSpec, device: str | None = None) -> None:
        super().__init__(spec, device)
        self.recipe: Any = None

    def find(self, checkpoint: Path) -> Path | None:
        f = Path(checkpoint) / "adapter_model.safetensors"
        return f if f.is_file() and not f.is_symlink() else None

    def load(self) -> Any:
        if self.recipe is None:
            from lorapod.engine.llm import prepare

            self.recipe, _stats, _fallback = prepare(self.spec, self.device, log=lambda m: None)
            self.loaded = True
        return self.recipe

    def use(self, file: Path) -> None:
        from safetensors.torch import load_file

        recipe = self.load()
        load_peft_adapter(recipe, load_file(str(file)), file, peft_adapter_config(file.parent))
        self.file = file


def peft_adapter_config(folder: Path) -> dict[str, Any] | None:
    import json

    try:
        raw = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8")[: 1 << 20])
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def load_peft_adapter(recipe: Any, state: dict[str, Any], source: Path, config: dict[str, Any] | None = None) -> None:
    """Put a PEFT adapter another trainer saved (``save_pretrained``'s keys, as lorapod's own
    ``adapter_state``) into ``recipe``'s model. Refused, with the reason, when it is not this run's
    LoRA: another rank or scaling (``adapter_config.json``), keys the model's LoRA does not have, or
    other shapes. Modules the file does not adapt get a zero ``lora_B`` (they change nothing), so
    nothing of the checkpoint loaded before stays in them."""
    import torch

    m = recipe.spec.method
    if config is not None:
        want = {"r": m.r, "lora_alpha": m.alpha, "use_rslora": bool(m.rslora)}
        got = {"r": config.get("r"), "lora_alpha": config.get("lora_alpha"), "use_rslora": bool(config.get("use_rslora"))}
        if any(got[k] != want[k] and not (isinstance(got[k], int | float) and float(got[k]) == float(want[k]))
               for k in want):
            raise ValueError(f"{source.parent / 'adapter_config.json'} says {got}, the run's spec {want}: not this "
                             "run's LoRA")
    mine = recipe.adapter_state()
    extra = sorted(set(state) - set(mine))
    if extra:
        raise ValueError(f"{source}: {len(extra)} adapter key(s) the run's LoRA does not have (e.g. {extra[0]}): "
                         "trained with other target modules or another model")
    bad = [k for k in state if tuple(state[k].shape) != tuple(mine[k].shape)]
    if bad:
        raise ValueError(f"{source}: {bad[0]} is {tuple(state[bad[0]].shape)}, the run's LoRA has "
                         f"{tuple(mine[bad[0]].shape)}")
    full = {k: (state[k] if k in state else torch.zeros_like(v) if ".lora_B." in k else v) for k, v in mine.items()}
    recipe.load_adapter_state(full)


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

    def __init__(self, build: Callable[[], tuple[Autopilot, _OnTheBase | None]]) -> None:
        self._build = build
        self.pilot: Autopilot | None = None
        self.files: _OnTheBase | None = None
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
        file = self.files.find(Path(run_dir) / "checkpoints" / key)
        if file is None:
            return None
        ok, why = self.files.room()
        if not ok and not final:
            if not self.waiting:
                pilot.log(f"quality: {key} is scored after training ({why})")
            self.waiting.append((key, step))
            return None
        try:
            self.files.use(file)
            return pilot.on_checkpoint(step, total_steps if total_steps is not None else step, metrics, label=key)
        except Exception as exc:  # not this run's LoRA, a broken file, the base not loading, OOM: never the run's end
            pilot.fail(step, exc)
            return None

    def finish(self, run_dir: Path, metrics: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Score what waited for the GPU, now that the trainer has ended (a pick, no stop)."""
        for key, step in self.waiting:
            self.on_checkpoint(run_dir, key, step, None, metrics, final=True)
        self.waiting = []


def external_autopilot(spec: JobSpec, run_dir: Path, log: Callable[[str], None]) -> ExternalJudge | None:
    """The judge of an external trainer's run; None when quality.score is off. Image runs: the
    trainer's LoRA files on a diffusers pipeline of the base (:class:`LoraFiles`); LLM runs: its
    PEFT adapters in lorapod's own LLM recipe (:class:`AdapterFiles`)."""
    if spec.quality.score == "off":
        return None
    return ExternalJudge(lambda: _external(spec, Path(run_dir), log))


def _external_llm(spec: JobSpec, run: RunDir, log: Callable[[str], None]) -> tuple[Autopilot, _OnTheBase | None]:
    """An external LLM trainer's run (axolotl) scored as lorapod's engine scores its own: held-out loss
    and answers against the base. Held out means the trainer never saw it: ``data.val_path`` (its
    ``test_datasets``); a ``data.val_split`` is drawn by the trainer itself (axolotl's
    ``val_set_size``), not the rows lorapod would hold out, so it is not scored against."""
    def off(why: str) -> tuple[Autopilot, None]:
        pilot = Autopilot(spec, run.root, None, why, log, run.event)
        pilot.start()
        return pilot, None

    if not spec.data.val_path:
        return off("an external trainer draws its own validation split (data.val_split), so lorapod cannot tell "
                   "which conversations it never trained on: give them in data.val_path to score its checkpoints")
    from lorapod.engine.llm import generate_many, load_split

    split, _fmt = load_split(spec, log=lambda m: None)
    examples = held_out_examples(split.val, spec.quality.examples)
    if not examples:
        return off(f"no held-out conversation with a user turn and a reply in data.val_path {spec.data.val_path}")
    files = AdapterFiles(spec)
    log(f"quality: {len(examples)} held-out conversation(s) from data.val_path answered per checkpoint, and the "
        "held-out loss, on the trainer's adapter loaded into lorapod's own model of the base")
    pilot = Autopilot(spec, run.root, llm_scoring(spec, run, files.load, examples, generate_many), None, log, run.event)
    pilot.start()
    return pilot, files


def _external(spec: JobSpec, run_dir: Path, log: Callable[[str], None]) -> tuple[Autopilot, _OnTheBase | None]:
    run = RunDir(Path(run_dir))
    if not spec.is_image:
        return _external_llm(spec, run, log)
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
    read, exts = _open, {".png", ".jpg", ".jpeg", ".webp"}
    if spec.is_video:  # a clip is scored by its frames, hashed by its first
        from lorapod.data.clips import VIDEO_EXTS
        from lorapod.engine.diffusion.video import VideoRecipe

        read, exts = VideoRecipe.reference_frames, exts | {e.lower() for e in VIDEO_EXTS}
    refs = [read(p) for p in held.held]
    scorers.settle_face(refs, spec.quality.face)
    training = []
    captions = []
    for root in spec.data_paths():
        for p in sorted(Path(root).rglob("*")):
            if p.suffix.lower() in exts and len(training) < MAX_TRAIN_HASHED:
                try:
                    training.append(read(p))
                except Exception:  # an unreadable file: the trainer's own check says what is wrong with it
                    continue
                cap = p.with_suffix(spec.data.caption_extension if spec.data.caption_extension.startswith(".")
                                    else "." + spec.data.caption_extension)
                if cap.is_file():
                    captions.append(cap.read_text(encoding="utf-8", errors="replace").strip())
    fam = spec.model.family if spec.model.family in families.FAMILIES else "sdxl"
    prompts = image_prompts(spec, captions, families.facts(fam).guidance)
    off = None if refs else f"no held-out reference images to score subject fidelity against: {held.why}"
    lora.start_image = training[0] if training else None
    pilot = Autopilot(spec, run.root, ImageScoring(run.root, scorers, prompts, spec.quality.strengths, refs, training,
                                                  lora.render), off, log, run.event)
    pilot.start()
    return pilot, lora
