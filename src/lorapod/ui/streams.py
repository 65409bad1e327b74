"""The dashboard's server-sent events: the Runs table, and one run's new metrics lines and status.

The Runs table and a run's status are re-rendered fragments every two seconds; a run's new metrics
lines are sent as they are appended (read from the byte offset the page last had, so a
reconnecting ``EventSource`` sends it back as ``Last-Event-ID`` and misses nothing).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from lorapod.rundir.layout import METRICS
from lorapod.rundir.metrics import parse_records
from lorapod.ui.files import read_from
from lorapod.ui.live import GIVE_UP_AFTER, RemoteTail
from lorapod.ui.runs import CHART_KEYS
from lorapod.ui.views import dashboard, groups

POLL_S = 0.5  # how often a stream looks at metrics.jsonl
STATUS_EVERY_S = 2.0
STREAM_S = 300.0  # a stream ends after this; EventSource reconnects with its Last-Event-ID


def _compact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = {k for ks in CHART_KEYS.values() for k in ks} | {"step", "step_time_s", "tokens_per_s"}
    return [{k: r[k] for k in keys if k in r} for r in rows]


async def run_stream(request: Request) -> Response:
    dash = dashboard(request)
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
    tail = RemoteTail(dash.index, view.job_id, _size(view.root / METRICS)) \
        if view.in_ledger and view.active and view.live_instances else None

    async def events() -> AsyncIterator[str]:
        nonlocal offset
        end = time.monotonic() + STREAM_S
        next_status = 0.0
        last_html = None
        yield "retry: 1000\n\n"
        try:
            while time.monotonic() < end:
                data, offset = await run_in_threadpool(read_from, view.root, METRICS, offset)
                if data:
                    rows = _compact(parse_records(data))
                    yield f"id: {offset}\nevent: metrics\ndata: {json.dumps({'offset': offset, 'rows': rows})}\n\n"
                if tail is not None and tail.due():
                    live = await run_in_threadpool(tail.read)
                    if live:
                        rows = _compact(parse_records(live))
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


async def runs_stream(request: Request) -> Response:
    dash = dashboard(request)

    async def events() -> AsyncIterator[str]:
        end = time.monotonic() + STREAM_S
        last = None
        yield "retry: 1000\n\n"
        while time.monotonic() < end:
            views = await run_in_threadpool(dash.index.views)
            html = dash.render("_runs_table.html", groups=groups(dash, views), views=views,
                               ledger_error=dash.index.ledger_error)
            if html != last:
                last = html
                yield f"event: runs\ndata: {json.dumps({'html': html})}\n\n"
            else:
                yield ": ping\n\n"
            await asyncio.sleep(STATUS_EVERY_S)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})
