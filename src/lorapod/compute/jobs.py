"""What ``lorapod ps``, ``pull``, ``stop`` and ``down`` do, as library functions (``logs``:
:mod:`lorapod.compute.joblogs`).

Everything starts from the ledger: it knows every instance lorapod created (before the create
call even returned), how to reach it again (never a secret: a key *path*, an address) and
whether its controller still runs. ``down --orphans`` reconciles the ledger with what the
providers themselves report, so nothing billed is left unknown.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapod.compute import provider as registry
from lorapod.compute.acquire import transport_for
from lorapod.compute.provider import Instance, Provider
from lorapod.compute.remote import RemoteWork
from lorapod.compute.teardown import confirm_gone, destroy_confirmed
from lorapod.compute.wait import deadline_in, retrying
from lorapod.engine.trackers import wandb_url
from lorapod.errors import LorapodError
from lorapod.rundir import at_step
from lorapod.rundir.quality import pick_summary
from lorapod.store.identity import controller_alive, installation_id, instance_label, parse_label
from lorapod.store.ledger import InstanceRow, JobRow, Ledger
from lorapod.store.phases import job_phases
from lorapod.store.preemptions import job_figures


def ps_rows(ledger: Ledger, all_jobs: bool = True) -> list[dict[str, Any]]:
    """One row per job: state, where, GPU, $/h, $ so far, last step, live instances."""
    now = time.time()
    rows = []
    for job in ledger.jobs():
        insts = ledger.job_instances(job.id)
        live = [i for i in insts if i.live]
        cur = live[-1] if live else (insts[-1] if insts else None)
        if not all_jobs and not live and job.state not in ("starting", "running", "stopping"):
            continue
        rows.append({
            "job": job.id, "state": job.state, "target": job.target or job.provider,
            "instance": cur.provider_id if cur else None, "instance_state": cur.state if cur else None,
            "gpu": cur.gpu_name if cur else None, "usd_per_hour": cur.usd_per_hour if cur else None,
            "usd": round(ledger.usd(job.id, now), 4), "last_step": job.last_step,
            "live_instances": len(live), "controller_alive": controller_alive(job.controller)
            if job.state in ("starting", "running") else False,
            # may still bill and nobody is on it: a destroy that was not confirmed (shown in red)
            "unconfirmed": [i.provider_id or i.id for i in live
                            if i.state == "destroying" or job.state not in ("starting", "running", "stopping")],
            "run_dir": job.run_dir, "summary": job.summary, "setup_s": job_phases(ledger, job.id),
            "wandb_url": wandb_url(Path(job.run_dir)) if job.run_dir else None,  # from the pulled tracking.json
            # the quality autopilot's pick (and its early stop), from the pulled quality/ (rundir/quality.py)
            "quality": pick_summary(Path(job.run_dir)) if job.run_dir else None,
            "watchdog": _watchdog_state(ledger, job.id, controller_alive(job.controller))
            if live and job.state in ("starting", "running") else None,
            # on spot: preemptions, what they cost, what spot saved vs on-demand (store/preemptions.py)
            "spot": fig.to_json() if (fig := job_figures(ledger, job.id)) is not None else None,
            "instances": len(insts),
        })
    return rows


def _watchdog_state(ledger: Ledger, job_id: str, watched: bool = True) -> str:
    """What the controller last saw of the job's watchdog (compute/guards.py): 'down' when it found
    it dead, or a restart did not stay up; 'up' otherwise; 'unknown' when no controller follows
    the job, so nobody has looked since (a host may have killed the watchdog and guard.sh)."""
    last = [e["message"] for e in ledger.events(job_id) if e["kind"] == "watchdog"]
    if last and last[-1].startswith("down"):
        return "down"
    return "up" if watched else "unknown"


def ps_rows_from_providers(say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """``ps`` without a ledger: this installation's live instances as RunPod and Vast.ai list them
    by label (``lorapod-<installation>-<instance>-<job>``), so what bills is never hidden."""
    from lorapod.compute.ledger_repair import labelled_instances

    rows = []
    for name, insts in labelled_instances(say).items():
        for inst in insts:
            job = (inst.label or "").split("-", 3)[3] if inst.label and inst.label.count("-") >= 3 else "?"
            rows.append({
                "job": job, "state": "unknown (no ledger)", "target": name, "instance": inst.id,
                "instance_state": inst.state, "gpu": inst.gpu_name, "usd_per_hour": inst.usd_per_hour,
                "usd": 0.0, "last_step": None, "live_instances": 1, "controller_alive": False, "unconfirmed": [],
                "run_dir": None, "summary": "listed by the provider; the ledger is damaged", "setup_s": {},
            })
    return rows


def down_without_ledger(job_id: str | None, say: Callable[[str], None], confirm: Callable[[str], bool],
                        deadline_s: float = 300.0) -> dict[str, int]:
    """``down`` when the ledger cannot be used (damaged and not repairable here, a read-only home):
    RunPod and Vast.ai list this installation's instances by label, and those are destroyed (a
    job's only, with ``job_id``), each confirmed by the provider. Without the ledger a running
    job's instance cannot be told from an orphan, so a sweep of all of them asks first."""
    from lorapod.compute.ledger_repair import labelled_instances

    targets = [(name, inst) for name, insts in labelled_instances(say).items() for inst in insts
               if job_id is None or (inst.label or "").endswith("-" + job_id)]
    if job_id is None and targets and not confirm(
            f"Without a ledger lorapod cannot tell a running job's instance from an orphan: destroy all "
            f"{len(targets)} of this installation's instances ({', '.join(i.id for _, i in targets)})?"):
        raise LorapodError("nothing destroyed", hint="`lorapod down JOB` destroys one job's instances only")
    counts = {"destroyed": 0, "failed": 0}
    for name, inst in targets:
        if confirm_gone(registry.get(name), inst, deadline=deadline_in(deadline_s), say=say):
            counts["destroyed"] += 1
            say(f"destroyed {name} instance {inst.id} ({inst.label}), confirmed; the ledger could not record it")
        else:
            counts["failed"] += 1
    return counts


def provider_for(row: InstanceRow, ledger: Ledger) -> Provider:
    """The provider of a ledger row, rebuilt: a borrowed host from the address the row recorded."""
    traits = registry.declared_traits(row.provider)
    if traits is not None and traits.borrowed:
        access = ledger.access(row.id)
        return registry.get(row.provider, target=access.get("target"), identity=access.get("identity") or None,
                            usd_per_hour=row.usd_per_hour)
    return registry.get(row.provider)


def row_instance(row: InstanceRow, label: str | None = None) -> Instance:
    """The instance a ledger row names, as last recorded (for ``refresh``, ``destroy``, SSH)."""
    return Instance(id=row.provider_id or row.id, provider=row.provider, state="running", ssh_host=row.ssh_host,
                    ssh_port=row.ssh_port or 22, ssh_user=row.ssh_user or "root", label=label or row.job_id)


class NoSuchJob(LorapodError):
    """No job in the ledger has this id or starts with it (`logs` then looks for a local run)."""


def find_job(ledger: Ledger, job_id: str) -> JobRow:
    """The ledger's job by id or unique prefix; an error that lists the matches of an ambiguous one."""
    job = ledger.job(job_id)
    if job is None:
        matches = [j.id for j in ledger.jobs() if j.id.startswith(job_id)]
        if len(matches) > 1:
            shown = ", ".join(matches[:8]) + (f" and {len(matches) - 8} more" if len(matches) > 8 else "")
            raise LorapodError(f"'{job_id}' is the start of {len(matches)} jobs: {shown}",
                               hint="give more of the id (`lorapod ps` lists them)")
        raise NoSuchJob(f"no job '{job_id}' in the ledger", hint="`lorapod ps` lists jobs")
    return job


def find_local_run(name: str, runs: Path = Path("runs")) -> Path | None:
    """A run folder `lorapod train` wrote (it is in no ledger): the path itself, or a folder of
    ``runs`` whose name is ``name`` or starts with it (an ambiguous start is an error that lists
    them). None when there is none."""
    p = Path(name).expanduser()
    if (p / "spec.yaml").is_file():
        return p
    if not runs.is_dir() or "/" in name:
        return None
    found = sorted(d for d in runs.iterdir() if d.name.startswith(name) and (d / "spec.yaml").is_file())
    exact = [d for d in found if d.name == name]
    if exact or len(found) == 1:
        return (exact or found)[0]
    if len(found) > 1:
        shown = ", ".join(d.name for d in found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise LorapodError(f"'{name}' is the start of {len(found)} run folders in {runs}: {shown}",
                           hint="give more of the name, or the folder's path")
    return None


@dataclass
class Reach:
    """How to talk to a job's live instance again."""

    work: RemoteWork
    row: InstanceRow

    def close(self) -> None:
        self.work.transport.close()


def reach(ledger: Ledger, job: JobRow) -> Reach | None:
    live = [i for i in ledger.job_instances(job.id) if i.live and i.ssh_host]
    if not live:
        return None
    row = live[-1]
    prov = provider_for(row, ledger)
    access = ledger.access(row.id)
    identity = Path(access["identity"]) if access.get("identity") else None
    t = transport_for(prov, row_instance(row, job.id), identity, row.id)
    return Reach(RemoteWork(t, job.id, root=job.remote_dir.rsplit("/", 1)[0]) if job.remote_dir
                 else RemoteWork(t, job.id), row)


@contextlib.contextmanager
def reached(ledger: Ledger, job: JobRow, why_none: str, hint: str) -> Iterator[Reach]:
    """:func:`reach` for a command that needs the live instance: raises when there is none
    ("job J has no live instance" + ``why_none``), and closes the connection after."""
    r = reach(ledger, job)
    if r is None:
        raise LorapodError(f"job {job.id} has no live instance{why_none}", hint=hint)
    try:
        yield r
    finally:
        r.close()


def stop_job(ledger: Ledger, job_id: str, reason: str) -> str:
    """Stop at the next save: write ``run/STOP`` on the job's live instance (the engine and the
    trainer runner save a checkpoint and exit; the session then pulls the run and destroys the
    instance, as after any end). Returns what was done, in words; raises when there is no live
    instance to ask. A run on this machine outside the ledger is stopped with
    :meth:`lorapod.rundir.RunDir.request_stop` instead (``lorapod stop RUN_FOLDER``)."""
    job = find_job(ledger, job_id)
    with reached(ledger, job, f" to stop ({job.state})",
                 "`lorapod ps` lists what runs; a run on this machine: `lorapod stop RUN_FOLDER`") as r:
        r.work.request_stop(reason)
    ledger.event("job", f"STOP written on the instance: {reason}", job_id=job.id)
    return (f"STOP written on {r.row.provider_id or r.row.id}: {job.id} saves a checkpoint at its next step and "
            f"ends; the run is pulled and the instance destroyed (resume later with `lorapod run --resume {job.id}`)")


def pull_job(ledger: Ledger, job_id: str, deadline_s: float = 600.0) -> int:
    """Fetch the run folder now; returns files transferred (0 when everything is already home)."""
    job = find_job(ledger, job_id)
    with reached(ledger, job, f"; its run folder is {job.run_dir}", "everything pulled before teardown is there") as r:
        st = retrying(lambda: r.work.pull(Path(job.run_dir)), time.monotonic() + deadline_s, "pull")
    ledger.event("pull", f"manual pull: {st.files_transferred} files", job_id=job.id)
    return st.files_transferred


def destroy_row(ledger: Ledger, row: InstanceRow, note: str, deadline_s: float = 300.0,
                say: Callable[[str], None] = print) -> bool:
    """destroy -> confirm -> ledger, for one instance row. True when confirmed gone, by the same
    rule as ``lorapod run``'s teardown (:func:`lorapod.compute.teardown.destroy_confirmed`)."""
    return destroy_confirmed(provider_for(row, ledger), ledger, row.id, row.provider_id,
                             instance_label(row.id, row.job_id), note=note, deadline=deadline_in(deadline_s),
                             say=say, probe=row_instance(row) if row.provider_id else None).confirmed


def _gone(prov: Provider, row: InstanceRow) -> bool:
    """Whether the provider itself says this unlisted instance is gone (the confirm rule of
    compute/teardown.py: not being listed is not enough)."""
    try:
        return prov.refresh(row_instance(row)).state == "gone"
    except LorapodError:
        return False


def down_job(ledger: Ledger, job_id: str, say: Callable[[str], None] = print) -> int:
    job = find_job(ledger, job_id)
    n = 0
    for row in ledger.job_instances(job.id):
        if row.live and destroy_row(ledger, row, "lorapod down", say=say):
            n += 1
    if job.state in ("starting", "running", "stopping"):
        ledger.job_ended(job.id, "stopped", f"stopped by `lorapod down` {at_step(job.last_step)}; "
                                            f"resume with `lorapod run --resume {job.id}`")
    return n


def down_orphans(ledger: Ledger, say: Callable[[str], None] = print, everything: bool = False,
                 all_installations: bool = False, deadline_s: float = 300.0) -> dict[str, Any]:
    """Reconcile the ledger with the providers (:func:`reconcile_rows`, then
    :func:`sweep_unlabelled`). Every destroy goes through compute/teardown.py's confirm rule: an
    instance counts as destroyed only once the provider's own answer about it says ``gone``; one
    that is not confirmed is counted in ``failed``, named in ``unconfirmed`` and said.

    ``counts["providers"]`` says, per provider, whether its account was asked and why not.
    """
    counts: dict[str, Any] = {"reconciled": 0, "destroyed": 0, "unknown_destroyed": 0, "failed": 0,
                              "others_left": 0, "unconfirmed": []}
    reconcile_rows(ledger, counts, say, everything, deadline_s)
    counts["providers"] = sweep_unlabelled(ledger, counts, say, all_installations, deadline_s)
    return counts


def reconcile_rows(ledger: Ledger, counts: dict[str, Any], say: Callable[[str], None], everything: bool = False,
                   deadline_s: float = 300.0) -> None:
    """The ledger's live rows against their providers:

    * a row whose instance the provider no longer lists and, asked about it (``refresh``), says
      is gone: marked destroyed (no destroy call; the confirm rule);
    * a row whose controller is dead (or every row with ``everything``): destroyed, confirmed.
    """
    listed: dict[tuple[str, str], list[Instance]] = {}
    for row in ledger.instances(live_only=True):
        try:
            prov = provider_for(row, ledger)
        except LorapodError as exc:
            say(f"cannot check {row.provider} instance {row.provider_id}: {exc.message}")
            counts["failed"] += 1
            continue
        key = (row.provider, str(ledger.access(row.id).get("target")))
        if key not in listed:
            try:
                listed[key] = prov.list_instances()
            except LorapodError as exc:
                say(f"cannot list {row.provider} instances: {exc.message}")
                listed[key] = []
                counts["failed"] += 1
                continue
        ids = {i.id for i in listed[key] if i.live}
        job = ledger.job(row.job_id) if row.job_id else None
        running = job is not None and job.state in ("starting", "running", "stopping") and controller_alive(job.controller)
        if row.provider_id and row.provider_id not in ids and row.state != "creating" and _gone(prov, row):
            ledger.instance_destroyed(row.id, "provider reports it gone (reconciled)")
            counts["reconciled"] += 1
            say(f"{row.provider} instance {row.provider_id} is already gone; ledger updated")
            if job is not None and not running and job.state in ("starting", "running", "stopping"):
                ledger.job_ended(job.id, "stopped", f"controller lost {at_step(job.last_step)}; the watchdog destroyed "
                                                    f"the instance; resume with `lorapod run --resume {job.id}`")
            continue
        if everything or not running:
            ok = destroy_row(ledger, row, "orphan sweep" if not everything else "down --all", deadline_s, say=say)
            counts["destroyed" if ok else "failed"] += 1
            if not ok:
                counts["unconfirmed"].append(row.provider_id or row.id)
            if job is not None and job.state in ("starting", "running", "stopping"):
                ledger.job_ended(job.id, "stopped", f"instance destroyed by `lorapod down`; resume with "
                                                    f"`lorapod run --resume {job.id}`")


def sweep_unlabelled(ledger: Ledger, counts: dict[str, Any], say: Callable[[str], None],
                     all_installations: bool = False, deadline_s: float = 300.0) -> dict[str, str]:
    """Instances with lorapod's label that the ledger never heard of (e.g. a crash inside
    ``create()``), on every registered provider that rents from an account, built-in or plugin:
    destroyed, confirmed by the provider (compute/teardown.py). Other installations' are left
    alone unless ``all_installations``. Returns, per provider, whether it was asked (with no API
    key a sweep that asked nobody must not read as "all clear")."""
    known = {r.provider_id for r in ledger.instances() if r.provider_id}
    me = installation_id()
    providers: dict[str, str] = {}
    for name in registry.rented_providers():
        try:
            prov = registry.get(name)
            found = prov.list_instances()
        except LorapodError as exc:
            why = exc.message + (f"; {exc.hint}" if exc.hint else "")
            providers[name] = f"not asked: {why}"
            say(f"{name}: not asked ({why}); its instances were not checked")
            continue
        providers[name] = f"asked: {sum(1 for i in found if i.live)} live instance(s) on the account"
        for inst in found:
            if not inst.live or inst.id in known or not (inst.label or "").startswith("lorapod-"):
                continue
            owner = parse_label(inst.label)
            if not all_installations and (owner is None or owner[0] != me):
                counts["others_left"] += 1
                say(f"left {name} instance {inst.id} ({inst.label}): another lorapod installation's "
                    "(--all-installations to include it)")
                continue
            row = ledger.instance(owner[1]) if owner is not None and owner[0] == me else None
            deadline = deadline_in(deadline_s)
            if row is not None:  # the row whose create never answered: the one destroy loop, with the ledger
                ledger.instance_created(row.id, inst.id)
                confirmed = destroy_confirmed(prov, ledger, row.id, inst.id, inst.label or "", deadline=deadline,
                                              note="found by its label", say=say, probe=inst).confirmed
            else:
                confirmed = confirm_gone(prov, inst, deadline=deadline, say=say)
            if confirmed:
                counts["unknown_destroyed"] += 1
                say(f"destroyed {name} instance {inst.id} ({inst.label}) that the ledger did not know (confirmed)")
            else:
                counts["failed"] += 1
                counts["unconfirmed"].append(inst.id)
                say(f"could NOT confirm that {name} instance {inst.id} ({inst.label}) is gone: it may still bill; "
                    f"check {prov.traits.console_url or name} and run `lorapod down --orphans` again")
    return providers
