"""What the dashboard's pages fetch: a run's chart data (JSON), its images and clips, and the
three buttons (pull now, stop at the next save, destroy now: :mod:`lorapod.ui.actions`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from lorapod.errors import LorapodError
from lorapod.rundir.layout import METRICS
from lorapod.rundir.metrics import iter_records
from lorapod.ui import actions
from lorapod.ui.files import Refused, sample_lines, serve
from lorapod.ui.runs import MAX_POINTS, series
from lorapod.ui.views import dashboard

#: A run's chart reads at most the last CHART_TAIL bytes of metrics.jsonl in full and MAX_POINTS
#: stretches of CHART_WINDOW bytes of the rest (ui/files.py sample_lines): a few MB and tens of
#: milliseconds per request whatever the file's size (bench/ui_metrics.py).
CHART_TAIL = 2 * 1024 * 1024
CHART_WINDOW = 1024


def run_metrics(request: Request) -> Response:
    view = dashboard(request).index.find(request.path_params["job"])
    if view is None:
        return JSONResponse({"error": "no such run"}, 404)
    data, offset, size, sampled = sample_lines(view.root, METRICS, CHART_TAIL, MAX_POINTS, CHART_WINDOW)
    seen = {"rows": 0, "last_step": None}

    def rows() -> Iterator[dict[str, Any]]:  # counted as the series take them: no list of every record
        for rec in iter_records(data):  # the one reader's policy (rundir/metrics.py)
            seen["rows"] += 1
            step = rec.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                seen["last_step"] = step if seen["last_step"] is None else max(seen["last_step"], step)
            yield rec

    out = series(rows())
    return JSONResponse({"offset": offset, "rows": seen["rows"], "sampled": sampled, "bytes": size, "tail_bytes": CHART_TAIL,
                         "last_step": seen["last_step"], "max_points": MAX_POINTS, "series": out})


def run_file(request: Request) -> Response:
    view = dashboard(request).index.find(request.path_params["job"])
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


async def run_action(request: Request) -> Response:
    dash = dashboard(request)
    what = request.path_params["action"]
    fn = {"pull": actions.pull, "stop": actions.stop, "destroy": actions.destroy}.get(what)
    if fn is None:
        return JSONResponse({"ok": False, "lines": [f"unknown action {what}"]}, 404)
    try:
        out = await run_in_threadpool(fn, dash.index, request.path_params["job"])
    except LorapodError as exc:
        return JSONResponse({"ok": False, "lines": [exc.message, *([exc.hint] if exc.hint else [])]}, 409)
    return JSONResponse(out.to_json(), 200 if out.ok else 409)
