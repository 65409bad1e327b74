"""The dashboard's ASGI app (Starlette) and how ``lorapod ui`` serves it (uvicorn).

Pages are rendered on the server with Jinja2 (autoescaping on: captions, prompts, model names
and logs are text, never markup); the live parts are server-sent events: the Runs table and a
run's status as re-rendered fragments every two seconds, a run's new metrics lines as they are
appended (read from the byte offset the page last had, so a reconnecting ``EventSource`` sends
it back as ``Last-Event-ID`` and misses nothing).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lorapod.catalog import families
from lorapod.errors import LorapodError
from lorapod.ui import actions
from lorapod.ui.files import Refused, is_real_dir, read_from, sample_lines, serve
from lorapod.ui.guard import Guard
from lorapod.ui.live import GIVE_UP_AFTER, RemoteTail
from lorapod.ui.runs import (
    CHART_KEYS,
    MAX_POINTS,
    RunIndex,
    RunView,
    evaluation,
    iter_metrics,
    logs,
    parse_metrics,
    read_metrics,
    sample_prompt,
    samples,
    series,
    spec_dict,
)

PER_PAGE = 48  # samples per gallery page
FAMILIES = families.NAMES  # what `lorapod data report --family` takes (catalog/families.py)
POLL_S = 0.5  # how often a stream looks at metrics.jsonl
STATUS_EVERY_S = 2.0
STREAM_S = 300.0  # a stream ends after this; EventSource reconnects with its Last-Event-ID
STATIC = Path(__file__).parent / "static"
#: A run's chart reads at most the last CHART_TAIL bytes of metrics.jsonl in full and MAX_POINTS
#: stretches of CHART_WINDOW bytes of the rest (ui/files.py sample_lines): a few MB and tens of
#: milliseconds per request whatever the file's size (bench/ui_metrics.py).
CHART_TAIL = 2 * 1024 * 1024
CHART_WINDOW = 1024


def _env() -> Environment:
    env = Environment(loader=PackageLoader("lorapod.ui", "templates"), autoescape=select_autoescape(default=True))
    env.filters["usd"] = lambda v: "-" if v is None else (f"${v:.4f}" if v < 1 else f"${v:.2f}")
    env.filters["dur"] = _dur
    env.filters["clock"] = lambda t: _strftime("%H:%M", t)
    env.filters["when"] = lambda t: _strftime("%Y-%m-%d %H:%M", t)
    env.filters["num"] = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"
    env.filters["pct"] = lambda v: 0 if v is None else round(100 * v, 1)
    return env


def _strftime(fmt: str, t: float | None) -> str:
    """A time of day, or "-" for none and for one no calendar holds (runs.py bounds what a host
    writes before it gets here; this is the last guard, so a page never answers 500)."""
    if not t:
        return "-"
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, ValueError, OSError):
        return "-"


def _dur(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s < 90:
        return f"{s}s"
    if s < 5400:
        return f"{s // 60}m"
    return f"{s / 3600:.1f}h"


class Dashboard:
    """The app's state: where runs are, which specs and data folders the Plan and Data pages offer."""

    def __init__(self, index: RunIndex, token: str, data_folders: list[Path] | None = None,
                 spec_files: list[Path] | None = None, prefix: str = "") -> None:
        self.index = index
        self.token = token
        self.prefix = prefix.rstrip("/")  # every page's URLs start with it (ui/guard.py: the cookie's path)
        self.extra_data = [Path(p).resolve() for p in data_folders or []]
        self.extra_specs = [Path(p).resolve() for p in spec_files or []]
        self.env = _env()
        self._plans: dict[tuple[str, int], dict[str, Any]] = {}

    def render(self, name: str, **ctx: Any) -> str:
        return self.env.get_template(name).render(token=self.token, now=time.time(), root=self.prefix, **ctx)

    def page(self, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(self.render(name, **ctx), status)

    def plan(self, spec_path: Path) -> dict[str, Any]:
        """:func:`plan_json`, kept while the spec file is unchanged (planning takes seconds)."""
        key = (str(spec_path), spec_path.stat().st_mtime_ns)
        if key not in self._plans:
            self._plans[key] = plan_json(spec_path)
        return self._plans[key]

    # -------------------------------------------------------------- choices for Plan and Data

    def specs(self, views: list[RunView] | None = None) -> list[Path]:
        out = list(self.extra_specs)
        for v in views if views is not None else self.index.views(progress=False):
            p = v.spec_file
            if p is not None and p.is_file() and p not in out:
                out.append(p)
        return out

    def data_folders(self, views: list[RunView] | None = None) -> list[Path]:
        """``--data`` folders and each run's ``data.path`` that is a folder here (images, clips)."""
        return [f for f, _ in self.data_choices(views)]

    def data_choices(self, views: list[RunView] | None = None) -> list[tuple[Path, str]]:
        """(folder, model family) for the Data page: ``--data`` folders (checked as SDXL), then the
        image or clip folders the runs' specs name (relative names from the spec's own folder)."""
        out: list[tuple[Path, str]] = [(p, "sdxl") for p in self.extra_data]
        for v in views if views is not None else self.index.views(progress=False):
            spec = spec_dict(v.spec_file)
            data, model = spec.get("data"), spec.get("model")
            paths = data.get("path") if isinstance(data, dict) else None
            family = model.get("family") if isinstance(model, dict) else None
            family = family if family in FAMILIES else "sdxl"
            for p in paths if isinstance(paths, list) else [paths]:
                if not isinstance(p, str) or v.spec_file is None:
                    continue
                path = Path(p).expanduser()
                path = (path if path.is_absolute() else v.spec_file.parent / path).resolve()
                if path.is_dir() and path not in [f for f, _ in out]:
                    out.append((path, family))
        return out


# ----------------------------------------------------------------------------- pages


def runs_page(dash: Dashboard, request: Request) -> Response:
    views = dash.index.views()
    return dash.page("runs.html", views=views, groups=_groups(dash, views), nav="runs",
                     ledger_error=dash.index.ledger_error)


def _groups(dash: Dashboard, views: list[RunView]) -> list[dict[str, Any]]:
    """Sweeps, each with its shared cap and what its jobs spent, then the other runs; groups with a
    running job first."""
    from lorapod.ui.runs import sweeps

    found = sweeps({v.root.parent for v in views})
    groups, used = [], set()
    for s in found:
        members = [v for v in views if v.job_id in s["jobs"]]  # in the index's order: running first
        if not members:
            continue
        used.update(v.job_id for v in members)
        spent = sum(v.usd for v in members)
        groups.append({"sweep": s, "views": members, "usd": spent,
                       "fraction": min(1.0, spent / s["max_usd"]) if s["max_usd"] else None})
    rest = [v for v in views if v.job_id not in used]
    if rest:
        groups.append({"sweep": None, "views": rest})
    return sorted(groups, key=lambda g: not any(v.active for v in g["views"]))  # stable: sweeps before the rest


def run_context(dash: Dashboard, view: RunView, page: int = 1) -> dict[str, Any]:
    groups = samples(view.root)
    flat = [(g["tag"], f) for g in groups for f in g["files"]]
    pages = max(1, -(-len(flat) // PER_PAGE))
    page = min(max(1, page), pages)
    shown = flat[(page - 1) * PER_PAGE: page * PER_PAGE]
    gallery: list[dict[str, Any]] = []
    for tag, f in shown:
        if not gallery or gallery[-1]["tag"] != tag:
            gallery.append({"tag": tag, "files": []})
        gallery[-1]["files"].append({**f, "prompt": sample_prompt(view.root, f["path"])})
    last_ckpt = last_checkpoint(view.root)
    ledger_events: list[dict[str, Any]] = []
    try:
        ledger = dash.index.ledger() if view.in_ledger else None
        if ledger is not None:
            try:
                ledger_events = ledger.events(view.job_id)[-200:]
            finally:
                ledger.close()
    except (sqlite3.Error, LorapodError):  # locked, or damaged (LedgerDamaged)
        pass  # the Runs page says the ledger cannot be read; this page still shows the run folder
    phases = [{"name": k, "s": s, "usd": view.setup_usd.get(k, 0.0)} for k, s in view.setup_s.items()]
    return {"view": view, "gallery": gallery, "page": page, "pages": pages, "n_samples": len(flat),
            "evaluation": evaluation(view.root), "logs": logs(view.root), "ledger_events": ledger_events,
            "phases": phases, "last_ckpt": last_ckpt, "confirm": _confirms(view, last_ckpt)}


def last_checkpoint(root: Path) -> str | None:
    """The newest ``checkpoints/step-N`` (or ``epoch-N``, as trainers/base.py names sd-scripts'),
    a real folder, not a link, by N."""
    if not is_real_dir(root / "checkpoints"):
        return None
    try:
        with os.scandir(root / "checkpoints") as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)
                     and re.fullmatch(r"(step|epoch)-\d{1,12}", e.name)]
    except OSError:
        return None
    return max(names, key=lambda n: (n.startswith("step"), int(n.split("-")[1])), default=None)


def _confirms(view: RunView, last_ckpt: str | None) -> dict[str, str]:
    """What each button costs or loses, in the words of its confirmation."""
    rate = f"${view.usd_per_hour:.3f}/h" if view.usd_per_hour is not None else "its hourly rate"
    where = f"{view.gpu or 'the instance'} on {view.provider}"
    since = (f"everything after {last_ckpt} (the last checkpoint pulled here)" if last_ckpt
             else "all training so far (no checkpoint has been pulled yet)")
    return {
        "pull": f"Pull now: copy new checkpoints, samples and metrics from {where} into {view.root}. "
                f"The instance keeps running at {rate} meanwhile; Vast.ai hosts bill the download's bandwidth.",
        "stop": f"Stop at the next save: the job saves a checkpoint at its next step and ends; the run is pulled "
                f"and {where} destroyed. Nothing trained is lost; the pull and teardown still bill at {rate} "
                f"for a few minutes. Resume later with `lorapod run --resume {view.job_id}`.",
        "destroy": f"Destroy now: {where} is destroyed at once, without a final save or pull. You lose {since}. "
                   f"Spent so far: ${view.usd:.4f}; billing stops when the provider confirms.",
    }


def run_page(dash: Dashboard, request: Request) -> Response:
    view = dash.index.find(request.path_params["job"])
    if view is None:
        return dash.page("missing.html", 404, what=request.path_params["job"], nav="runs")
    try:
        page = int(request.query_params.get("page", "1"))
    except ValueError:
        page = 1
    return dash.page("run.html", nav="runs", charts=CHART_KEYS, **run_context(dash, view, page))


def compare_page(dash: Dashboard, request: Request) -> Response:
    """Ticked runs side by side: one table, their loss curves on one chart each."""
    wanted = request.query_params.getlist("job")[:8]
    views = [v for v in dash.index.views() if v.job_id in wanted]
    val: dict[str, float | None] = {}
    for v in views:  # the last validation-type loss, as the sweep ranks runs (compute/sweep.py LOSS_KEYS)
        vals = [r.get("val_loss", r.get("fixed_noise_loss")) for r in read_metrics(v.root)]
        val[v.job_id] = next((x for x in reversed(vals) if isinstance(x, int | float)), None)
    return dash.page("compare.html", views=views, val=val, nav="runs")


def plan_page(dash: Dashboard, request: Request) -> Response:
    specs = dash.specs()
    pick = request.query_params.get("spec")
    ctx: dict[str, Any] = {"specs": specs, "nav": "plan", "chosen": None, "plan": None, "error": None}
    if pick is not None:
        try:
            path = specs[int(pick)]
        except (ValueError, IndexError):
            return dash.page("plan.html", 404, **{**ctx, "error": "no such spec"})
        ctx["chosen"] = int(pick)
        try:
            ctx["plan"] = dash.plan(path)
        except LorapodError as exc:
            ctx["error"] = exc.message + (f" ({exc.hint})" if exc.hint else "")
    return dash.page("plan.html", **ctx)


def plan_json(spec_path: Path) -> dict[str, Any]:
    """What ``lorapod plan SPEC --json`` prints, plus the job's VRAM parts (its Peak VRAM table)."""
    from lorapod.plan.choose import plan_job
    from lorapod.spec import load_spec

    plan = plan_job(load_spec(spec_path))
    out = plan.to_json()
    rec = plan.to_record()["job"]
    out["job"] = rec
    out["best"] = next((i for i, o in enumerate(out["options"]) if o["fits"]), 0)
    out["note"] = plan.snapshot_note
    out["warnings"] = plan.warnings
    return out


def data_page(dash: Dashboard, request: Request) -> Response:
    folders = dash.data_folders()
    pick = request.query_params.get("folder")
    chosen = None
    if pick is not None:
        try:
            chosen = int(pick)
            if not 0 <= chosen < len(folders):
                raise IndexError(chosen)
        except (ValueError, IndexError):
            return dash.page("data.html", 404, folders=folders, chosen=None, nav="data")
    return dash.page("data.html", folders=folders, chosen=chosen, nav="data")


def data_report(dash: Dashboard, request: Request) -> Response:
    """The data report's own HTML (data/report.py, escaped there), shown in a sandboxed frame."""
    from lorapod.data.check import check_path
    from lorapod.data.report import build_html

    try:
        folder, family = dash.data_choices()[int(request.path_params["n"])]
    except (ValueError, IndexError):
        return PlainTextResponse("no such folder", 404)
    try:
        report = check_path(folder, family=family)
        return HTMLResponse(build_html(report))
    except LorapodError as exc:
        return dash.page("missing.html", 400, what=f"{folder}: {exc.message}", nav="data")


# ----------------------------------------------------------------------------- data for the pages


def run_metrics(dash: Dashboard, request: Request) -> Response:
    view = dash.index.find(request.path_params["job"])
    if view is None:
        return JSONResponse({"error": "no such run"}, 404)
    data, offset, size, sampled = sample_lines(view.root, "metrics.jsonl", CHART_TAIL, MAX_POINTS, CHART_WINDOW)
    seen = {"rows": 0, "last_step": None}

    def rows() -> Iterator[dict[str, Any]]:  # counted as the series take them: no list of every record
        for rec in iter_metrics(data.decode("utf-8", errors="replace")):
            seen["rows"] += 1
            step = rec.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                seen["last_step"] = step if seen["last_step"] is None else max(seen["last_step"], step)
            yield rec

    out = series(rows())
    return JSONResponse({"offset": offset, "rows": seen["rows"], "sampled": sampled, "bytes": size, "tail_bytes": CHART_TAIL,
                         "last_step": seen["last_step"], "max_points": MAX_POINTS, "series": out})


def run_file(dash: Dashboard, request: Request) -> Response:
    view = dash.index.find(request.path_params["job"])
    if view is None:
        return PlainTextResponse("no such run", 404)
    try:
        got = serve(view.root, request.path_params["path"])
    except Refused:
        return PlainTextResponse("refused: only images and clips inside the run folder, never through a link", 404)

    def chunks() -> Iterator[bytes]:
        with os.fdopen(got.fd, "rb") as fh:
            while block := fh.read(256 * 1024):
                yield block

    return StreamingResponse(chunks(), media_type=got.media_type, headers={"content-length": str(got.size)})


def _compact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = {k for ks in CHART_KEYS.values() for k in ks} | {"step", "step_time_s", "tokens_per_s"}
    return [{k: r[k] for k in keys if k in r} for r in rows]


async def run_stream(dash: Dashboard, request: Request) -> Response:
    view = dash.index.find(request.path_params["job"])
    if view is None:
        return PlainTextResponse("no such run", 404)
    try:
        offset = int(request.headers.get("last-event-id") or request.query_params.get("offset", "0"))
    except ValueError:
        offset = 0

    # A running remote job: its new lines straight from the instance too (ui/live.py), from the
    # bytes already pulled home; the page keeps each series' steps increasing, so the same line
    # coming again with a later pull is drawn once.
    tail = RemoteTail(dash.index, view.job_id, _size(view.root / "metrics.jsonl")) \
        if view.in_ledger and view.active and view.live_instances else None

    async def events() -> AsyncIterator[str]:
        nonlocal offset
        end = time.monotonic() + STREAM_S
        next_status = 0.0
        last_html = None
        yield "retry: 1000\n\n"
        try:
            while time.monotonic() < end:
                data, offset = await run_in_threadpool(read_from, view.root, "metrics.jsonl", offset)
                if data:
                    rows = _compact(parse_metrics(data.decode("utf-8", errors="replace")))
                    yield f"id: {offset}\nevent: metrics\ndata: {json.dumps({'offset': offset, 'rows': rows})}\n\n"
                if tail is not None and tail.due():
                    live = await run_in_threadpool(tail.read)
                    if live:
                        rows = _compact(parse_metrics(live.decode("utf-8", errors="replace")))
                        yield f"event: metrics\ndata: {json.dumps({'offset': offset, 'rows': rows, 'live': True})}\n\n"
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + STATUS_EVERY_S
                    fresh = await run_in_threadpool(dash.index.find, view.job_id)
                    if fresh is not None:
                        html = dash.render("_status.html", view=fresh)
                        if html != last_html:
                            last_html = html
                            yield f"event: status\ndata: {json.dumps({'html': html})}\n\n"
                        else:
                            yield ": ping\n\n"
                        if tail is not None and not fresh.active:
                            tail.failures = GIVE_UP_AFTER  # over: the final pull has every line
                await asyncio.sleep(POLL_S)
        finally:  # not awaited: a cancelled stream's awaits would be cancelled too
            if tail is not None:
                tail.close()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})


def _size(p: Path) -> int:
    try:
        return p.stat().st_size if p.is_file() and not p.is_symlink() else 0
    except OSError:
        return 0


async def runs_stream(dash: Dashboard, request: Request) -> Response:
    async def events() -> AsyncIterator[str]:
        end = time.monotonic() + STREAM_S
        last = None
        yield "retry: 1000\n\n"
        while time.monotonic() < end:
            views = await run_in_threadpool(dash.index.views)
            html = dash.render("_runs_table.html", groups=_groups(dash, views), views=views,
                               ledger_error=dash.index.ledger_error)
            if html != last:
                last = html
                yield f"event: runs\ndata: {json.dumps({'html': html})}\n\n"
            else:
                yield ": ping\n\n"
            await asyncio.sleep(STATUS_EVERY_S)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})


# ----------------------------------------------------------------------------- actions


async def run_action(dash: Dashboard, request: Request) -> Response:
    what = request.path_params["action"]
    fn = {"pull": actions.pull, "stop": actions.stop, "destroy": actions.destroy}.get(what)
    if fn is None:
        return JSONResponse({"ok": False, "lines": [f"unknown action {what}"]}, 404)
    try:
        out = await run_in_threadpool(fn, dash.index, request.path_params["job"])
    except LorapodError as exc:
        return JSONResponse({"ok": False, "lines": [exc.message, *([exc.hint] if exc.hint else [])]}, 409)
    return JSONResponse(out.to_json(), 200 if out.ok else 409)


def build_app(dash: Dashboard, hosts: set[str], port: int) -> Guard:
    def bind(fn):
        async def endpoint(request: Request) -> Response:
            if asyncio.iscoroutinefunction(fn):
                return await fn(dash, request)
            return await run_in_threadpool(fn, dash, request)

        return endpoint

    routes = [
        Route("/", bind(runs_page)),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/stream/runs", bind(runs_stream)),
        Route("/runs/{job}", bind(run_page)),
        Route("/runs/{job}/metrics", bind(run_metrics)),
        Route("/runs/{job}/stream", bind(run_stream)),
        Route("/runs/{job}/file/{path:path}", bind(run_file)),
        Route("/runs/{job}/{action}", bind(run_action), methods=["POST"]),
        Route("/compare", bind(compare_page)),
        Route("/plan", bind(plan_page)),
        Route("/data", bind(data_page)),
        Route("/data/report/{n}", bind(data_report)),
        Mount("/static", StaticFiles(directory=STATIC, follow_symlink=False), name="static"),
    ]
    return Guard(Starlette(routes=routes), dash.token, hosts, port, dash.prefix)


def allowed_hosts(host: str, port: int) -> set[str]:
    names = {host}
    if host in ("127.0.0.1", "localhost"):
        names |= {"127.0.0.1", "localhost"}
    return {f"{n}:{port}" for n in names} | ({f"[{host}]:{port}"} if ":" in host else set())


def open_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before uvicorn starts, so that ``--port 0`` gives a free port
    whose number goes into the printed address and the Host check."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LorapodError(f"cannot listen on {host}:{port} ({exc.strerror})",
                           hint="pick another port with --port N (0 = any free one)") from exc
    sock.listen(64)
    return sock


def serve_forever(dash: Dashboard, sock: socket.socket) -> None:
    """Run uvicorn on ``sock`` until Ctrl-C; open streams get two seconds to close."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    app = build_app(dash, allowed_hosts(host, port), port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                            lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
