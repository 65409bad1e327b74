"""What the dashboard's pages show, assembled from the library: the app's state (:class:`Dashboard`:
where runs are, the templates, which specs and data folders the Plan and Data pages offer), a run
page's context, the Runs page's sweep groups, and what each button's confirmation says.

The decisions are the library's: the plan is :meth:`lorapod.plan.choose.Plan.to_page`, the last
checkpoint :func:`lorapod.rundir.last_checkpoint`, the last validation loss
:func:`lorapod.rundir.last_loss` (as a sweep ranks runs).
"""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from lorapod.catalog import families
from lorapod.errors import LorapodError
from lorapod.rundir import last_checkpoint
from lorapod.store.preemptions import job_figures
from lorapod.ui.runs import (
    RunIndex,
    RunView,
    answers,
    evaluation,
    logs,
    no_step_none,
    quality,
    sample_prompt,
    samples,
    spec_dict,
)

PER_PAGE = 48  # samples per gallery page
FAMILIES = families.NAMES  # what `lorapod data report --family` takes (catalog/families.py)


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
        """The planner's page for a spec (:meth:`lorapod.plan.choose.Plan.to_page`), kept while the
        spec file is unchanged (planning takes seconds)."""
        key = (str(spec_path), spec_path.stat().st_mtime_ns)
        if key not in self._plans:
            self._plans[key] = plan_json(spec_path)
        return self._plans[key]

    # -------------------------------------------------------------- choices for Plan and Data

    def specs(self, views: list[RunView] | None = None) -> list[Path]:
        """What the Plan page offers: ``--spec`` files, the runs' own specs, then the example specs
        (``examples/*.yaml`` in the folder the dashboard runs in, and in lorapod's own checkout):
        issue 48, F7, the page offered only a demo run's spec and named examples it did not list.
        A spec on the built-in demo model (``lorapod:``) is left out: there is no GPU to plan it on."""
        out: list[Path] = []
        run_specs = [v.spec_file for v in (views if views is not None else self.index.views(progress=False))]
        for p in [*self.extra_specs, *run_specs, *example_specs()]:
            if p is not None and p.is_file() and p not in out and not _on_builtin_model(p):
                out.append(p)
        return out

    def data_folders(self, views: list[RunView] | None = None) -> list[Path]:
        """``--data`` folders and each run's ``data.path`` that is a folder here (images, clips)."""
        return [f for f, _ in self.data_choices(views)]

    def data_choices(self, views: list[RunView] | None = None) -> list[tuple[Path, dict[str, Any]]]:
        """(folder, how the data check judges it) for the Data page: ``--data`` folders (SDXL, no
        trigger, until the page's fields say otherwise), then the image or clip folders the runs'
        specs name (relative names from the spec's own folder), with the spec's family and trigger:
        what ``lorapod data check --family F --trigger T`` and data/check.py ``spec_check_args`` pass
        (issue 48, F8: the page found 5 errors where the CLI found 6, missing trigger)."""
        out: list[tuple[Path, dict[str, Any]]] = [(p, {"family": families.DEFAULT_IMAGE_FAMILY, "trigger": None}) for p in self.extra_data]
        for v in views if views is not None else self.index.views(progress=False):
            spec = spec_dict(v.spec_file)
            data, model = spec.get("data"), spec.get("model")
            data = data if isinstance(data, dict) else {}
            paths = data.get("path")
            family = model.get("family") if isinstance(model, dict) else None
            args: dict[str, Any] = {"family": family if family in FAMILIES else families.DEFAULT_IMAGE_FAMILY,
                                    "trigger": data["trigger"] if isinstance(data.get("trigger"), str) else None}
            if isinstance(data.get("target_frames"), list) and all(isinstance(n, int) for n in data["target_frames"]):
                args["target_frames"] = tuple(data["target_frames"])
            if isinstance(data.get("fps"), int | float) and not isinstance(data.get("fps"), bool):
                args["fps"] = float(data["fps"])
            for p in paths if isinstance(paths, list) else [paths]:
                if not isinstance(p, str) or v.spec_file is None:
                    continue
                path = Path(p).expanduser()
                path = (path if path.is_absolute() else v.spec_file.parent / path).resolve()
                if path.is_dir() and path not in [f for f, _ in out]:
                    out.append((path, args))
        return out


def example_specs() -> list[Path]:
    """``examples/*.yaml`` of the current folder and of the lorapod checkout this runs from (an
    editable install or a clone: ``src/lorapod`` -> the repository), each file once."""
    import lorapod

    roots = [Path.cwd() / "examples", Path(lorapod.__file__).resolve().parents[2] / "examples"]
    found: list[Path] = []
    for root in roots:
        if root.is_dir():
            found += [p.resolve() for p in sorted(root.glob("*.yaml")) if p.resolve() not in found]
    return found


def _on_builtin_model(spec_path: Path) -> bool:
    from lorapod.catalog.models import is_builtin

    model = spec_dict(spec_path).get("model")
    mid = model.get("id") if isinstance(model, dict) else None
    return isinstance(mid, str) and is_builtin(mid)


def plan_json(spec_path: Path) -> dict[str, Any]:
    """The Plan page's plan of one spec file: the planner's own :meth:`~lorapod.plan.choose.Plan.to_page`."""
    from lorapod.plan.choose import plan_job
    from lorapod.spec import load_spec

    return plan_job(load_spec(spec_path)).to_page()


def dashboard(request: Request) -> Dashboard:
    """The :class:`Dashboard` the app was built with (``app.state.dash``, ui/app.py)."""
    dash: Dashboard = request.app.state.dash
    return dash


# ----------------------------------------------------------------------------- what pages show


def groups(dash: Dashboard, views: list[RunView]) -> list[dict[str, Any]]:
    """Sweeps, each with its shared cap and what its jobs spent, then the other runs; groups with a
    running job first."""
    from lorapod.ui.runs import sweeps

    found = sweeps({v.root.parent for v in views})
    out, used = [], set()
    for s in found:
        # in the index's order (running first); a job is in one group, shown once
        members = [v for v in views if v.job_id in s["jobs"] and v.job_id not in used]
        if not members:
            continue
        used.update(v.job_id for v in members)
        spent = sum(v.usd for v in members)
        out.append({"sweep": s, "views": members, "usd": spent,
                    "fraction": min(1.0, spent / s["max_usd"]) if s["max_usd"] else None})
    rest = [v for v in views if v.job_id not in used]
    if rest:
        out.append({"sweep": None, "views": rest})
    return sorted(out, key=lambda g: not any(v.active for v in g["views"]))  # stable: sweeps before the rest


def run_context(dash: Dashboard, view: RunView, page: int = 1) -> dict[str, Any]:
    found = samples(view.root)
    flat = [(g["tag"], f) for g in found for f in g["files"]]
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
    spot = None  # on spot: preemptions, their cost, the savings vs on-demand (store/preemptions.py)
    try:
        ledger = dash.index.ledger() if view.in_ledger else None
        if ledger is not None:
            try:
                ledger_events = [{**e, "message": no_step_none(e.get("message"))}  # a ledger's older rows
                                 for e in ledger.events(view.job_id)[-200:]]
                spot = job_figures(ledger, view.job_id)
            finally:
                ledger.close()
    except (sqlite3.Error, LorapodError):  # locked, or damaged (LedgerDamaged)
        pass  # the Runs page says the ledger cannot be read; this page still shows the run folder
    phases = [{"name": k, "s": s, "usd": view.setup_usd.get(k, 0.0)} for k, s in view.setup_s.items()]
    said = answers(view.root)  # an LLM run's samples are answers, not pictures (issue 48, F23)
    spec = spec_dict(view.root / "spec.yaml")
    sample_spec = spec.get("samples") if isinstance(spec.get("samples"), dict) else {}
    no_prompts = not sample_spec.get("prompts")
    return {"view": view, "gallery": gallery, "page": page, "pages": pages,
            "n_samples": len(flat) + sum(len(a["rows"]) for a in said), "answers": said, "no_prompts": no_prompts,
            "evaluation": evaluation(view.root), "logs": logs(view.root), "ledger_events": ledger_events,
            "quality": quality(view.root),
            "phases": phases, "last_ckpt": last_ckpt, "confirm": confirms(view, last_ckpt), "spot": spot}


def confirms(view: RunView, last_ckpt: str | None) -> dict[str, str]:
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
