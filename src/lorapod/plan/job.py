"""What a job is, before any GPU is chosen: its model, settings, steps and the bytes it moves.

Steps for images are images x repeats x epochs / batch (the guides' formula, rounded up per
epoch), so the planner needs the image count: it counts the image files under ``data.path``
when that folder exists, else takes ``images=`` (``--images N``), else assumes 25 and says so.
LLM jobs are sized in tokens: the training examples' tokens x epochs, counted from the JSONL files
when they exist as training reads them (``data.chat_split``: lines over the 4 MiB limit and bad
lines are not read, each example is cut at ``data.sequence_len``; about 4 characters per token),
else ``examples=`` (``--examples``) x 500 tokens. Without packing a micro-batch costs its rows
padded to the longest of them (plan/padding.py), replayed on the data's own lengths when they are
here, else assumed and said.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from lorapod.catalog.models import ImageModel, LLMArch, find_model
from lorapod.errors import DataError, LorapodError, PlanError
from lorapod.plan.padding import ASSUMED_PAD, PAD_MULTIPLE, PAD_MULTIPLE_MASK, padded_tokens
from lorapod.plan.vram import Estimate, Settings, estimate
from lorapod.spec import JobSpec

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
DEFAULT_IMAGES = 25
DEFAULT_EXAMPLES = 1000
DEFAULT_TOKENS_PER_EXAMPLE = 500
# Assumed sizes when the data is not on disk: a 1024+ px JPEG, a chat example as JSON.
IMAGE_MB = 3.0
EXAMPLE_KB = 2.0
DEFAULT_SAMPLE_PROMPTS = 2
DEFAULT_SAMPLE_STEPS = 28
#: Fewer optimizer steps than this and the plan says so: the guides' recipes train 90-2500 (SDXL
#: 25 x 10 x 8 = 2000, Wan 2500, a chat LoRA of 500-2000 examples x 3 epochs / 16 per step =
#: 90-375); a LoRA's B matrix starts at zero and moves once per optimizer step, so a few dozen
#: updates at the recipes' learning rates leave it close to the base model.
MIN_OPTIMIZER_STEPS = 50


@dataclass
class Job:
    spec: JobSpec
    model: ImageModel | LLMArch
    settings: Settings
    estimate: Estimate
    steps: int  # forward/backward passes (micro-batches): what a step time is measured per
    optimizer_steps: int = 0  # what every trainer's max_steps, save and sample intervals count
    images: int = 0
    examples: int = 0
    tokens: int = 0
    download_gb: float = 0.0
    upload_gb: float = 0.0
    pull_gb: float = 0.0
    checkpoints: int = 0
    samples: int = 0  # images or generations written while training
    warnings: list[str] = field(default_factory=list)
    #: LLM, unpacked: token positions per row of an average micro-batch, padding included
    #: (plan/padding.py); 0: a packed row of data.sequence_len
    row_tokens: float = 0.0

    @property
    def step_settings(self) -> Settings:
        """The settings an average micro-batch runs at: the spec's, with an unpacked job's rows at
        their padded length. The speed model prices a step with these; the VRAM peak keeps the
        spec's sequence_len (the longest batch may reach it)."""
        if not self.row_tokens:
            return self.settings
        return replace(self.settings, seq_len=max(1, round(self.row_tokens)))

    @property
    def steps_label(self) -> str:
        """The step count as users count it: optimizer steps, with the micro-batches that cost
        the time when gradients are accumulated ("700 steps (2800 micro-batches)")."""
        if self.optimizer_steps and self.optimizer_steps != self.steps:
            return f"{self.optimizer_steps} steps ({self.steps} micro-batches)"
        return f"{self.steps} steps"

    @property
    def is_image(self) -> bool:
        return isinstance(self.model, ImageModel)

    @property
    def model_name(self) -> str:
        return self.model.name


def _count_images(paths: list[Path]) -> tuple[int, int] | None:
    """(image files, bytes) under the folders that exist, by extension; None when none exists."""
    found = [p for p in paths if p.is_dir()]
    if not found:
        return None
    n, size = 0, 0
    for folder in found:
        for f in folder.rglob("*"):
            if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file():
                n += 1
                size += f.stat().st_size
    return n, size


_CHECKED: dict[tuple, tuple[int, int, list[str]]] = {}


def _checked_images(spec: JobSpec, paths: list[Path]) -> tuple[int, int, list[str]] | None:
    """(readable images, their bytes, what the data check says) for the folders that exist, as
    ``lorapod data check`` judges them with the spec's family and trigger (data/check.py): an image
    that does not decode is not trained on, so it is not counted, and the check's errors are said.
    Without Pillow (the core install) the files are counted by extension, and the plan says so.
    None when no folder exists. Cached per process by the folders' file names, sizes and times
    (``lorapod plan`` plans a pinned job twice: its own offers and the whole market)."""
    from lorapod.data.check import check_path, spec_check_args

    found = [p for p in paths if p.is_dir()]
    if not found:
        return None
    args = spec_check_args(spec)
    key = (tuple(sorted((str(f), s.st_size, s.st_mtime_ns) for p in found for f in p.rglob("*")
                        if (s := f.stat()) and f.is_file())), tuple(sorted((k, str(v)) for k, v in args.items())))
    if key in _CHECKED:
        return _CHECKED[key]
    n, size, notes = 0, 0, []
    for folder in found:
        try:
            report = check_path(folder, **args)
        except LorapodError as exc:
            files = _count_images([folder]) or (0, 0)
            n, size = n + files[0], size + files[1]
            notes.append(f"{folder}: images counted by name, not checked ({exc.message}; {exc.hint or ''})".rstrip("; "))
            continue
        infos = report.extra.get("infos", [])
        ok = [i for i in infos if i.ok]
        n += len(ok)
        size += sum((folder / i.rel).stat().st_size for i in ok if (folder / i.rel).is_file())
        errors = [f for f in report.findings if f.severity == "error"]
        if errors:
            unread = len(infos) - len(ok)
            notes.append(f"`lorapod data check {folder}` finds {len(errors)} error(s), first: {errors[0].path}: "
                         f"{errors[0].message.rstrip('.')}" + (f"; {unread} image(s) that do not decode are not counted"
                                                   if unread else ""))
    _CHECKED[key] = (n, size, notes)
    return _CHECKED[key]


@dataclass
class _Counted:
    examples: int  # usable conversations, training and validation
    train_examples: int
    train_tokens: int  # one epoch, each conversation cut at data.sequence_len
    data_bytes: int
    warnings: list[str]
    lengths: list[int] = field(default_factory=list)  # each training conversation's tokens, cut


def _count_examples(spec: JobSpec) -> _Counted | None:
    """The conversations training reads (``data.chat_split.load_split``: the same reader, line
    limit and validation split), counted as training keeps them (``trained_tokens``: cut at
    ``data.sequence_len``). None when no data file is here."""
    from lorapod.data.chat_split import load_split, trained_tokens

    files = [p for p in spec.data_paths() if p.is_file()]
    if not files:
        return None
    size = sum(f.stat().st_size for f in files)
    notes: list[str] = []
    lenient = spec.model_copy(update={"data": spec.data.model_copy(update={"skip_bad_examples": True})})
    try:
        split, _fmt = load_split(lenient, log=notes.append)
    except (DataError, OSError) as exc:
        msg = exc.message if isinstance(exc, DataError) else str(exc)
        return _Counted(0, 0, 0, size, [f"the data was not counted ({msg}): lorapod data check {files[0]}"])
    if notes and not spec.data.skip_bad_examples:
        notes = [f"{n}; not counted: training stops on them unless data.skip_bad_examples "
                 f"(lorapod data check {files[0]} lists them)" for n in notes]
    seq = spec.data.sequence_len
    lengths = [trained_tokens(c, seq) for c in split.train]
    cut = sum(1 for n in lengths if n == seq)
    if cut:
        notes.append(f"{cut} training example(s) reach data.sequence_len={seq} and are counted as cut there")
    return _Counted(len(split.train) + len(split.val), len(split.train), sum(lengths), size, notes, lengths)


def _unpacked_rows(spec: JobSpec, settings: Settings, lengths: list[int] | None) -> tuple[float, str]:
    """(token positions per row of an average micro-batch, the plan's note) for an unpacked job:
    replayed on the data's lengths (plan/padding.py), else the assumed example padded by
    :data:`ASSUMED_PAD`."""
    t = spec.train
    flash = t.attention == "flash"
    multiple = PAD_MULTIPLE_MASK if settings.attention == "mask" else PAD_MULTIPLE
    if lengths:
        total, batches = padded_tokens(lengths, t.micro_batch_size, t.epochs, t.seed, multiple, flash)
        row = total / (batches * t.micro_batch_size)
        real = sum(lengths) * max(1, t.epochs)
        pad = "" if flash else f", {max(0.0, 1 - real / total):.0%} of it padding"
        return row, ("data.packing is off: each micro-batch is its rows padded to the longest"
                     + (" (train.attention flash drops the padding)" if flash else "")
                     + f", about {row:,.0f} tokens a row{pad}, from the data's own lengths; packing would fill "
                     f"rows of {spec.data.sequence_len}")
    row = min(spec.data.sequence_len, round(DEFAULT_TOKENS_PER_EXAMPLE * (1.0 if flash else ASSUMED_PAD)))
    return float(row), (f"data.packing is off and the data is not here: each micro-batch assumed to be rows of "
                        f"{row} tokens (the assumed {DEFAULT_TOKENS_PER_EXAMPLE}-token example"
                        + ("" if flash else f", padded to its batch's longest: x{ASSUMED_PAD:g}")
                        + "); the time follows your examples' real lengths")


def _prompt_count(spec: JobSpec) -> int:
    p = spec.samples.prompts
    if isinstance(p, list):
        return len(p)
    if isinstance(p, str):
        path = Path(p)
        if path.is_file():
            return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        return 1
    return DEFAULT_SAMPLE_PROMPTS


def _held_out(spec: JobSpec, images: int) -> int:
    """Images the quality autopilot keeps out of training (quality/holdout.py; none with references in
    data.holdout_path or scoring off). Counted on all images: the planner does not read the captions
    that tell the subject from regularisation images."""
    from lorapod.quality.holdout import count

    if spec.quality.score == "off" or spec.data.holdout_path:
        return 0
    return count(spec.data.holdout, images)


def _saves(spec: JobSpec, every_epochs: int | None, every_steps: int | None, steps: int, epochs: int) -> int:
    if every_steps:
        return max(1, steps // every_steps)
    if every_epochs:
        return max(1, epochs // every_epochs)
    return 0


def _run_length_warnings(spec: JobSpec, job: Job, assumed: str) -> list[str]:
    """Too few optimizer steps, and intervals (eval, save, samples, warmup) the run never reaches.
    ``assumed`` names the guessed data size the counts rest on (empty when counted from the data)."""
    t, n, epochs = spec.train, job.optimizer_steps, spec.train.epochs
    run = f"{n} optimizer step{'s' if n != 1 else ''}" + (f" ({assumed})" if assumed else "")
    out = []
    if n < MIN_OPTIMIZER_STEPS:
        per = (f"{job.steps} micro-batch{'es' if job.steps != 1 else ''}"
               + (f" / train.grad_accum {t.grad_accum}" if t.grad_accum > 1 else ""))
        out.append(f"only {n} optimizer step{'s' if n != 1 else ''} ({per}{'; ' + assumed if assumed else ''}): the adapter is updated {n} time{'s' if n != 1 else ''}, where the guides' "
                   f"recipes train 90-2500 steps; more epochs or data, or a smaller train.grad_accum / "
                   "train.micro_batch_size")
    warm = t.warmup_steps or math.ceil(t.warmup_ratio * n)
    if warm >= n and n:
        out.append(f"the warmup ({warm} steps) covers the whole run of {run}: the learning rate never reaches "
                   f"train.learning_rate")
    end = "only the final adapter comes out"
    for name, every, per_epoch, what in (
        ("eval.every_steps", spec.eval.every_steps, False,
         "validation runs only before and after training, no curve to stop on"),
        ("save.every_steps", spec.save.every_steps, False, f"no checkpoint before the end: {end}, nothing to resume"),
        ("save.every_epochs", spec.save.every_epochs if not spec.save.every_steps else None, True,
         f"no checkpoint before the end: {end}, nothing to resume"),
        ("samples.every_steps", spec.samples.every_steps if spec.samples.prompts else None, False,
         "no samples while training"),
        ("samples.every_epochs", spec.samples.every_epochs if spec.samples.prompts else None, True,
         "no samples while training"),
    ):
        if every is None:
            continue
        if per_epoch and every > epochs:
            out.append(f"{name}={every} is more than the run's {epochs} epoch{'s' if epochs != 1 else ''}: {what}")
        elif not per_epoch and every > n:
            out.append(f"{name}={every} is longer than the run's {run}: {what}")
    return out


def _prediction_warnings(spec: JobSpec, family: str) -> list[str]:
    """The loud epsilon default for an SD 1.5/SDXL single file that does not say its objective."""
    from lorapod.errors import LorapodError
    from lorapod.prediction_type import DEFAULTED, expected, loud_default

    try:
        pred, why = expected(spec.model.id, family, spec.model.prediction_type)
    except LorapodError as exc:
        return [exc.message]
    return [loud_default(spec.model.id)] if pred == "epsilon" and why == DEFAULTED else []


def build_job(spec: JobSpec, *, images: int | None = None, examples: int | None = None) -> Job:
    """Resolve the model, read the data's size, and count steps. PlanError on impossible values."""
    _check(spec, images, examples)
    model = find_model(spec.model.id, spec.model.family, spec.model.variant)
    settings = Settings.from_spec(spec, model)
    est = estimate(model, settings)
    t = spec.train
    warnings: list[str] = []
    job = Job(spec, model, settings, est, steps=0)
    if isinstance(model, ImageModel):
        counted = _checked_images(spec, spec.data_paths()) if images is None else None
        if counted is not None:
            warnings.extend(counted[2])
        if counted is not None and counted[0] > 0:
            job.images, data_bytes = counted[0], counted[1]
        else:
            job.images = images if images is not None else DEFAULT_IMAGES
            data_bytes = int(job.images * IMAGE_MB * 1e6)
            if images is None:
                where = "not found" if counted is None else "holds no readable image"
                warnings.append(f"image count assumed {DEFAULT_IMAGES}: {spec.data.path} {where}; pass --images N")
        held = _held_out(spec, job.images)
        if held:  # counted as training images still: only the captions say which are the subject's
            warnings.append(f"up to {held} of the {job.images} images are held out of training as the quality "
                            f"autopilot's references (data.holdout: {spec.data.holdout}; docs/quality.md)")
        per_epoch = math.ceil(job.images * spec.data.repeats / t.micro_batch_size)
        job.steps = per_epoch * t.epochs
        job.download_gb = model.download_gb
        job.upload_gb = data_bytes / 1e9
        lora_bytes = model.lora_params_per_rank_m * 1e6 * settings.r * 2
        prompts = _prompt_count(spec)
    else:
        counted_ex = _count_examples(spec) if examples is None else None
        lengths: list[int] | None = None
        if counted_ex is not None and counted_ex.train_examples:
            lengths = counted_ex.lengths
            job.examples, train_examples = counted_ex.examples, counted_ex.train_examples
            job.tokens = counted_ex.train_tokens * t.epochs
            data_bytes = counted_ex.data_bytes
            warnings.extend(counted_ex.warnings)
        else:
            job.examples = examples if examples is not None else DEFAULT_EXAMPLES
            data_bytes = int(job.examples * EXAMPLE_KB * 1e3)
            warnings.extend(counted_ex.warnings if counted_ex is not None else [])
            warnings.append(
                f"{'example count assumed ' + str(DEFAULT_EXAMPLES) + ', ' if examples is None else ''}"
                f"{DEFAULT_TOKENS_PER_EXAMPLE} tokens per example assumed: the data file was not "
                + ("read" if counted_ex is not None else "found") + ("; pass --examples N" if examples is None else "")
            )
            train_examples = job.examples
            tokens_per_epoch = job.examples * DEFAULT_TOKENS_PER_EXAMPLE
            train_tokens = tokens_per_epoch * (1 - spec.data.val_split if not spec.data.val_path else 1)
            job.tokens = int(train_tokens * t.epochs)
        per_step = t.micro_batch_size * spec.data.sequence_len
        job.steps = max(1, math.ceil(job.tokens / per_step)) if spec.data.packing else max(
            1, math.ceil(train_examples / t.micro_batch_size)) * t.epochs
        if not spec.data.packing:
            job.row_tokens, note = _unpacked_rows(spec, settings, lengths)
            warnings.append(note)
        job.download_gb = model.params * 2 / 1e9
        job.upload_gb = data_bytes / 1e9
        lora_bytes = model.lora_params(settings.r, settings.targets) * 2
        prompts = _prompt_count(spec) if spec.samples.prompts else 0
    # The micro-batches are counted above; an optimizer step accumulates grad_accum of them, per
    # epoch (engine/loop.py: steps_per_epoch, as every trainer's progress bar counts). max_steps
    # and the save and sample intervals count optimizer steps.
    per_epoch_micro = max(1, job.steps // max(1, t.epochs))
    job.optimizer_steps = math.ceil(per_epoch_micro / t.grad_accum) * t.epochs
    if t.max_steps and t.max_steps < job.optimizer_steps:
        job.optimizer_steps = t.max_steps
        job.steps = min(job.steps, t.max_steps * t.grad_accum)
    job.samples = _saves(spec, spec.samples.every_epochs, spec.samples.every_steps, job.optimizer_steps,
                         t.epochs) * prompts
    job.checkpoints = _saves(spec, spec.save.every_epochs, spec.save.every_steps, job.optimizer_steps, t.epochs) or 1
    job.pull_gb = job.checkpoints * lora_bytes / 1e9
    assumed = ("with the assumed " + (f"{job.images} images" if job.is_image else f"{job.examples} examples")
               if any("assumed" in w for w in warnings) else "")
    warnings.extend(_run_length_warnings(spec, job, assumed))
    job.warnings = warnings
    if isinstance(model, ImageModel):
        job.warnings.extend(_prediction_warnings(spec, model.family))
    lic = model.license
    if lic.gated:
        job.warnings.append(f"{model.name} is gated on Hugging Face: accept its license on the hub and set HF_TOKEN")
    elif lic.gated is None:
        job.warnings.append(f"{model.name}: gating not in the catalog, check the model page")
    if not lic.commercial:
        job.warnings.append(f"license {lic.name}: weights and the LoRA are non-commercial")
    return job


def _check(spec: JobSpec, images: int | None, examples: int | None) -> None:
    """Refuse impossible numbers, naming the field, even if they bypassed the spec validation."""
    checks = {
        "train.micro_batch_size": spec.train.micro_batch_size,
        "train.epochs": spec.train.epochs,
        "train.grad_accum": spec.train.grad_accum,
        "data.repeats": spec.data.repeats,
        "method.r": spec.method.r,
    }
    for name, value in checks.items():
        if value is None or value < 1:
            raise PlanError(f"{name} = {value!r}: must be at least 1", hint=f"fix {name} in the spec or --set {name}=1")
    if images is not None and images < 1:
        raise PlanError(f"--images {images}: must be at least 1")
    if examples is not None and examples < 1:
        raise PlanError(f"--examples {examples}: must be at least 1")
