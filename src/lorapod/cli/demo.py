"""``lorapod demo``: train a real LoRA offline on this machine and show that it worked."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from lorapod.cli.train import interrupt_says_how_to_resume, loss_text
from lorapod.rundir.layout import METRICS

console = Console()


def demo(
    out: Path = typer.Option(Path("lorapod-demo"), "--out", help="Folder for the model, data, run and adapter."),
    model: str | None = typer.Option(None, "--model", help="Use this model (hub id or folder) instead of building one."),
    steps: int | None = typer.Option(None, "--steps", help="Stop after this many optimizer steps."),
    image: bool = typer.Option(False, "--image", help="The image path instead: a toy SD-style base model, a shapes dataset, "
                               "samples that visibly learn it and ComfyUI-ready LoRA files (offline, CPU, under a minute)."),
    video: bool = typer.Option(False, "--video", help="The video path instead: a toy Wan2.1 base model, generated "
                               "clips, MP4 samples that visibly learn them and both LoRA files (offline, CPU, about a "
                               "minute)."),
) -> None:
    """Build a tiny model locally, train a LoRA on a bundled dataset, show what came out."""
    if video:
        _video_demo(out if out != Path("lorapod-demo") else Path("lorapod-video-demo"), steps)
        return
    if image:
        _image_demo(out if out != Path("lorapod-demo") else Path("lorapod-image-demo"), steps)
        return
    from lorapod.demo import run_demo

    with interrupt_says_how_to_resume(console):
        res = run_demo(out, model=model, steps=steps, log=lambda m: console.print(m, highlight=False))
    console.print()
    if res.base_val_loss is not None and res.tuned_val_loss is not None:
        console.print(
            f"validation loss  base [bold]{loss_text(res.base_val_loss)}[/]  ->  tuned "
            f"[bold green]{loss_text(res.tuned_val_loss)}[/]"
        )
    table = Table(title="before / after (greedy generation, unseen phrasing)")
    table.add_column("question")
    table.add_column("base model")
    table.add_column("with the LoRA", style="green")
    for q, base, tuned in res.samples:
        table.add_row(q, base or "(nothing)", tuned or "(nothing)")
    console.print(table)
    console.print(f"\nbase model : {res.out / 'base-model'}")
    console.print(f"adapter    : {res.out / 'adapter'}  (PEFT: adapter_config.json + adapter_model.safetensors)")
    console.print(f"metrics    : {res.out / METRICS}  (plot: {res.out / 'loss.png'})")
    console.print(f"spec       : {res.out / 'spec.yaml'}  (train it again: lorapod train {res.out / 'spec.yaml'})")


def _show(res, rows: list[tuple[str, object]]) -> None:
    """A diffusion demo's result: fixed-noise loss before/after, where each file is, cache reuse."""
    console.print()
    if res.first_loss is not None and res.last_loss is not None:
        console.print(f"fixed-noise loss  base [bold]{loss_text(res.first_loss)}[/]  ->  tuned "
                      f"[bold green]{loss_text(res.last_loss)}[/]")
    for what, where in rows:
        console.print(f"{what:<42} {where}", highlight=False, soft_wrap=True)
    console.print(f"caches: {res.cache_hits} reused, {res.cache_misses} encoded (run the demo again: all reused)")


# What the tiny diffusion demos' pictures are, said where the user is about to open them.
IMAGE_PICTURES_NOTE = ("about the pictures: the base model is a 64 px toy written by lorapod.builtin.sd (a hand-set "
                       "pixel codec as its VAE, a small UNet pretrained from scratch on flat colours), so it draws "
                       "flat colour. progress-grid.png shows, for the same prompts and seeds, a training image of what "
                       "the prompt names, the base and then each checkpoint (every grid is labelled with prompt, seed, step and LoRA strength): with the "
                       "trigger zxq the samples turn from the base's flat colour toward the training pictures (a red "
                       "disc on blue, rough at 8 x 8 colour blocks), while 'green' stays green. That shows the "
                       "training loop, the LoRA, sampling and both exports work; it says nothing about the quality a "
                       "real base model reaches. For that, train one: lorapod train examples/sdxl-object-lora.yaml.")
VIDEO_PICTURES_NOTE = ("about the pictures: the base model is a 64 px toy Wan2.1 written by lorapod.builtin.wan (a "
                       "hand-set codec as its VAE, a small transformer pretrained from scratch on flat colours and "
                       "coloured squares), so it draws those. progress-clips.png shows, for the same prompts and "
                       "seeds, the base's clip and then each checkpoint's, frame by frame (labelled with prompt, seed, "
                       "step and LoRA strength): with the trigger zxq the clips turn from the base's flat grey into "
                       "the training clips' red squares on blue, standing still from frame to frame, while 'green' "
                       "stays green. That shows the training loop, the LoRA, sampling and both LoRA files work; it "
                       "says nothing about motion or about what a real Wan learns. For that, train one: "
                       "lorapod train examples/wan21-video-lora.yaml.")


def _image_demo(out: Path, steps: int | None) -> None:
    from lorapod.demo_image import run_image_demo

    with interrupt_says_how_to_resume(console):
        res = run_image_demo(out, steps=steps, log=lambda m: console.print(m, highlight=False))
    rows = [
        ("base model (diffusers folder)", res.out / "base-model"),
        ("dataset (images + .txt captions)", res.out / "data"),
        (f"samples ({len(res.samples)} PNGs, base ones included, prompt + seed inside)", res.run / "samples"),
        ("base vs each checkpoint, labelled", res.progress or "(none)"),
        ("LoRA, diffusers format", res.diffusers_file),
        ("LoRA, kohya format (ComfyUI/Forge)", res.kohya_file),
        ("exports per checkpoint", res.run / "exports"),
        ("metrics", res.run / METRICS),
        ("spec (train it again with lorapod train)", res.out / "spec.yaml"),
    ]
    rows.append(("quality scores per checkpoint, the pick", res.run / "quality"))
    _show(res, rows)
    _quality(res.quality)
    console.print(IMAGE_PICTURES_NOTE, highlight=False)


def _quality(q: dict | None) -> None:
    """The quality autopilot's pick, said with what its demo scorers are: random, plumbing only."""
    if not q:
        return
    if q.get("checkpoint"):
        console.print(f"quality autopilot pick: {q['checkpoint']} at strength {q['strength']:g} (scored against the "
                      "base by lorapod's tiny random scorers: the whole path runs, the pick means nothing here; give "
                      "quality.clip / quality.dino real models, the defaults, for a real run)", highlight=False)
    else:
        console.print(f"quality autopilot: no pick ({q.get('reason')})", highlight=False)


def _video_demo(out: Path, steps: int | None) -> None:
    from lorapod.demo_video import run_video_demo

    with interrupt_says_how_to_resume(console):
        res = run_video_demo(out, steps=steps, log=lambda m: console.print(m, highlight=False))
    rows = [
        ("base model (toy WanPipeline folder)", res.out / "base-model"),
        ("dataset (clips + stills + .txt captions)", res.out / "data"),
        (f"samples ({len(res.clips)} MP4 + base ones, {len(res.contact_sheets)} contact sheets)", res.run / "samples"),
        ("base vs each checkpoint, frame by frame", res.progress or "(none)"),
        ("LoRA, diffusers format", res.diffusers_file),
        ("LoRA, ComfyUI format (lora_unet_*)", res.comfy_file),
        ("cache sizes, predicted vs actual", res.run / "cache.json"),
        ("spec (train it again with lorapod train)", res.out / "spec.yaml"),
    ]
    rows.append(("quality scores per checkpoint, the pick", res.run / "quality"))
    _show(res, rows)
    _quality(res.quality)
    console.print(VIDEO_PICTURES_NOTE, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
