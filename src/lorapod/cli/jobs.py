"""``lorapod ps | logs | pull | down``: look at and clean up remote jobs, from the ledger."""

from __future__ import annotations

import json

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from lorapod.rundir.layout import METRICS

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("ps")
    def ps(
        all_: bool = typer.Option(True, "--all/--live", help="Every job, or only those with live instances."),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout, for scripts."),
    ) -> None:
        """Jobs and their instances: state, GPU, $/h, dollars so far. Reads the ledger only (a
        read-only LORAPOD_HOME will do); with a damaged ledger, what RunPod and Vast.ai list."""
        from lorapod.cli.volumes import monthly_line
        from lorapod.compute.jobs import ps_rows, ps_rows_from_providers
        from lorapod.deploy.serverless import (
            describe_endpoint,
            endpoint_rows,
            labelled_endpoints,
            live_endpoints,
        )
        from lorapod.store.ledger import Ledger, LedgerDamaged

        ledger: Ledger | None = None
        try:
            ledger = Ledger.read_only()
            rows = ps_rows(ledger, all_jobs=all_)
            endpoints = live_endpoints(ledger)
        except LedgerDamaged as exc:
            err.print(f"[bold red]warning:[/] {exc.message}; showing what the providers list instead", markup=True,
                      highlight=False, soft_wrap=True)
            err.print(f"  -> {exc.hint}", markup=False, highlight=False, soft_wrap=True)
            rows = ps_rows_from_providers(say=lambda m: err.print(m, markup=False))
            # endpoints bill too: RunPod lists them by the name lorapod gave them (ps only reads)
            endpoints = labelled_endpoints(say=lambda m: err.print(m, markup=False)) if _has_runpod_key() else []
        if as_json:
            typer.echo(json.dumps(rows + endpoint_rows(endpoints)))
            return
        volumes = monthly_line()
        if volumes:
            console.print(volumes, markup=False, soft_wrap=True)
        for ep in endpoints:
            console.print(describe_endpoint(ep), markup=False, soft_wrap=True)
        if not rows:
            every = len(ledger.jobs()) if ledger is not None and not all_ else 0
            console.print(f"no live jobs ({every} finished or stopped: `lorapod ps` lists them)" if every
                          else "no live jobs" if not all_ else "no jobs yet (lorapod run SPEC --on ...)")
            return
        console.print(_jobs_narrow(rows, console.width) if console.width < 120 else _jobs_table(rows))
        for r in rows:
            if r.get("watchdog") == "down":
                console.print(f"[bold red]job {r['job']}: the watchdog on its instance is down;[/] nothing there "
                              "destroys it if the controller dies (`lorapod down` stops it)")
            elif r.get("watchdog") == "unknown":
                console.print(f"[bold yellow]job {r['job']}: no controller follows it, so nobody checks the watchdog "
                              "on its instance;[/] `lorapod down --orphans` destroys it, `lorapod run --resume "
                              f"{r['job']}` follows it again")
            if r.get("unconfirmed"):
                console.print(f"[bold red]job {r['job']}: instance {', '.join(r['unconfirmed'])} not confirmed "
                              f"destroyed; it may still bill.[/] Run `lorapod down {r['job']}`")
        from lorapod.store.phases import describe
        from lorapod.store.preemptions import SpotFigures

        for r in rows:
            if r["setup_s"]:
                console.print(f"[dim]{r['job']} setup: {describe(r['setup_s'])}[/]")
            if r.get("spot"):
                fig = SpotFigures(**r["spot"])
                console.print(f"{r['job']} {fig.line()} ({r['instances']} instance(s), one $ cap)", markup=False)
        live = sum(r["live_instances"] for r in rows)
        console.print(f"{live} live instance(s)" + (" - `lorapod down --orphans` cleans up any left behind"
                                                   if live else ""))

    @app.command("logs")
    def logs(
        job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
        follow: bool = typer.Option(False, "-f", "--follow", help="Keep following, reconnecting as needed."),
        raw: bool = typer.Option(False, "--raw", help="metrics.jsonl lines as the JSON the job wrote."),
    ) -> None:
        """Progress (step/total, loss, val loss, ETA, $ so far of the cap, $ to finish) and the job's log,
        live from the instance or from the pulled run folder."""
        from lorapod.compute.joblogs import follow_logs, local_run_logs
        from lorapod.compute.jobs import NoSuchJob, find_job, find_local_run
        from lorapod.store.ledger import Ledger

        ledger = Ledger()
        try:
            row = find_job(ledger, job)
        except NoSuchJob as exc:  # a `lorapod train` run is in no ledger: its folder, or one in ./runs
            local = find_local_run(job)
            if local is None:
                raise NoSuchJob(exc.message, hint=f"{exc.hint}; a `lorapod train` run: lorapod logs runs/JOB") from None
            row = None
        show = None if raw else _MetricsLines(ledger, row)
        lines = follow_logs(ledger, job, follow) if row is not None else local_run_logs(local, follow)
        for line in lines:
            if show is not None and line.startswith(METRICS_TAG):
                rendered = show(line[len(METRICS_TAG):])
                if rendered is not None:
                    typer.echo(f"[metrics] {rendered}")
                continue
            typer.echo(line)
        from lorapod.store.preemptions import job_figures

        # on spot: the one meter's preemption figures (a local `lorapod train` run has none)
        if row is not None and (fig := job_figures(ledger, row.id)):
            typer.echo(f"[spot] {fig.line()}")

    @app.command("pull")
    def pull(job: str = typer.Argument(..., help="Job id (or a unique prefix).")) -> None:
        """Fetch checkpoints, samples and metrics from the instance now."""
        from lorapod.compute.jobs import pull_job
        from lorapod.store.ledger import Ledger

        n = pull_job(Ledger(), job)
        err.print(f"pulled {n} file(s)")

    @app.command("stop")
    def stop(
        job: str = typer.Argument(..., help="Job id, or the folder of a run on this machine (`lorapod train`)."),
        reason: str = typer.Option("stop requested with lorapod stop", "--reason", help="Written into STOP and the "
                                   "ledger's events."),
    ) -> None:
        """Stop at the next save: the job saves a checkpoint at its next step and ends (a remote job is then
        pulled and its instance destroyed); nothing trained is lost. `lorapod down JOB` destroys at once."""
        from pathlib import Path

        from lorapod.compute.jobs import check_ref, stop_job
        from lorapod.errors import LorapodError
        from lorapod.rundir import RunDir, describe_holder
        from lorapod.store.ledger import Ledger

        folder = Path(check_ref(job, "job id or run folder"))
        if folder.is_dir():  # a run on this machine: its own STOP
            run = RunDir.open(folder)
            holder = run.writer()
            if holder is None:
                raise LorapodError(f"no process is writing {run.root}: there is nothing to stop",
                                   hint=f"resume it with `lorapod train --resume {run.root}`")
            path = run.request_stop(reason)
            err.print(f"wrote {path}: {describe_holder(holder)} saves a checkpoint at its next step and ends",
                      markup=False)
            return
        err.print(stop_job(Ledger(), job, reason), markup=False)

    @app.command("down")
    def down(
        job: str | None = typer.Argument(None, help="Job id whose instances to destroy."),
        orphans: bool = typer.Option(False, "--orphans", help="Destroy instances whose controller is gone "
                                     "and reconcile the ledger with the providers."),
        all_: bool = typer.Option(False, "--all", help="Destroy every live instance in the ledger."),
        as_json: bool = typer.Option(False, "--json", help="Counts as JSON on stdout."),
        all_installations: bool = typer.Option(False, "--all-installations", help="With --orphans: also "
                                               "destroy lorapod instances other installations (machines, "
                                               "LORAPOD_HOMEs, teammates) started on this account."),
        yes: bool = typer.Option(False, "--yes", help="Do not ask before --all-installations."),
        endpoint: str | None = typer.Option(None, "--endpoint", help="Delete this RunPod Serverless endpoint "
                                            "(and its template), from `lorapod deploy`."),
    ) -> None:
        """Destroy instances: one job's, orphans', or all of them; or a serverless endpoint."""
        from lorapod.compute.jobs import down_job, down_orphans, down_without_ledger
        from lorapod.errors import LorapodError
        from lorapod.store.ledger import Ledger, LedgerDamaged, LedgerUnusable

        def say(msg: str) -> None:
            err.print(msg, markup=False)

        if sum(bool(x) for x in (job, orphans, all_, endpoint)) != 1:
            raise LorapodError("say what to bring down", hint="lorapod down JOB | --orphans | --all | --endpoint ID")
        try:
            ledger = Ledger()  # a damaged ledger is set aside here, and the newest backup restored
        except (LedgerDamaged, LedgerUnusable) as exc:
            if endpoint:
                raise
            say(f"warning: {exc.message}; destroying from the providers' listings instead (RunPod, Vast.ai)")
            counts = down_without_ledger(job, say, lambda q: yes or typer.confirm(q, default=False, err=True))
            if orphans and _has_runpod_key():  # endpoints bill too: said, as the ledger cannot record them
                from lorapod.deploy.serverless import describe_endpoint, labelled_endpoints

                for ep in labelled_endpoints(say):
                    say(describe_endpoint(ep))
            if as_json:
                typer.echo(json.dumps(counts))
            else:
                err.print(", ".join(f"{k}: {v}" for k, v in counts.items()))
            if counts["failed"]:
                raise LorapodError(f"{counts['failed']} instance(s) not confirmed destroyed",
                                   hint="check the provider's console; `lorapod down` tries again") from None
            return

        if ledger.notice:
            say(f"warning: {ledger.notice}")
        if endpoint:
            from lorapod.deploy.serverless import down_endpoint

            gone = down_endpoint(endpoint, ledger=ledger)
            err.print(f"endpoint {endpoint} deleted" if gone else f"endpoint {endpoint} was already gone", markup=False)
            return

        if all_installations and not orphans:
            raise LorapodError("--all-installations goes with --orphans", hint="lorapod down --orphans --all-installations")
        if all_installations and not yes and not typer.confirm(
                "Destroy every lorapod instance on these accounts, including other machines' and teammates' "
                "running jobs?", default=False, err=True):
            raise LorapodError("nothing destroyed", hint="drop --all-installations to sweep only this installation's")
        if job:
            counts = {"destroyed": down_job(ledger, job, say=say)}
        else:
            counts = down_orphans(ledger, say=say, everything=all_, all_installations=all_installations)
            if orphans and _has_runpod_key():
                from lorapod.deploy.serverless import reconcile_endpoints

                counts.update(reconcile_endpoints(ledger, say))
        providers = counts.get("providers") or {}
        if as_json:
            typer.echo(json.dumps(counts))
        else:
            err.print(", ".join(f"{k}: {v}" for k, v in counts.items() if k not in ("providers", "unconfirmed")))
            asked = [n for n, v in providers.items() if v.startswith("asked")]
            if providers:
                err.print(f"providers asked: {', '.join(asked) or 'none'}"
                          + ("" if len(asked) == len(providers) else
                             f"; not asked: {', '.join(n for n in providers if n not in asked)} (see above: "
                             "their instances were not checked)"), markup=False)
        if job:
            left = [r for r in ledger.job_instances(ledger.job(job).id) if r.live]  # type: ignore[union-attr]
            if left:
                raise LorapodError(f"{len(left)} instance(s) of job {job} not confirmed destroyed: "
                                   f"{', '.join(r.provider_id or r.id for r in left)}",
                                   hint=f"check the provider's console; `lorapod down {job}` tries again")
        live = ledger.instances(live_only=True)
        if live and all_:
            raise LorapodError(f"{len(live)} instance(s) still live in the ledger",
                               hint="check the provider's console; `lorapod ps` lists them")
        if unconfirmed := counts.get("unconfirmed"):
            raise LorapodError(f"{len(unconfirmed)} destroy(s) not confirmed by the provider: {', '.join(unconfirmed)}",
                               hint="they may still bill: check the provider's console; `lorapod down --orphans` "
                                    "tries again")


def _has_runpod_key() -> bool:
    """Whether RunPod can be asked here (its key in the environment or lorapod's credentials)."""
    from lorapod.compute.httpapi import api_key
    from lorapod.errors import LorapodError

    try:
        api_key("RUNPOD_API_KEY", "runpod")
    except LorapodError:
        return False
    return True


METRICS_TAG = f"[{METRICS}] "  # how follow_logs tags a metrics line


class _MetricsLines:
    """``logs``: a metrics.jsonl line -> engine/progress.py's progress line. Dollars at the record's
    time from the ledger's instance rows (the record's own clock, clamped to each instance's life)."""

    def __init__(self, ledger, job) -> None:
        from lorapod.engine.progress import MetricsView
        from lorapod.rundir.metrics import MetricsFeed

        self.rows = ledger.job_instances(job.id) if job is not None else []  # None: a local run, no $
        self.view = MetricsView(usd_cap=job.max_usd if job is not None else None)
        self.feed = MetricsFeed()  # the one reader's policy (rundir/metrics.py), line by line

    def _usd_at(self, t) -> tuple[float | None, float | None]:
        import time

        if not self.rows or isinstance(t, bool) or not isinstance(t, int | float):
            return None, None
        now = time.time()
        usd = sum(max(0.0, min(float(t), r.destroyed_at or now) - r.created_at) / 3600 * r.usd_per_hour
                  for r in self.rows)
        return usd, self.rows[-1].usd_per_hour

    def __call__(self, text: str) -> str | None:
        rec = self.feed.accept(text)
        if rec is None:
            return None
        usd, rate = self._usd_at(rec.get("time"))
        return self.view.feed(rec, usd=usd, usd_per_hour=rate)


def _cells(r: dict) -> dict[str, str]:
    """A ``ps_rows`` row as the strings both layouts print."""
    return {"instance": f"{r['instance'] or '-'} ({r['instance_state'] or '-'})",
            "rate": f"{r['usd_per_hour']:.3f}" if r["usd_per_hour"] is not None else "-",
            "usd": f"{r['usd']:.4f}", "step": str(r["last_step"] if r["last_step"] is not None else "-")}


def _jobs_table(rows: list[dict]) -> Table:
    """Wide terminals (120 columns or more): one table row per job, as before."""
    t = Table("job", "state", "where", "instance", "GPU", "$/h", "$ so far", "step")
    for r in rows:
        c = _cells(r)
        t.add_row(r["job"], r["state"], r["target"], c["instance"], r["gpu"] or "-", c["rate"], c["usd"], c["step"],
                  style="bold red" if r.get("unconfirmed") else None)
    return t


def _jobs_narrow(rows: list[dict], width: int) -> Group:
    """80 columns, or piped: a table would cut the job id people copy into `down`/`logs`/`pull`
    to "demo-202…". So each job is a block: the id alone on its line; state, $ so far, step and
    the instance (provider id and state), the instance on a line of its own when both do not
    fit; then a dim line with where, GPU and $/h. Nothing is cut: a provider id longer than the
    line (an SSH host's, which holds the job id) starts its own line and is folded, never "…"."""
    blocks: list[Text] = []
    for r in rows:
        c = _cells(r)
        red = "bold red" if r.get("unconfirmed") else ""
        head = f"  {r['state']}  ${c['usd']}  step {c['step']}"
        inst = f"instance {c['instance']}"
        blocks.append(Text(r["job"], style=red or "bold"))
        if len(head) + 2 + len(inst) <= width:
            blocks.append(Text(f"{head}  {inst}", style=red))
        elif len(inst) + 2 <= width:
            blocks += [Text(head, style=red), Text(f"  {inst}", style=red)]
        else:  # the id from the line's start, folded: what a terminal copies back whole
            blocks += [Text(head, style=red), Text(f"  instance ({r['instance_state'] or '-'}):", style=red),
                       Text(r["instance"] or "-", style=red)]
        blocks.append(Text(f"  {r['target']}  {r['gpu'] or '-'}  ${c['rate']}/h", style="dim"))
    return Group(*blocks)
