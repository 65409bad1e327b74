"""The dashboard's HTML pages: Runs, one run, Compare, Plan, Data and the data report.

Each handler reads the request, asks :mod:`lorapod.ui.views` (and through it the library) what to
show, and renders a template; none decides anything about a run itself.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from lorapod.catalog.families import NAMES as FAMILY_NAMES
from lorapod.errors import LorapodError
from lorapod.rundir import last_loss
from lorapod.ui.runs import CHART_KEYS, read_metrics
from lorapod.ui.views import dashboard, groups, run_context


def runs_page(request: Request) -> Response:
    dash = dashboard(request)
    views = dash.index.views()
    return dash.page("runs.html", views=views, groups=groups(dash, views), nav="runs",
                     ledger_error=dash.index.ledger_error)


def run_page(request: Request) -> Response:
    dash = dashboard(request)
    view = dash.index.find(request.path_params["job"])
    if view is None:
        return dash.page("missing.html", 404, what=request.path_params["job"], nav="runs")
    try:
        page = int(request.query_params.get("page", "1"))
    except ValueError:
        page = 1
    return dash.page("run.html", nav="runs", charts=CHART_KEYS, **run_context(dash, view, page))


def compare_page(request: Request) -> Response:
    """Ticked runs side by side: one table, their loss curves on one chart each."""
    dash = dashboard(request)
    wanted = request.query_params.getlist("job")[:8]
    views = [v for v in dash.index.views() if v.job_id in wanted]
    # the last validation-type loss, as a sweep ranks runs (rundir.last_loss)
    val = {v.job_id: last_loss(read_metrics(v.root))[1] for v in views}
    return dash.page("compare.html", views=views, val=val, nav="runs")


def plan_page(request: Request) -> Response:
    dash = dashboard(request)
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


def _check_args(request: Request, args: dict[str, Any]) -> dict[str, Any]:
    """The data check's family and trigger: the page's fields when given, else the spec's
    (:meth:`Dashboard.data_choices`). An empty field keeps the spec's; a family outside the table
    or a trigger that is not one short word is ignored, never passed on."""
    out = dict(args)
    fam = request.query_params.get("family")
    if fam in FAMILY_NAMES:
        out["family"] = fam
    trig = (request.query_params.get("trigger") or "").strip()
    if re.fullmatch(r"[\w.-]{1,64}", trig):  # an empty field keeps the spec's
        out["trigger"] = trig
    return out


def data_page(request: Request) -> Response:
    dash = dashboard(request)
    choices = dash.data_choices()
    folders = [f for f, _ in choices]
    pick = request.query_params.get("folder")
    chosen = None
    ctx: dict[str, Any] = {"folders": folders, "families": FAMILY_NAMES, "nav": "data", "args": None}
    if pick is not None:
        try:
            chosen = int(pick)
            if not 0 <= chosen < len(folders):
                raise IndexError(chosen)
        except (ValueError, IndexError):
            return dash.page("data.html", 404, **{**ctx, "chosen": None})
        args = _check_args(request, choices[chosen][1])
        ctx["args"] = args
        ctx["query"] = urlencode({k: v for k, v in (("family", args["family"]), ("trigger", args.get("trigger")))
                                  if v})
    return dash.page("data.html", **{**ctx, "chosen": chosen})


def data_report(request: Request) -> Response:
    """The data report's own HTML (data/report.py, escaped there), shown in a sandboxed frame."""
    from lorapod.data.check import check_path
    from lorapod.data.report import build_html

    dash = dashboard(request)
    try:
        folder, args = dash.data_choices()[int(request.path_params["n"])]
    except (ValueError, IndexError):
        return PlainTextResponse("no such folder", 404)
    try:
        report = check_path(folder, **_check_args(request, args))
        return HTMLResponse(build_html(report))
    except LorapodError as exc:
        return dash.page("missing.html", 400, what=f"{folder}: {exc.message}", nav="data")
