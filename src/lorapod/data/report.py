"""Show a Report: grouped in the terminal, or as a self-contained HTML contact sheet.

The HTML page embeds every thumbnail as a ``data:`` URI and its CSS inline, so it can be mailed,
opened offline or attached to an issue, and it is written outside the dataset folder so the
folder that gets uploaded stays exactly as the user made it.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from lorapod.catalog import families
from lorapod.data.findings import SEVERITIES, Finding, Report
from lorapod.fsutil import atomic_write_text

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_ROWS_PER_CODE = 8  # in the terminal; --json and the HTML page list everything


def print_report(report: Report, console: Console | None = None) -> None:
    """Findings grouped by severity (errors first), a summary, and the bucket plan or token histogram."""
    console = console or Console()
    for sev in SEVERITIES:
        items = [f for f in report.sorted_findings() if f.severity == sev]
        if not items:
            continue
        table = Table(title=f"{sev}s ({len(items)})", title_style=STYLE[sev], title_justify="left",
                      show_header=True, header_style="bold", expand=False)
        table.add_column("where", overflow="fold")
        table.add_column("code", style=STYLE[sev])
        table.add_column("what to do", overflow="fold")
        shown: defaultdict[str, int] = defaultdict(int)
        hidden: defaultdict[str, int] = defaultdict(int)
        for f in items:
            shown[f.code] += 1
            if shown[f.code] > MAX_ROWS_PER_CODE:
                hidden[f.code] += 1
                continue
            where = f.path + (f":{f.line}" if f.line else "")
            table.add_row(escape(where), f.code, escape(f.message))
        for code, n in hidden.items():
            table.add_row("...", code, f"{n} more (see --json or `lorapod data report`)")
        console.print(table)
    s = report.summary
    if s.get("kind") == "images":
        console.print(
            f"[bold]{s['images']}[/] images ({s['readable']} readable, {s['captioned']} captioned with "
            f"{escape(s['caption_extension'])}), family {s['family']} at {s['resolution']} px"
        )
        if s["buckets"]:
            t = Table(title="bucket plan", title_justify="left")
            t.add_column("bucket")
            t.add_column("images", justify="right")
            t.add_column("upscaled", justify="right")
            for row in s["buckets"]:
                t.add_row(row["bucket"], str(row["images"]), str(row["upscaled"]))
            console.print(t)
    elif s.get("kind") == "video":
        console.print(f"[bold]{s['clips']}[/] clips ({s['usable_clips']} usable) and [bold]{s['images']}[/] images, "
                      f"{s['captioned']} captioned; windows of {s['target_frames']} frames at {s['fps'] or 'source'} fps")
        if s["windows"]:
            t = Table(title="window plan (frames x width x height)", title_justify="left")
            t.add_column("bucket")
            t.add_column("windows", justify="right")
            for row in s["windows"]:
                t.add_row(row["bucket"], str(row["windows"]))
            console.print(t)
    elif s.get("kind") == "chat" and "tokens" in s:
        tok = s["tokens"]
        console.print(
            f"format [bold]{s['format']}[/], {s['usable']} usable examples; tokens ({escape(tok['method'])}): "
            f"median {tok['median']}, p95 {tok['p95']}, max {tok['max']}; "
            f"{tok['truncated']} longer than sequence_len {tok['sequence_len']}"
        )
        t = Table(title="token lengths", title_justify="left")
        t.add_column("tokens")
        t.add_column("examples", justify="right")
        t.add_column("")
        top = max((b["count"] for b in tok["histogram"]), default=1) or 1
        for b in tok["histogram"]:
            bar = "#" * round(30 * b["count"] / top)
            t.add_row(b["range"], str(b["count"]), f"[red]{bar}[/]" if b["over_sequence_len"] else bar)
        console.print(t)
        console.print(Panel(escape(s["example_rendered"]), title="example 1 as the model sees it",
                            title_align="left"))
    counts = report.counts()
    verdict = "[bold red]not ready[/]" if report.has_errors else "[bold green]ready[/]"
    console.print(f"{verdict}: {counts['error']} errors, {counts['warning']} warnings, {counts['info']} notes")


# ---------------------------------------------------------------------------------------------
# HTML

THUMB = 224

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
.error{color:#b00020;font-weight:bold}.warning{color:#a15c00}.info{color:#0b6e99}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(240px,1fr));gap:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
.card.bad{border-color:#b00020;border-width:2px}
.card img,.pair img{max-width:224px;max-height:224px;display:block;margin:0 auto 6px}
.name{font-weight:bold;word-break:break-all}.meta{color:#666;font-size:12px}
.caption{font-family:ui-monospace,monospace;font-size:12px;background:#f3f3f3;padding:4px;margin:4px 0;white-space:pre-wrap}
.flag{display:inline-block;font-size:11px;border-radius:3px;padding:1px 5px;margin:2px 2px 0 0;color:#fff}
.flag.error{background:#b00020}.flag.warning{background:#c77700}.flag.info{background:#0b6e99}
.pair{display:flex;gap:16px;align-items:flex-start;background:#fff;border:1px solid #ddd;padding:8px;margin:8px 0}
"""


def _thumb(path: Path) -> str | None:
    """A JPEG data: URI of the image as it should look (EXIF applied), or None if it cannot be read."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            im.draft("RGB", (THUMB * 2, THUMB * 2))
            im = ImageOps.exif_transpose(im)
            im.thumbnail((THUMB, THUMB))
            if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
                im = im.convert("RGBA")
                bg = Image.new("RGB", im.size, (255, 255, 255))
                bg.paste(im, mask=im.getchannel("A"))
                im = bg
            buf = io.BytesIO()
            im.convert("RGB").save(buf, "JPEG", quality=75)
    except Exception:  # a corrupt image has its own finding; the page shows a placeholder
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str | None, alt: str) -> str:
    if uri is None:
        return '<div class="meta">(cannot be displayed)</div>'
    return f'<img src="{uri}" alt="{html.escape(alt)}">'


def build_html(report: Report, workers: int = 2) -> str:
    """The contact sheet for an image-folder report (from ``check_images``)."""
    s = report.summary
    infos = report.extra.get("infos", [])
    captions: dict[str, str] = report.extra.get("captions", {})
    placements = report.extra.get("placements", {})
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        thumbs = dict(zip([i.rel for i in infos], pool.map(_thumb, [i.path for i in infos]), strict=True))
    by_path: defaultdict[str, list[Finding]] = defaultdict(list)
    for f in report.findings:
        by_path[f.path].append(f)
    by_stem = {i.rel.rsplit(".", 1)[0]: i.rel for i in infos}
    for f in report.findings:  # a caption's findings also belong on its image's card
        image = by_stem.get(f.path.rsplit(".", 1)[0]) if "." in f.path else None
        if image is not None and image != f.path:
            by_path[image].append(f)
    e = html.escape
    counts = report.counts()
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>lorapod data report: {e(Path(s.get('path', '')).name)}</title><style>{CSS}</style></head><body>",
        f"<h1>Dataset report: {e(s.get('path', ''))}</h1>",
        f"<p>{s.get('images', 0)} images, {s.get('readable', 0)} readable, {s.get('captioned', 0)} captioned "
        f"({e(str(s.get('caption_extension', '')))}); family {e(str(s.get('family', '')))} at "
        f"{s.get('resolution', '')} px. <span class='error'>{counts['error']} errors</span>, "
        f"<span class='warning'>{counts['warning']} warnings</span>, <span class='info'>{counts['info']} notes</span>.</p>",
        "<h2>Findings</h2><table><tr><th>severity</th><th>where</th><th>code</th><th>what to do</th></tr>",
    ]
    for f in report.sorted_findings():
        where = f.path + (f":{f.line}" if f.line else "")
        out.append(f"<tr><td class='{f.severity}'>{f.severity}</td><td>{e(where)}</td><td>{e(f.code)}</td>"
                   f"<td>{e(f.message)}</td></tr>")
    if s.get("kind") == "video":  # clips: their facts and the training window plan (lorapod.data.video)
        out.append("</table><h2>Clips</h2><table><tr><th>clip</th><th>frames</th><th>fps</th><th>size</th>"
                   "<th>seconds</th><th>variable fps</th><th>audio</th><th>flags</th></tr>")
        for c in s.get("clip_info", []):
            flags = ", ".join(f.code for f in by_path.get(c["path"], []))
            out.append(f"<tr><td>{e(c['path'])}</td><td>{c['frames']}</td><td>{c['fps']}</td>"
                       f"<td>{c['size'][0]}x{c['size'][1]}</td><td>{c['duration_s']}</td><td>{c['variable_fps']}</td>"
                       f"<td>{c['audio']}</td><td>{e(flags)}</td></tr>")
        out.append("</table><h2>Window plan (frames x width x height)</h2><table><tr><th>bucket</th><th>windows</th></tr>")
        for row in s.get("windows", []):
            out.append(f"<tr><td>{e(row['bucket'])}</td><td>{row['windows']}</td></tr>")
    out.append("</table><h2>Bucket plan</h2><table><tr><th>bucket</th><th>images</th><th>upscaled</th></tr>")
    for row in s.get("buckets", []):
        out.append(f"<tr><td>{e(row['bucket'])}</td><td>{row['images']}</td><td>{row['upscaled']}</td></tr>")
    out.append("</table>")
    dupes = s.get("duplicates", {})
    pairs = [(g[0], g[1], "identical") for g in dupes.get("exact", [])]
    pairs += [(d["a"], d["b"], f"distance {d['distance']}/64") for d in dupes.get("near", [])]
    if pairs:
        out.append("<h2>Duplicates</h2>")
        for a, b, why in pairs:
            out.append(f"<div class='pair'><div>{_img(thumbs.get(a), a)}<div class='name'>{e(a)}</div></div>"
                       f"<div>{_img(thumbs.get(b), b)}<div class='name'>{e(b)}</div></div>"
                       f"<div class='meta'>{e(why)}</div></div>")
    out.append("<h2>Images</h2><div class='grid'>")
    for i in infos:
        flags = by_path.get(i.rel, [])
        bad = any(f.severity == "error" for f in flags)
        meta = f"{i.width}x{i.height} {e(i.format or '?')} {e(i.mode or '')}" if i.ok else "unreadable"
        p = placements.get(i.rel)
        if p is not None:
            meta += f" &rarr; bucket {p.bucket}" + (f" (upscaled x{p.scale:.2f})" if p.upscaled else "")
        cap = captions.get(i.rel)
        cap_html = f"<div class='caption'>{e(cap)}</div>" if cap else "<div class='meta'>(no caption)</div>"
        badges = "".join(f"<span class='flag {f.severity}' title='{e(f.message)}'>{e(f.code)}</span>" for f in flags)
        out.append(f"<div class='card{' bad' if bad else ''}'>{_img(thumbs.get(i.rel), i.rel)}"
                   f"<div class='name'>{e(i.rel)}</div><div class='meta'>{meta}</div>{cap_html}{badges}</div>")
    out.append("</div></body></html>")
    return "\n".join(out)


def write_report(
    root: Path,
    out: Path | None = None,
    *,
    family: str = families.DEFAULT_IMAGE_FAMILY,
    trigger: str | None = None,
    tokenizer: Path | None = None,
) -> tuple[Path, Report]:
    """Check ``root`` and write the HTML page (default: ``<folder name>-report.html`` beside the
    dataset folder: next to the data it describes, never inside it, where it would be uploaded)."""
    from lorapod.data.images import check_images, default_workers

    if family in families.VIDEO:  # clips + images (lorapod.data.video)
        from lorapod.data.video import check_video

        report = check_video(Path(root), family=family, trigger=trigger)
    else:
        report = check_images(Path(root), family=family, trigger=trigger, tokenizer=tokenizer)
    if out is None:
        real = Path(root).resolve()
        out = real.parent / f"{real.name}-report.html"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, build_html(report, workers=default_workers()))
    return out, report
