"""``lorapod eval RUN``: compare the base and every checkpoint, and say which one to keep."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def evaluate(
        run: Path = typer.Argument(..., help="The run folder (runs/JOB)."),
        prompts: Path | None = typer.Option(None, "--prompts", help="One prompt per line (images: sd-scripts options allowed)."),
        n_prompts: int = typer.Option(4, "--n-prompts", help="LLM: held-out prompts answered side by side."),
        strengths: str = typer.Option("0.6,0.8,1.0", "--strengths", help="Images: LoRA strengths, comma-separated."),
        steps: int = typer.Option(20, "--steps", help="Images: sampling steps."),
        clip: Path | None = typer.Option(None, "--clip", help="Images: a CLIP or SigLIP model (folder or hub id) "
                                         "for scores (default: the spec's quality.clip)."),
        dino: str | None = typer.Option(None, "--dino", help="Images: a DINOv2 model (folder or hub id) for the "
                                        "quality scores (default: the spec's quality.dino)."),
        no_score: bool = typer.Option(False, "--no-score", help="Do not score checkpoints the run did not score "
                                      "while training (the quality autopilot); grids and losses only."),
        device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ..."),
    ) -> None:
        """LLM: val loss and perplexity, base vs every checkpoint, answers side by side.
        Images: checkpoint x strength x prompt grids with fixed seeds and leakage prompts.
        Both: the quality autopilot's scores per checkpoint against the base, and its pick."""
        from lorapod.cli.quiet import quiet_libraries
        from lorapod.rundir import RunDir
        from lorapod.spec import load_spec

        quiet_libraries()
        spec = load_spec(RunDir.open(run).spec_file)
        if spec.is_video:
            from lorapod.errors import SpecError

            raise SpecError(f"{run} is a video run ({spec.model.family}): lorapod eval compares image and LLM "
                            "checkpoints, not video ones yet",
                            hint=f"compare the sample clips and contact sheets in {run / 'samples'} (same prompt "
                                 "and seed at every checkpoint); lorapod inspect and lorapod export work on its files")
        if spec.is_image:
            from lorapod.evaluate.images import evaluate_images

            try:
                strs = tuple(float(s) for s in strengths.split(","))
            except ValueError as exc:
                raise typer.BadParameter("--strengths takes numbers, e.g. 0.6,0.8,1.0") from exc
            res = evaluate_images(run, prompts, strs, steps, clip=clip, device=device,
                                  log=lambda m: console.print(escape(m)), dino=dino, score=not no_score)
            if not clip:
                console.print("no CLIP model given (--clip PATH): grids only, no CLIP scores per cell")
            _say_quality(res.quality)
            console.print(f"page: [bold]{escape(res.page)}[/]")
            return
        from lorapod.evaluate.llm import evaluate_llm, render

        res = evaluate_llm(run, prompts, n_prompts, device, log=lambda m: console.print(escape(m)), score=not no_score)
        from rich.markdown import Markdown

        console.print(Markdown(render(res)))  # eval.md keeps the Markdown; the terminal gets it rendered
        console.print(f"files: {escape(', '.join(res.files))} in {escape(str(run))}")


def _say_quality(decision: dict) -> None:
    """The autopilot's decision in one line: the pick and its score, or why none."""
    if not decision:
        return
    if decision.get("checkpoint"):
        console.print(f"quality autopilot pick: [bold]{escape(str(decision['checkpoint']))} at strength "
                      f"{decision.get('strength'):g}[/] (score {decision.get('score'):+.4f} vs the base)")
    else:
        console.print(f"quality autopilot: no pick ({escape(str(decision.get('reason')))})")
