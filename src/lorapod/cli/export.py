"""``lorapod export RUN --to TARGET`` and ``lorapod inspect FILE``: thin parsing and printing."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        run: Path = typer.Argument(..., help="The run folder (runs/JOB), or a LoRA .safetensors to convert."),
        to: str = typer.Option(..., "--to", help="LLM: peft | merged | gguf | ollama.  Image: comfyui | diffusers | merged. "
                               "Both: hub (upload to the Hugging Face Hub with --repo)."),
        checkpoint: int | None = typer.Option(None, "--checkpoint", help="Export checkpoints/step-N (default: the quality "
                                              "autopilot's pick, else the final adapter)."),
        final: bool = typer.Option(False, "--final", help="Export the final adapter, not the quality autopilot's pick."),
        out: Path | None = typer.Option(None, "--out", help="Output folder (default: RUN/exports/TARGET-STEP); never overwritten."),
        base: str | None = typer.Option(None, "--base", help="The base model, when it moved since training."),
        adapter: bool = typer.Option(False, "--adapter", help="ollama: base GGUF + ADAPTER instead of the merged GGUF."),
        outtype: str = typer.Option("f16", "--outtype", help="GGUF model tensors: f16 | f32."),
        family: str | None = typer.Option(None, "--family", help="Converting a file: sd15 | sdxl | flux1 | flux2."),
        repo: str | None = typer.Option(None, "--repo", help="--to hub: the Hub repo, user/name (created if missing)."),
        private: bool = typer.Option(False, "--private", help="--to hub: create the repo private."),
        merged: bool = typer.Option(False, "--merged", help="--to hub: upload the merged model, not the adapter."),
        gguf_: bool = typer.Option(False, "--gguf", help="--to hub, LLM: upload the llama.cpp GGUF adapter."),
    ) -> None:
        """Write a checkpoint in the format a tool loads: PEFT, merged, GGUF, Ollama, ComfyUI, diffusers,
        or publish it to the Hugging Face Hub with a model card (--to hub --repo user/name)."""
        from lorapod.cli.quiet import quiet_libraries
        from lorapod.export.names import check_target

        if to != "hub":
            check_target(run, to)  # before the libraries that write the targets load (seconds)
        quiet_libraries()
        from lorapod.export.targets import export_run

        if to == "hub":
            from lorapod.errors import ExportError
            from lorapod.export.hub import publish

            if not repo:
                raise ExportError("--to hub needs --repo user/name", hint="e.g. --to hub --repo me/mug-lora [--private]")
            done = publish(run, repo, private=private, merged=merged, gguf=gguf_, checkpoint=checkpoint, base=base,
                           say=lambda m: console.print(escape(m)), final=final)
            console.print(f"published [bold]{escape(done.url)}[/] (commit {escape(done.commit[:12])})")
            for f in done.files:
                console.print(f"  {escape(f)}")
            for n in done.notes:
                console.print(f"  - {escape(n)}")
            return
        if repo or private or merged or gguf_:
            raise typer.BadParameter("--repo, --private, --merged and --gguf go with --to hub")
        if outtype not in ("f16", "f32"):
            raise typer.BadParameter("--outtype is f16 or f32")
        if final and checkpoint is not None:
            raise typer.BadParameter("--final and --checkpoint name two different adapters: give one")
        done = export_run(run, to, checkpoint, out, base, adapter, outtype, family, final=final)
        console.print(f"wrote [bold]{escape(str(done.out))}[/]")
        for f in done.files:
            console.print(f"  {escape(f)}")
        for n in done.notes:
            console.print(f"  - {escape(n)}")

    @app.command("inspect")
    def inspect(
        file: Path = typer.Argument(..., help="A LoRA file: PEFT/diffusers/kohya .safetensors, a PEFT folder, or .gguf."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    ) -> None:
        """What a LoRA file is, and which keys ComfyUI, diffusers and llama.cpp would load or drop."""
        from lorapod.export.inspect import inspect_file, render

        # no quiet_libraries(): inspect loads neither transformers nor diffusers (importing them to
        # quieten them cost seconds), and a checkpoint's run spec is read with lorapod's own code
        report = inspect_file(file)
        if as_json:
            print(json.dumps(report, indent=2, default=str))
        else:
            console.print(escape(render(report)))
