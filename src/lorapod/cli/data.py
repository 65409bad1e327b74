"""``lorapod data``: check, report, fix and caption datasets before a GPU is rented."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from lorapod.catalog import families

FAMILIES = "|".join(families.NAMES)


def _frame_list(text: str) -> tuple[int, ...]:
    from lorapod.errors import SpecError

    try:
        got = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        got = ()
    if not got or any(n < 1 or (n - 1) % 4 for n in got):
        raise SpecError(f"--frames {text!r}: give frame counts of the form 4n+1, comma-separated", hint="e.g. --frames 1,17,33")
    return got


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(
        help="Check, report, fix and caption datasets (image folders and chat JSONL).",
        no_args_is_help=True,
    )

    @data_app.command("check")
    def check(
        path: Path = typer.Argument(..., help="An image folder or a chat .jsonl file."),
        family: str = typer.Option(families.DEFAULT_IMAGE_FAMILY, "--family", help=f"Image model family: {FAMILIES}."),
        trigger: str | None = typer.Option(None, "--trigger", help="Trigger word every caption must start with."),
        json_out: bool = typer.Option(False, "--json", help="Print findings as JSON on stdout."),
        model: str | None = typer.Option(None, "--model", help="Chat: the model (folder, hub id or catalog alias) whose "
                                         "tokenizer and chat template the data is checked with."),
        sequence_len: int = typer.Option(2048, "--sequence-len", help="Chat: training sequence length in tokens."),
        val: Path | None = typer.Option(None, "--val", help="Chat: validation file, checked for overlap with train."),
        tokenizer: Path | None = typer.Option(None, "--tokenizer", help="Images: local CLIP tokenizer folder."),
        system_prompt: str = typer.Option("auto", "--system-prompt", help="Chat: auto|keep|first_user|last_user "
                                          "(data.system_prompt: where a system prompt goes)."),
        frames: str = typer.Option("1,17,33", "--frames", help="Video (wan21/wan22): target frame counts, 4n+1."),
        fps: float = typer.Option(16.0, "--fps", help="Video: the frame rate clips are resampled to (0 = keep)."),
        max_line_mb: float | None = typer.Option(None, "--max-line-mb", min=0.001, help="Chat: the longest line "
                                                 "read, in MiB (default 4); a longer one is reported, not read."),
    ) -> None:
        """Find every problem in a dataset; exit status 1 when there is an error."""
        from lorapod.data.check import check_path

        video = {}
        if family in families.VIDEO:
            video = {"target_frames": _frame_list(frames), "fps": fps or None}
        report = check_path(path, family=family, trigger=trigger, tokenizer=tokenizer,
                            model=model, sequence_len=sequence_len, val=val, system_prompt=system_prompt,
                            max_line_bytes=int(max_line_mb * 2**20) if max_line_mb else None, **video)
        if json_out:
            typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
        else:
            from lorapod.data.report import print_report

            print_report(report, Console())
        if report.has_errors:
            raise SystemExit(1)

    @data_app.command("report")
    def report_cmd(
        path: Path = typer.Argument(..., help="The image folder."),
        out: Path | None = typer.Option(None, "--out", help="HTML file to write (default: <folder>-report.html beside the folder)."),
        family: str = typer.Option(families.DEFAULT_IMAGE_FAMILY, "--family", help=f"Image model family: {FAMILIES}."),
        trigger: str | None = typer.Option(None, "--trigger", help="Trigger word every caption must start with."),
    ) -> None:
        """Write a self-contained HTML contact sheet: thumbnails, captions, flags, buckets, duplicates."""
        from lorapod.data.report import write_report

        written, report = write_report(path, out, family=family, trigger=trigger)
        c = report.counts()
        Console().print(f"wrote [bold]{written}[/] ({c['error']} errors, {c['warning']} warnings)")

    @data_app.command("fix")
    def fix(
        path: Path = typer.Argument(..., help="The image folder."),
        out: Path | None = typer.Option(None, "--out", help="Write the fixed dataset into this new folder."),
        in_place: bool = typer.Option(False, "--in-place", help="Fix in place; originals go to a backup folder."),
        trigger: str | None = typer.Option(None, "--trigger", help="Prepend this trigger word where it is missing."),
        extension: str = typer.Option(".txt", "--caption-extension", help="Caption extension to normalise to."),
    ) -> None:
        """Safe mechanical fixes: EXIF rotation, CMYK/alpha to RGB, caption names, whitespace, trigger."""
        from lorapod.data.fix import fix_dataset

        result = fix_dataset(path, out=out, in_place=in_place, trigger=trigger, caption_extension=extension)
        console = Console()
        for line in result.actions:
            console.print(f"  {line}", highlight=False)
        where = f" (originals in {result.backup})" if result.backup else ""
        console.print(f"[bold green]{len(result.actions)} fixes[/] -> {result.target}{where}")

    @data_app.command("caption")
    def caption(
        path: Path = typer.Argument(..., help="The image folder."),
        with_: str = typer.Option(..., "--with", help="Captioner: wd14, blip, florence2, joycaption (see docs/data.md)."),
        model: str | None = typer.Option(None, "--model", help="Hub id or local folder of the captioner model."),
        trigger: str | None = typer.Option(None, "--trigger", help="Put this trigger word first in every draft."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing captions (backups are kept)."),
        batch_size: int = typer.Option(8, "--batch-size", min=1, help="Images per inference batch."),
        extension: str = typer.Option(".txt", "--caption-extension", help="Extension of the caption files."),
    ) -> None:
        """Draft captions with a local model, only where none exist (unless --overwrite)."""
        from lorapod.data.captions import caption_folder

        result = caption_folder(path, with_, model=model, trigger=trigger, overwrite=overwrite,
                                batch_size=batch_size, caption_extension=extension)
        Console().print(
            f"[bold green]{result.written} drafts written[/], {result.skipped} images already captioned"
            + (f", backups in {result.backup}" if result.backup else "")
        )

    app.add_typer(data_app, name="data")
