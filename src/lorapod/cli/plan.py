"""``lorapod plan``: which GPU fits, and which GPU x provider is cheapest per job.

Thin: the numbers come from :func:`lorapod.plan.choose.plan_job` and
:func:`lorapod.plan.storage.advise`, with the same parameter names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lorapod.catalog.prices import snapshot_providers
from lorapod.errors import PlanError
from lorapod.trainers import hint as trainer_hint

if TYPE_CHECKING:
    from lorapod.plan.choose import Plan

console = Console()


def _fmt_min(hours: float) -> str:
    m = hours * 60
    return f"{m:.0f}m" if m < 90 else f"{hours:.1f}h"


def plan_command(
    spec: Path | None = typer.Argument(None, help="Job spec (YAML). Not needed with --storage."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
    gpu: str | None = typer.Option(None, "--gpu", help="Only this GPU, e.g. 'RTX 3090' (shown even if it does not fit)."),
    provider: str | None = typer.Option(None, "--provider", help=f"Only this provider: {' | '.join(snapshot_providers())} "
                                        "(the price snapshot's; with --live, a registered provider's live prices "
                                        "too); any: every provider, whatever compute.provider says."),
    any_gpu: bool = typer.Option(False, "--any-gpu", help="Every GPU, whatever compute.gpu pins (with --provider "
                                 "any: the whole market)."),
    live: bool = typer.Option(False, "--live", help="Refresh prices from every registered provider that lists them "
                              "(its price_key_env: RUNPOD_API_KEY, VAST_API_KEY for the built-ins)."),
    set_: list[str] = typer.Option([], "--set", help="Override a spec value, e.g. --set train.micro_batch_size=2."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs per instance (compute.gpus), data-parallel."),
    images: int | None = typer.Option(None, "--images", help="Image count when data.path is not on this machine."),
    examples: int | None = typer.Option(None, "--examples", help="Chat example count when the data file is not here."),
    trainer: str | None = typer.Option(None, "--trainer", help="Price the job as an external trainer runs it: "
                                       f"{trainer_hint()} (setup time, VRAM)."),
    storage: bool = typer.Option(False, "--storage", help="Advise which disk to pay for instead of planning a job."),
    model_gb: float | None = typer.Option(None, "--model-gb", help="--storage: size of the models you keep."),
    sessions_per_month: float | None = typer.Option(None, "--sessions-per-month", help="--storage, and the network "
                                                    "volume's price against re-downloads: sessions a month (default 4)."),
    hours_per_session: float | None = typer.Option(None, "--hours-per-session", help="--storage: hours per session."),
    explain: bool = typer.Option(False, "--explain", help="Show what the #1 estimate rests on: terms, fitted factors, "
                                 "nearest published points, your own runs."),
    sort: str = typer.Option("rank", "--sort", help="rank: the plan's order ($ per job + compute.hour_worth_usd "
                             "per hour, offers within the caps first: what `lorapod run` rents); usd: cheapest "
                             "first; time: fastest first. Either way the fastest option under compute.max_usd is "
                             "marked."),
) -> None:
    """Rank every GPU x provider x tier that fits the job by total dollars per job, with time and $ by phase."""
    if storage:
        _storage(model_gb, sessions_per_month, hours_per_session, json_out)
        return
    if spec is None:
        raise PlanError("no spec given", hint="lorapod plan examples/sdxl-object-lora.yaml, or --storage --model-gb N ...")
    from lorapod.plan.choose import plan_job
    from lorapod.spec import load_spec

    job_spec = load_spec(spec, [*set_, f"compute.gpus={gpus}"] if gpus else set_)
    if any_gpu:
        if gpu:
            raise PlanError(f"--any-gpu and --gpu {gpu!r} contradict each other", hint="give one of them")
        job_spec = job_spec.model_copy(update={"compute": job_spec.compute.model_copy(update={"gpu": None})})
    prices, notes, got = None, [], None
    if live:
        from lorapod.catalog.gpus import find_gpu
        from lorapod.compute.live_prices import live_prices

        got = live_prices(job_spec.compute.disk_gb, [find_gpu(gpu)] if gpu else None)
        prices, notes = got.entries, got.notes
    if sort not in ("rank", "usd", "time"):
        raise PlanError(f"--sort {sort!r}: rank by usd or time, or the plan's own rank", hint="lorapod plan SPEC --sort time")
    from lorapod.compute.provider import load_facts

    load_facts()  # how each provider bills (its class's Billing): the planner reads them as data
    plan = plan_job(job_spec, gpu=gpu, provider=provider, prices=prices, images=images, examples=examples,
                    trainer=trainer)
    from lorapod.plan.volume import VAST_NOTE, volume_advice, with_volume

    plan = with_volume(plan)
    market = _whole_market(job_spec, plan, prices, images, examples, trainer) if plan.pinned else None
    if sort == "time":  # plan_job ranks by $ + hours; fitting options first either way
        plan.options.sort(key=lambda o: (not o.fits, o.hours_total, o.usd_total))
    elif sort == "usd":
        plan.options.sort(key=lambda o: (not o.fits, o.usd_total, o.hours_total))
    why = _explanation(plan, gpu) if explain else None
    vol = volume_advice(plan, sessions_per_month)
    from lorapod.plan.cost import deadman_line, deadman_minutes

    best = plan.best
    switch_min = deadman_minutes(job_spec, best.provider if best is not None else None)
    switch = deadman_line(switch_min, best.usd_per_hour if best is not None else None,
                          f"{best.gpu} on {best.provider}" if best is not None else "")
    if json_out:
        out = plan.to_json()
        out["deadman"] = {"minutes": switch_min, "line": switch}
        out["volume"] = {"runpod": vol.to_json() if vol is not None else None, "vast": VAST_NOTE}
        fastest = _fastest_under_cap(plan)
        out["sort"] = sort
        out["whole_market"] = market.to_json() if market is not None else None
        out["fastest_under_cap"] = plan.options.index(fastest) if fastest is not None else None
        if why is not None:
            out["explain"] = why.to_json()
        typer.echo(json.dumps(out, indent=2))
        return
    if got is not None:  # first, not after 45 lines: whether --live got any live price
        console.print(escape(got.headline(plan.snapshot_note)), style="bold" if not got.refreshed else None,
                      highlight=False, soft_wrap=True)
    _print_plan(plan, notes, sort, spec, market)
    for line in [*(vol.lines() if vol is not None else []),
                 *([VAST_NOTE] if job_spec.compute.volume or any(o.provider == "vast" for o in plan.options) else [])]:
        console.print(f"[dim]volume:[/] {escape(line)}", highlight=False)  # wrapped to the terminal
    console.print(f"[dim]{escape(switch)}[/]", highlight=False)
    if why is not None:
        from lorapod.plan.explain import lines

        for line in lines(why):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _whole_market(job_spec, plan: Plan, prices, images, examples, trainer):
    """The cheapest fitting offer over every GPU and provider, when the plan was pinned (None when
    nothing fits there either, or it is the pinned plan's own #1)."""
    from lorapod.plan.choose import plan_job

    wide = job_spec.model_copy(update={"compute": job_spec.compute.model_copy(update={"gpu": None,
                                                                                    "provider": "any"})})
    try:
        best = plan_job(wide, prices=prices, images=images, examples=examples, trainer=trainer).best
    except PlanError:
        return None
    mine = plan.best
    if best is None or (mine is not None and (best.gpu, best.provider, best.tier) == (mine.gpu, mine.provider, mine.tier)):
        return None
    return best


def _pinned_line(plan: Plan, spec_path: Path | None, market) -> str:
    """What narrowed the table, and the command for the whole market (with its cheapest offer)."""
    from lorapod.plan.cost import cents

    pins = plan.pinned
    gpu = next((v for k, v in pins.items() if k.endswith("gpu")), None)
    prov = next((v for k, v in pins.items() if k.endswith("provider")), None)
    what = " on ".join(x for x in (gpu or "every GPU", prov) if x)
    flags = [f for x, f in ((gpu, "--any-gpu"), (prov, "--provider any")) if x]
    cmd = " ".join(["lorapod plan", *([str(spec_path)] if spec_path else []), *flags])
    cheaper = (f" (cheapest there: {market.gpu} on {market.provider} at ${market.usd_per_hour:.2f}/h, "
               f"{_fmt_min(market.hours_total)} for ${cents(market.usd_total)})") if market is not None else ""
    return f"only {what}: pinned by {' and '.join(pins)}; the whole market: {cmd}{cheaper}"


def _explanation(plan: Plan, gpu: str | None):
    """The explanation of the #1 option (or of the pinned GPU)."""
    from lorapod.catalog.gpus import find_gpu
    from lorapod.plan.explain import explain

    best = plan.best or plan.options[0]
    return explain(plan.job, find_gpu(gpu or best.gpu), best.speed)


def _print_plan(plan: Plan, notes: list[str], sort: str = "usd", spec_path: Path | None = None,
                market=None) -> None:
    from lorapod.plan.cost import cents

    job = plan.job
    size = (f"{job.images} images -> {job.steps_label}" if job.is_image
            else f"{job.examples} examples, {job.tokens:,} tokens -> {job.steps_label}")
    console.print(f"[bold]{job.model_name}[/] · {size} · peak VRAM about [bold]{job.estimate.peak_gb:.1f} GB[/]")
    chosen = plan.chosen
    if chosen is not None:
        console.print(_likely_line(*chosen, width=console.width), highlight=False, soft_wrap=True)
    else:  # never head the table with a GPU that does not fit
        o = plan.options[0]
        fix = plan.fixes.get(o.gpu)
        console.print(f"[red]no offer fits[/]: {o.gpu} needs about {o.vram_peak_gb:.1f} GB, "
                      f"{-o.headroom_gb:.1f} GB more than it has; "
                      + (f"it fits with {fix.describe()}" if fix else "no setting change makes it fit"),
                      highlight=False)
    if plan.pinned:
        console.print(f"[bold]{escape(_pinned_line(plan, spec_path, market))}[/]", highlight=False)
    narrow, ranges = console.width < 120, console.width >= 140
    table = _offers_table(plan, narrow=narrow, ranges=ranges, sort=sort)
    console.print(table)
    if narrow or not ranges:
        left = "speed, train time, VRAM headroom and the likely range" if narrow else "the likely range per row"
        console.print(f"[dim]{left} left out at {console.width} columns: {140 if not narrow else 120}+ columns "
                      "show them, --json has everything[/]", highlight=False)
    _print_spot(plan)
    fastest = _fastest_under_cap(plan)
    if fastest is not None and fastest is not (plan.best or plan.options[0]):
        i = plan.options.index(fastest) + 1
        cap = job.spec.compute.max_usd
        console.print(f"fastest{f' under the ${cap:.2f} cap' if cap else ''}: #{i} {fastest.gpu} on {fastest.provider} "
                      f"({fastest.tier}), {_fmt_min(fastest.hours_total)} for ${cents(fastest.usd_total)}"
                      + ("  (--sort time ranks by time)" if plan.options.index(fastest) else ""), highlight=False)
    best, spot = chosen if chosen is not None else (plan.options[0], False)
    if spot and best.spot is not None:
        q = best.spot
        title = (f"Phases, the tier chosen: {best.gpu} on {best.provider}, spot ({q.tier} ${q.bid_per_gpu_hour:.2f}/h; "
                 f"on-demand: row #{plan.options.index(best) + 1})")
        rows, hours, usd = best.spot_phases(), q.expected.hours, q.expected.usd
    else:
        head = f"#{plan.options.index(best) + 1}" if best.fits else "does not fit"
        title = f"Phases, {head}: {best.gpu} on {best.provider} ({best.tier})"
        rows, hours, usd = best.phases, best.hours_total, best.usd_total
    phases = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    phases.add_column("phase")
    phases.add_column("time", justify="right")
    phases.add_column("$", justify="right")
    for p in rows:
        phases.add_row(p.name, _fmt_min(p.hours) if p.hours else "", f"{p.usd:.3f}")
    phases.add_row("[bold]total[/]", _fmt_min(hours), f"[bold]{cents(usd)}[/]")
    mem = Table(title="Peak VRAM breakdown (GB)", title_justify="left", box=box.SIMPLE_HEAD)
    mem.add_column("part")
    mem.add_column("GB", justify="right")
    for name, gb in job.estimate.parts.items():
        mem.add_row(name, f"{gb:.2f}")
    mem.add_row("[bold]peak[/]", f"[bold]{job.estimate.peak_gb:.2f}[/]")
    console.print(phases)
    console.print(mem)
    from lorapod.compute.preflight import image_notes

    images = image_notes(job.spec, [o.provider for o in plan.options])
    for w in dict.fromkeys([*plan.warnings, *best.warnings, *images]):
        console.print(f"[yellow]![/] {w}", highlight=False)
    live = any(o.price_source == "live" for o in plan.options)
    console.print(f"[dim]{plan.snapshot_note}{' (* = live)' if live else ''}; assumptions: docs/planner.md[/]",
                  highlight=False)


def _print_spot(plan: Plan) -> None:
    """The interruptible tier of each GPU x provider that has one (plan/spot.py), once per pair,
    then which tier the plan would pick and why, and that runs stay on-demand for now."""
    from lorapod.plan.cost import cents
    from lorapod.plan.spot import RUNTIME_NOTE

    seen: set[tuple[str, str]] = set()
    rows = []
    for o in plan.options:
        if o.spot is None or not o.fits or (o.provider, o.gpu) in seen:
            continue
        seen.add((o.provider, o.gpu))
        q = o.spot
        every = q.expected.interval * 60
        rows.append([o.provider, o.gpu, q.tier, f"{q.bid_per_gpu_hour:.2f}",
                     f"{q.rate.per_hour:.2g} ({q.rate.low:.2g}-{q.rate.high:.2g})",
                     f"{every:.0f}m" if every < 10_000 else "-", f"{q.expected.preemptions:.2f}",
                     _fmt_min(q.expected.hours), f"${cents(q.expected.usd)}",
                     f"${cents(q.low.usd)}-{cents(q.high.usd)}", f"${cents(o.usd_total)}"])
    if rows:
        cols = ["provider", "GPU", "tier", "bid/h", "preempt/h", "ckpt", "preempt", "total", "$/job", "likely",
                "on-demand"]
        keep = cols if console.width >= 120 else ["provider", "GPU", "bid/h", "total", "$/job", "likely", "on-demand"]
        table = Table(title="Spot (interruptible): expected per job, preemptions included", title_justify="left",
                      box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=console.width >= 120)
        for col in keep:
            table.add_column(col, justify="left" if col in ("provider", "GPU", "tier") else "right", no_wrap=True)
        for r in rows:
            table.add_row(*[v for c, v in zip(cols, r, strict=True) if c in keep])
        console.print(table)
        first = next(o.spot for o in plan.options if o.spot is not None)
        console.print(f"[dim]preemption rate: {escape(first.rate.basis)}[/]", highlight=False)
        windowed = [o for o in plan.options if o.spot is not None and o.fits and o.spot.grace_s is not None]
        if windowed:  # the save on SIGTERM against the provider's window (the provider's Billing.sigterm_grace_s)
            w = max(windowed, key=lambda o: o.spot.save_s)
            console.print(f"[dim]save on SIGTERM: about {w.spot.save_s:.1f} s at most ({escape(w.gpu)}); "
                          f"{escape(w.provider)} gives {w.spot.grace_s:g} s before SIGKILL"
                          + ("" if all(o.spot.save_fits for o in windowed) else ": too slow, not taken") + "[/]",
                          highlight=False)
    tier = plan.tier
    if tier is not None and (rows or tier.policy != "never"):
        console.print(f"[bold]tier:[/] {tier.tier} (compute.spot: {tier.policy}): {escape(tier.reason)}",
                      highlight=False)
        if rows or tier.tier == "spot":
            console.print(f"[dim]{RUNTIME_NOTE}[/]", highlight=False)


def _fastest_under_cap(plan: Plan):
    """The quickest option that fits and stays under compute.max_usd (any fitting one without a cap)."""
    cap = plan.job.spec.compute.max_usd
    ok = [o for o in plan.options if o.fits and (cap is None or o.usd_total <= cap)]
    return min(ok, key=lambda o: (o.hours_total, o.usd_total)) if ok else None


def _fmt_range(hours: list[float]) -> str:
    lo, hi = hours
    if hi < 1.5:
        return f"{lo * 60:.0f}-{hi * 60:.0f}m"
    return f"{lo:.1f}-{hi:.1f}h"


def _likely_line(o, spot: bool = False, width: int = 0) -> str:
    """One sentence with the estimate of the option a run would rent (the #1 offer, or its spot
    tier when compute.spot picks it) and its likely range, and what it rests on. Wider than
    ``width`` (a narrow terminal), the memory part goes on a line of its own."""
    from lorapod.plan.cost import cents

    basis = "your runs" if o.speed.basis == "your runs" else "model"
    q = o.spot if spot else None
    lo, hi = q.hours_range if q is not None else o.hours_range
    total = q.expected.hours if q is not None else o.hours_total
    fmt = (lambda h: f"{h * 60:.0f}") if hi < 1.5 else (lambda h: f"{h:.1f}")
    unit = "min" if hi < 1.5 else "h"
    usd, (ulo, uhi) = (q.expected.usd, q.usd_range) if q is not None else (o.usd_total, o.usd_range)
    head = f"spot {o.gpu} on {o.provider}" if q is not None else f"#1 {o.gpu}"
    line = (f"{head}: {fmt(total)} {unit}, likely {fmt(lo)}-{fmt(hi)} ({basis}); ${cents(usd)}, likely "
            f"${cents(ulo)}-{cents(uhi)}")
    vram = f"VRAM likely {o.vram_range_gb[0]:.1f}-{o.vram_range_gb[1]:.1f} GB"
    if width and len(line) + 2 + len(vram) > width:
        return f"{line};\n  {vram}"
    return f"{line}; {vram}"


def _offers_table(plan: Plan, narrow: bool, ranges: bool = True, sort: str = "usd") -> Table:
    """The ranked offers. Narrow (80 columns, or piped): the columns that carry the decision
    (provider, GPU, tier, $/h, fits or not, total time, $/job) at full width; speed, train time,
    VRAM headroom and the likely range move out (they are in --json, the phase table and the
    "#1 ... likely" line above the table)."""
    from lorapod.plan.cost import cents

    job = plan.job
    cols = [("#", "right"), ("provider", "left"), ("GPU", "left"), ("tier", "left"), ("$/h", "right"),
            ("fit", "left"), ("speed", "right"), ("train", "right"), ("total", "right"), ("$/job", "right"),
            ("likely", "right")]
    ranges = ranges and not narrow  # the likely range per row needs ~140 columns
    if narrow:
        cols = [c for c in cols if c[0] not in ("speed", "train", "likely")]
    elif not ranges:
        cols = [c for c in cols if c[0] != "likely"]
    fastest = _fastest_under_cap(plan)
    worth = job.spec.compute.hour_worth_usd
    by = {"time": "time", "usd": "$ per job"}.get(sort, f"$ per job + ${worth:g} per hour (compute.hour_worth_usd)"
                                                  if worth else "$ per job")
    table = Table(title=f"Offers ranked by {by}"
                        + (" (bold: the fastest under the cap)" if fastest is not None and plan.job.spec.compute.max_usd
                           else ""), title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=not narrow)
    for col, just in cols:
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for i, o in enumerate(plan.options, 1):
        fit_color = {"fits": "green", "tight": "yellow"}.get(o.verdict, "red")
        fit = f"[{fit_color}]{o.verdict}[/]" + ("" if narrow else f" {o.headroom_gb:+.1f} GB")
        row = [str(i) if o.fits else "-", o.provider, o.gpu, o.tier + ("*" if o.price_source == "live" else ""),
               f"{o.usd_per_hour:.2f}", fit]
        if not narrow:
            train = next((p.hours for p in o.phases if p.name == "train"), 0.0)
            row += [f"{o.speed.it_per_s:.2f} it/s" if job.is_image else f"{o.speed.tokens_per_s:,.0f} tok/s",
                    _fmt_min(train)]
        row += [_fmt_min(o.hours_total), f"${cents(o.usd_total)}"]
        if ranges:
            row.append(_fmt_range(o.hours_range))
        table.add_row(*row, style="bold" if o is fastest else None)
    return table


def _storage(model_gb: float | None, sessions: float | None, hours: float | None, json_out: bool) -> None:
    from lorapod.plan.storage import advise

    missing = [n for n, v in (("--model-gb", model_gb), ("--sessions-per-month", sessions),
                              ("--hours-per-session", hours)) if v is None]
    if missing:
        raise PlanError(f"--storage needs {', '.join(missing)}",
                        hint="e.g. lorapod plan --storage --model-gb 260 --sessions-per-month 8 --hours-per-session 3")
    adv = advise(model_gb, sessions, hours)  # type: ignore[arg-type]
    if json_out:
        typer.echo(json.dumps(adv.to_json(), indent=2))
        return
    table = Table(title=f"{model_gb:g} GB of models, {sessions:g} sessions x {hours:g} h a month (RunPod)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("kind")
    table.add_column("$ / month", justify="right")
    table.add_column("why")
    for o in adv.options:
        mark = " [green]<- recommended[/]" if o.kind == adv.recommended else ""
        table.add_row(o.kind + mark, f"{o.usd_per_month:.2f}", o.detail)
    console.print(table)
    console.print(
        f"Rates for {model_gb:g} GB: container disk ${adv.container_running_month:.2f}/month while running, "
        f"volume disk ${adv.volume_stopped_month:.2f}/month while stopped, network volume "
        f"${adv.network_volume_month:.2f}/month.", highlight=False)
    console.print(f"[bold]{adv.recommended}[/]: {adv.reason}.", highlight=False)
    console.print("Vast.ai bills its storage while the instance exists, running or stopped: destroy it when done.")
    console.print(f"[dim]prices: storage snapshot of {adv.snapshot_date}; assumptions: docs/planner.md[/]")


def register(app: typer.Typer) -> None:
    from lorapod.cli.helptext import renew_option_help

    renew_option_help(plan_command, "trainer", f"Price the job as an external trainer runs it: {trainer_hint()} (setup time, VRAM).")  # a trainer registered since this module's import too
    app.command("plan")(plan_command)
