"""``lorapod eval RUN --prompts FILE`` for image runs: grids to pick a checkpoint and a strength.

For every prompt: one grid, rows = the base model and each checkpoint, columns = LoRA strengths,
every cell from the same seed, so only the LoRA differs. Prompts with the trigger word test the
concept and its flexibility (scenes not in the data); prompts without it are leakage prompts: the
LoRA should leave them as the base draws them, and the page says how far each checkpoint moved
them (mean pixel difference to the base image, same seed). With a local CLIP model (``--clip``)
the page adds CLIP scores: prompt adherence, similarity to the training images (over-fitting) and
similarity to the base image (leakage); without one it says so and shows the grids alone.

Either way it recommends a checkpoint (:func:`recommend`): the lowest loss the run logged at the
checkpoints' steps (the fixed-noise validation loss when the run evaluated there, else the
training curve just before each checkpoint), the earliest one within the noise of the lowest, or
says why it cannot.
"""

from __future__ import annotations

import html
import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from lorapod.errors import DataError, ExportError
from lorapod.fsutil import atomic_write_text
from lorapod.rundir.layout import checkpoint_step


@dataclass
class Cell:
    row: str  # 'base' or 'step-N'
    strength: float
    image: str  # path relative to the eval folder
    leakage: float | None = None  # mean |pixel - base pixel| / 255, leakage prompts only
    clip_text: float | None = None
    clip_train: float | None = None
    clip_base: float | None = None


@dataclass
class PromptGrid:
    prompt: str
    seed: int
    leakage_prompt: bool
    grid: str
    cells: list[Cell] = field(default_factory=list)


@dataclass
class ImageEval:
    grids: list[PromptGrid]
    strengths: list[float]
    clip: str | None
    page: str = ""
    checkpoints_note: str = ""  # which checkpoints are on disk, and why not more
    best: str | None = None  # the recommended checkpoint ('step-N'), None when nothing says which
    reason: str = ""  # why that one, or why none
    strength: float | None = None  # the recommended strength (the quality autopilot's pick)
    quality: dict = field(default_factory=dict)  # the autopilot's decision (quality/pick.json)


#: losses within this fraction of the lowest are the same loss: diffusion losses are noisy
NOISE = 0.02


def _losses(metrics: Path) -> tuple[dict[int, float], dict[int, float]]:
    """(validation loss by step, training loss by step) from metrics.jsonl; the last record of a
    step wins (a resumed run logs its steps again)."""
    val: dict[int, float] = {}
    train: dict[int, float] = {}
    try:
        lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return val, train
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            continue
        v = rec.get("fixed_noise_loss", rec.get("val_loss")) if rec.get("event") == "eval" else None
        if isinstance(v, (int, float)):
            val[rec["step"]] = float(v)
        elif isinstance(rec.get("loss"), (int, float)) and "event" not in rec:
            train[rec["step"]] = float(rec["loss"])
    return val, train


def recommend(metrics: Path, labels: list[str], leakage: dict[str, float] | None = None) -> tuple[str | None, str]:
    """Which checkpoint to keep, and why, from the run's logged losses: the fixed-noise validation
    loss at each checkpoint's step when every checkpoint has one, else the mean training loss over
    the steps just before each (half the smallest gap between checkpoints). The earliest checkpoint
    within ``NOISE`` of the lowest wins: later ones add steps (and leakage), not fit. ``leakage``:
    the mean leakage of each checkpoint at full strength, said beside the choice."""
    steps = {lb: s for lb in labels if (s := checkpoint_step(lb)) is not None}
    if not steps:
        return None, "no checkpoint on disk"
    val, train = _losses(metrics)
    if all(st in val for st in steps.values()):
        loss, what = {lb: val[st] for lb, st in steps.items()}, "fixed-noise validation loss"
    else:
        ordered = sorted(steps.values())
        gaps = [b - a for a, b in zip([0, *ordered], ordered, strict=False)]
        k = max(1, min(gaps) // 2)
        loss = {}
        for lb, st in steps.items():
            window = [train[s] for s in range(st - k + 1, st + 1) if s in train]
            if window:
                loss[lb] = sum(window) / len(window)
        what = f"training loss, mean of the {k} step(s) before each checkpoint"
        if not loss:
            return None, ("no loss logged at the checkpoints' steps in metrics.jsonl (was it pulled?): "
                          "pick from the grids, or give --clip for scores")
    order = sorted(loss, key=lambda lb: steps[lb])
    low = min(loss.values())
    best = next(lb for lb in order if loss[lb] <= low * (1 + NOISE))
    shown = ", ".join(f"{lb} {loss[lb]:.4f}" for lb in order)
    why = f"{what}: {shown}"
    later = [lb for lb in order if steps[lb] > steps[best]]
    if not later:
        first = loss[order[0]]
        why += ("; it is the last checkpoint and the loss still fell by "
                f"{100 * (first - low) / first:.0f}% since {order[0]}: more training may still help"
                if len(order) > 1 and low < first * (1 - NOISE) else "; it is the last checkpoint")
    elif loss[later[-1]] > loss[best] * (1 + NOISE):
        why += f"; the loss turned up after it (to {loss[later[-1]]:.4f} at {later[-1]}): later checkpoints over-fit"
    else:
        why += f"; the later ones are within {100 * NOISE:.0f}% of it: more steps, no better fit"
    if leakage and best in leakage:
        why += f"; leakage at full strength {leakage[best]:.3f} (0 = the base's image)"
    return best, why


def _prompts(path: Path | None, spec, steps: int, seed: int, scale: float):
    from lorapod.engine.diffusion.samples import load_prompts

    res = spec.data.resolution
    if path is not None:
        if not Path(path).is_file():
            raise DataError(f"{path} does not exist", hint="one prompt per line (sd-scripts --w/--h/--d/--s/--l options allowed)")
        return load_prompts(str(path), res, res, seed, steps, scale)
    got = load_prompts(spec.samples.prompts, res, res, seed, steps, scale)
    if not got:
        raise DataError("no prompts to evaluate with", hint="pass --prompts FILE (one per line), e.g. with the trigger "
                                                            "in new scenes and a few prompts without it (leakage)")
    return got


#: the base row's label in a grid: the model without the LoRA, repeated across the strength columns
BASE_ROW = "base (no LoRA)"


def evaluate_images(run_path: str | Path, prompts: Path | None = None, strengths: tuple[float, ...] = (0.6, 0.8, 1.0),
                    steps: int = 20, seed: int = 0, clip: Path | None = None, device: str | None = None,
                    log=print, dino: str | None = None, score: bool = True) -> ImageEval:
    from lorapod.catalog import families
    from lorapod.engine.diffusion import quiet
    from lorapod.engine.diffusion.samples import grid, labelled_grid
    from lorapod.export.image import family_of, write_diffusers
    from lorapod.export.source import checkpoints, open_source

    quiet()
    src = open_source(run_path, None)
    spec, run = src.spec, src.run
    steps_dirs = checkpoints(run)
    if not steps_dirs:
        raise ExportError(f"{run.root} has no checkpoint to evaluate", hint="train first, or pull the run's checkpoints")
    fam = family_of(src)
    if families.facts(fam.name).is_video:  # Wan: a video pipeline, no image grid (cli/eval.py says so first)
        raise ExportError(f"{run.root} is a {fam.name} run: image eval grids are for SD 1.5, SDXL and FLUX",
                          hint=f"compare the sample clips in {run.samples}")
    sps = _prompts(prompts, spec, steps, seed, families.facts(fam.name).guidance)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pipe = fam.pipeline_cls().from_pretrained(str(spec.model.id)).to(dev)
    pipe.set_progress_bar_config(disable=True)
    labels = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in steps_dirs:
            ck = open_source(run_path, checkpoint_step(p.name))
            folder = Path(tmp) / ck.label
            folder.mkdir()
            write_diffusers(ck, folder)
            pipe.load_lora_weights(str(folder), weight_name="pytorch_lora_weights.safetensors",
                                   adapter_name=ck.label.replace("-", "_"))
            labels.append(ck.label)
    scorer = _Clip(clip, spec, dev) if clip else None
    out = run.root / "eval" / "images"
    out.mkdir(parents=True, exist_ok=True)
    trigger = (spec.data.trigger or "").strip()
    grids = []
    for i, sp in enumerate(sps):
        leak = bool(trigger) and trigger not in sp.prompt
        rows = [("base", [0.0])] + [(lb, list(strengths)) for lb in labels]
        images, cells, base_img = [], [], None
        for row, strs in rows:
            for s in strs:
                if row == "base":
                    pipe.disable_lora()
                else:
                    pipe.enable_lora()
                    pipe.set_adapters([row.replace("-", "_")], adapter_weights=[s])
                img = _render(pipe, sp, fam, dev)
                name = f"{i:02d}-{row}-{s:.2f}.png"
                img.save(out / name)
                cell = Cell(row, s, f"images/{name}")
                if row == "base":
                    base_img = img
                elif leak:
                    cell.leakage = _pixel_diff(img, base_img)
                if scorer:
                    scorer.score(cell, img, sp.prompt, base_img if row != "base" else None)
                cells.append(cell)
                images.append(img)
            if row == "base":  # strength does not apply: the same image in every column, as an XY plot's
                images += [base_img] * (len(strengths) - 1)  # "no LoRA" row, not one image under "0.6"
        gname = f"images/{i:02d}-grid.png"
        labelled_grid(grid(images, cols=len(strengths)), [BASE_ROW if r == "base" else r for r, _ in rows],
                      [f"{s:g}" for s in strengths],
                      f"{sp.prompt}  |  seed {sp.seed}, {sp.steps} steps", corner="strength").save(run.root / "eval" / gname)
        grids.append(PromptGrid(sp.prompt, sp.seed, leak, gname, cells))
        log(f"prompt {i}: {sp.prompt!r}{' (leakage)' if leak else ''}: {len(cells)} images")
    full = max(strengths)
    leaks: dict[str, list[float]] = {}
    for g in grids:
        for c in g.cells:
            if c.leakage is not None and c.strength == full:
                leaks.setdefault(c.row, []).append(c.leakage)
    decision: dict = {}
    if score:  # the quality autopilot's scores: those made while training, the rest now
        from lorapod.evaluate.quality import score_images

        def activate(label: str | None, s: float) -> None:
            if label is None:
                pipe.disable_lora()
            else:
                pipe.enable_lora()
                pipe.set_adapters([label.replace("-", "_")], adapter_weights=[s])

        decision = score_images(spec, run, fam.name, labels, activate, lambda sp: _render(pipe, sp, fam, dev),
                                str(clip) if clip else None, dino, log)
    strength = None
    if decision.get("checkpoint") in labels:
        best, strength = decision["checkpoint"], decision.get("strength")
        reason = f"quality autopilot: {decision.get('reason')}"
    else:
        best, reason = recommend(run.metrics_file, labels, {k: sum(v) / len(v) for k, v in leaks.items()})
        if decision.get("reason"):  # the loss's recommendation first, then why the autopilot made none
            reason += f"; the quality autopilot picks none: {decision['reason']}"
    log(f"recommended: {best}{f' at strength {strength:g}' if strength else ''} ({reason})" if best
        else f"no checkpoint recommended: {reason}")
    keep = spec.save.keep_last
    note = (f"checkpoints: {', '.join(labels)} (all that are on disk"
            + (f"; save.keep_last: {keep} keeps only the newest {keep}, older ones were removed while training)"
               if keep and len(labels) >= keep else ")"))
    result = ImageEval(grids, list(strengths), str(clip) if clip else None, checkpoints_note=note, best=best,
                       reason=reason, strength=strength, quality=decision)
    atomic_write_text(run.root / "eval" / "images.json", json.dumps(asdict(result), indent=2))
    atomic_write_text(run.root / "eval" / "images.html", page(result, run.root.name))
    result.page = str(run.root / "eval" / "images.html")
    run.event(f"eval: {len(grids)} image grid(s) in {run.root / 'eval'}")
    return result


def _render(pipe, sp, fam, dev):
    gen = torch.Generator(device="cpu").manual_seed(sp.seed)
    kw = {"prompt": sp.prompt, "num_inference_steps": sp.steps, "guidance_scale": sp.scale, "width": sp.width,
          "height": sp.height, "generator": gen, "output_type": "pil"}
    if sp.negative and fam.name in ("sd15", "sdxl"):
        kw["negative_prompt"] = sp.negative
    with torch.no_grad():
        return pipe(**kw).images[0]


def _pixel_diff(a, b) -> float:
    import numpy as np

    return float(np.abs(np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)).mean() / 255.0)


class _Clip:
    """CLIP scores from a local CLIP model folder (transformers CLIPModel)."""

    def __init__(self, path: Path, spec, dev) -> None:
        from transformers import CLIPModel, CLIPProcessor

        try:
            self.model = CLIPModel.from_pretrained(str(path)).to(dev).eval()
            self.proc = CLIPProcessor.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise DataError(f"could not load a CLIP model from {path}: {exc}",
                            hint="pass a local folder with a transformers CLIPModel (e.g. openai/clip-vit-base-patch32)") from exc
        self.dev = dev
        self.train = self._images(_training_images(spec))

    @torch.no_grad()
    def _images(self, imgs) -> torch.Tensor | None:
        if not imgs:
            return None
        px = self.proc(images=imgs, return_tensors="pt")["pixel_values"].to(self.dev)
        return torch.nn.functional.normalize(_features(self.model.get_image_features(pixel_values=px)), dim=-1)

    @torch.no_grad()
    def score(self, cell: Cell, img, prompt: str, base) -> None:
        e = self._images([img])
        t = self.proc(text=[prompt], return_tensors="pt", padding=True, truncation=True).to(self.dev)
        te = torch.nn.functional.normalize(_features(self.model.get_text_features(**t)), dim=-1)
        cell.clip_text = float(e @ te.T)
        if self.train is not None:
            cell.clip_train = float((e @ self.train.T).mean())
        if base is not None:
            cell.clip_base = float(e @ self._images([base]).T)


def _features(out) -> torch.Tensor:
    """transformers 4.x returns the projected features; 5.x an output whose pooler_output holds them."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _training_images(spec, limit: int = 16):
    from PIL import Image

    exts = {".png", ".jpg", ".jpeg", ".webp"}
    out = []
    for root in spec.data_paths():
        for p in sorted(Path(root).rglob("*")):
            if p.suffix.lower() in exts and len(out) < limit:
                out.append(Image.open(p).convert("RGB"))
    return out


def _cell(v, fmt: str) -> str:
    return fmt.format(v) if isinstance(v, int | float) else "-"


def quality_table(decision: dict) -> str:
    """The autopilot's score per checkpoint (its best strength), the pick in bold, as HTML."""
    esc = html.escape
    rows = decision.get("table") or []
    if not rows:
        return ""
    out = ["<table><tr><th>checkpoint</th><th>score (vs base)</th><th>± se</th><th>strength</th><th>copies</th></tr>"]
    for t in rows:
        b = t.get("best") or {}
        bold = t.get("checkpoint") == decision.get("checkpoint")
        out.append(f"<tr{' style=font-weight:bold' if bold else ''}><td>{esc(str(t.get('checkpoint')))}</td>"
                   f"<td>{_cell(b.get('score'), '{:+.4f}')}</td><td>{_cell(b.get('se'), '{:.4f}')}</td>"
                   f"<td>{_cell(b.get('strength'), '{:g}')}</td><td>{esc(', '.join(t.get('memorised') or []))}</td></tr>")
    out.append("</table>")
    return "".join(out)


def page(r: ImageEval, title: str) -> str:
    esc = html.escape
    parts = [f"<!doctype html><meta charset=utf-8><title>{esc(title)} eval</title>",
             "<style>body{font-family:sans-serif}td{text-align:center;font-size:12px}img{width:160px}</style>",
             f"<h1>{esc(title)}</h1>",
             "<p>Same seed in every cell: only the LoRA and its strength differ. The base row is the model "
             "without the LoRA (one image: strength does not apply).</p>",
             f"<p>{esc(r.checkpoints_note)}</p>" if r.checkpoints_note else "",
             (f"<p><b>recommended: {esc(r.best)}{f' at strength {r.strength:g}' if r.strength else ''}</b> "
              f"({esc(r.reason)})</p>" if r.best else f"<p>no checkpoint recommended: {esc(r.reason)}</p>"),
             quality_table(r.quality),
             "<p>" + (f"CLIP scores from {esc(r.clip)}: text = prompt adherence, train = similarity to the training "
                      "images (high: over-fitting), base = similarity to the base image (leakage prompts)."
                      if r.clip else "No CLIP model given (--clip PATH): grids only, no scores.") + "</p>"]
    for g in r.grids:
        kind = "leakage prompt (no trigger: should look like the base)" if g.leakage_prompt else "trigger prompt"
        parts.append(f"<h2>{esc(g.prompt)}</h2><p>{kind}, seed {g.seed}</p><table><tr><th></th>"
                     + "".join(f"<th>strength {s}</th>" for s in r.strengths) + "</tr>")
        rows: dict[str, list[Cell]] = {}
        for c in g.cells:
            rows.setdefault(c.row, []).append(c)
        for row, cells in rows.items():
            tds = []
            if row == "base":  # one image across the strength columns, not under "strength 0.6"
                c = cells[0]
                parts.append(f"<tr><th>base (no LoRA)</th><td colspan={len(r.strengths)}><img src='{esc(c.image)}'>"
                             + "".join(f"<br>{k} {v:.3f}" for k, v in (("text", c.clip_text),) if v is not None)
                             + "</td></tr>")
                continue
            for c in cells:
                notes = [f"{k} {v:.3f}" for k, v in (("leakage", c.leakage), ("text", c.clip_text),
                                                        ("train", c.clip_train), ("base", c.clip_base)) if v is not None]
                tds.append(f"<td><img src='{esc(c.image)}'><br>{esc(', '.join(notes))}</td>")
            parts.append(f"<tr><th>{esc(row)}</th>{''.join(tds)}</tr>")
        parts.append("</table>")
    return "\n".join(parts) + "\n"
