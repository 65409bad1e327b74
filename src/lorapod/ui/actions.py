"""The dashboard's three buttons, through the same code as the CLI.

* pull now: :func:`lorapod.compute.jobs.pull_job` (``lorapod pull``);
* stop at the next save: :func:`lorapod.compute.jobs.stop_job` (``lorapod stop JOB``): ``run/STOP``
  on the instance (what the session and the watchdog write; the engine and the trainer runner save
  a checkpoint and exit), or :meth:`lorapod.rundir.RunDir.request_stop` for a run on this machine;
* destroy now: :func:`lorapod.compute.jobs.down_job` (``lorapod down JOB``): destroy, confirm
  with the provider, then the ledger.

Each returns the lines the CLI would print, for the page to show.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lorapod.errors import LorapodError
from lorapod.rundir import RunDir
from lorapod.ui.runs import RunIndex, RunView


@dataclass
class Outcome:
    ok: bool
    lines: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"ok": self.ok, "lines": self.lines}


def _job(index: RunIndex, job_id: str) -> RunView:
    view = index.find(job_id)
    if view is None:
        raise LorapodError(f"no run '{job_id}'", hint="the Runs page lists them")
    return view


def pull(index: RunIndex, job_id: str) -> Outcome:
    from lorapod.compute.jobs import pull_job

    view = _job(index, job_id)
    ledger = index.ledger(write=True)
    if not view.in_ledger or ledger is None:
        return Outcome(False, [f"{job_id} ran on this machine: its run folder is already here ({view.root})"])
    try:
        n = pull_job(ledger, view.job_id)
    finally:
        ledger.close()
    return Outcome(True, [f"pulled {n} file(s) into {view.root}"])


def stop(index: RunIndex, job_id: str, reason: str = "stop requested from lorapod ui") -> Outcome:
    from lorapod.compute.jobs import stop_job

    view = _job(index, job_id)
    if not view.active:
        return Outcome(False, [f"{job_id} is not running ({view.state})"])
    ledger = index.ledger(write=True)
    if not view.in_ledger or ledger is None:
        path = RunDir(view.root).request_stop(reason)
        return Outcome(True, [f"wrote {path}: the job saves at its next step and ends"])
    try:
        return Outcome(True, [stop_job(ledger, view.job_id, reason)])
    except LorapodError as exc:
        return Outcome(False, [exc.message])
    finally:
        ledger.close()


def destroy(index: RunIndex, job_id: str) -> Outcome:
    from lorapod.compute.jobs import down_job

    view = _job(index, job_id)
    ledger = index.ledger(write=True)
    if not view.in_ledger or ledger is None:
        return Outcome(False, [f"{job_id} ran on this machine: there is no instance to destroy"])
    lines: list[str] = []
    try:
        n = down_job(ledger, view.job_id, say=lines.append)
        left = [r.provider_id or r.id for r in ledger.job_instances(view.job_id) if r.live]
    finally:
        ledger.close()
    if left:
        lines.append(f"not confirmed destroyed: {', '.join(left)}; check the provider's console "
                     f"({view.console_url or view.target}); `lorapod down {view.job_id}` tries again")
        return Outcome(False, lines)
    lines.append(f"{n} instance(s) destroyed and confirmed by {view.provider}")
    return Outcome(True, lines)
