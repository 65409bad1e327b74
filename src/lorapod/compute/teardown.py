"""The end of a remote job: keep its logs, give back the instance, and be sure it is gone.

:func:`destroy_confirmed` is the one destroy loop, used by ``lorapod run`` (through
:func:`destroy_claim`) and by ``lorapod down`` (:func:`lorapod.compute.jobs.destroy_row`). Its
confirm rule, the same on both paths:

    An instance is destroyed when, after a destroy call, the provider's own answer about *that
    instance* (``refresh``) says ``gone``. Being absent from the provider's list of instances does
    NOT confirm it: a list is a view of the account that a provider may page or filter, and one
    host's list is an ``ls`` that reads as empty when it fails, so "not listed" can be "not
    seen". Until it is confirmed the ledger keeps the row live (its dollars keep counting) and the
    caller says so; it is never reported as success. ``lorapod down --orphans`` reconciles by
    the same rule: a row the list omits is marked destroyed only once ``refresh`` says ``gone``.

An instance whose create never answered has no provider id yet: its label (``identity.py``) is
looked for first; when the provider can be asked and has no such instance, nothing was created.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapod.compute.context import Claim, JobContext
from lorapod.compute.provider import Instance, Provider, capability
from lorapod.compute.remote import RemoteWork
from lorapod.compute.transport import AuthRefused
from lorapod.compute.trust import guarded_read
from lorapod.compute.wait import Backoff, deadline_in
from lorapod.errors import LorapodError
from lorapod.home import lorapod_home
from lorapod.store.ledger import Ledger


def _never() -> bool:
    return False


def find_by_label(provider: Provider, label: str, within_s: float, say: Callable[[str], None],
                  give_up: Callable[[], bool] = _never) -> tuple[Instance | None, bool]:
    """The provider's live instance labelled ``label``, looked for until ``within_s`` passes (a
    create the provider accepted can take a moment to be listed). Returns it, or None, and
    whether the provider could be asked at all (False: not found is not "not there")."""
    asked = False
    for _ in Backoff(deadline_in(within_s), first=0.5, most=5.0, give_up=give_up):
        try:
            for inst in provider.list_instances():
                if inst.label == label and inst.live:
                    return inst, True
            asked = True
        except LorapodError as exc:
            say(f"cannot list {provider.name} instances: {exc.message}")
    return None, asked


@dataclass(frozen=True)
class Destroyed:
    """What became of one instance row: ``confirmed`` by the rule above (or nothing existed),
    and its provider id (found by its label where create never answered)."""

    confirmed: bool
    provider_id: str | None
    existed: bool = True


def destroy_confirmed(provider: Provider, ledger: Ledger, ledger_id: str, provider_id: str | None, label: str,
                      *, note: str, deadline: float, say: Callable[[str], None],
                      give_up: Callable[[], bool] = _never, probe: Instance | None = None,
                      settle_s: float = 0.0, usd_per_hour: float | None = None) -> Destroyed:
    """destroy -> confirm with the provider (the rule in this module's docstring) -> ledger.

    Retried with backoff until the monotonic ``deadline``; ``give_up()`` (a second Ctrl-C) ends
    the retries after the current call, and a refused API key at once (no retry fixes it)."""
    ledger.instance_destroying(ledger_id, note)
    if provider_id is None:
        found, asked = find_by_label(provider, label, settle_s, say, give_up)
        if found is None:
            if not asked:
                say(f"cannot tell whether {label} exists at {provider.name}: its list did not answer")
                return Destroyed(False, None)
            ledger.instance_create_failed(ledger_id, f"no instance labelled {label} at the provider")
            say(f"no instance labelled {label} at {provider.name}: nothing was created")
            return Destroyed(True, None, existed=False)
        ledger.instance_created(ledger_id, found.id, found.usd_per_hour or usd_per_hour)
        ledger.instance_destroying(ledger_id, note)
        provider_id, probe = found.id, found
    if not confirm_gone(provider, probe or Instance(provider_id, provider.name, "running", label=label),
                        deadline=deadline, say=say, give_up=give_up):
        return Destroyed(False, provider_id)
    ledger.instance_destroyed(ledger_id, note)
    say(f"instance {provider_id} destroyed (confirmed)")
    return Destroyed(True, provider_id)


def confirm_gone(provider: Provider, inst: Instance, *, deadline: float, say: Callable[[str], None],
                 give_up: Callable[[], bool] = _never) -> bool:
    """The loop itself, without a ledger (``down`` when the ledger is damaged uses it alone):
    destroy, then ask about that instance, until the provider says ``gone`` (the rule above)."""
    for _ in Backoff(deadline, first=1.0, most=30.0, give_up=give_up):
        try:
            provider.destroy(inst.id)
            if provider.refresh(inst).state == "gone":  # confirmed by the provider, not assumed
                return True
            say(f"destroy of {inst.id}: the provider still lists it")
        except AuthRefused as exc:
            say(f"destroy of {inst.id} impossible: {exc.message}")
            return False
        except LorapodError as exc:
            say(f"destroy of {inst.id} failed: {exc.message}")
    return False


def destroy_claim(ctx: JobContext, claim: Claim, note: str, has_work: bool, watchdog_started: bool) -> Destroyed:
    """The job's own instance: destroyed with confirmation, or said loudly that it is not.

    A borrowed host (``ssh://``) where nothing was set up was only a name: nothing to destroy."""
    borrowed = ctx.provider.traits.borrowed
    inst = claim.instance
    row = ctx.ledger.instance(claim.ledger_id)
    provider_id = inst.id if inst else (row.provider_id if row else None)
    if borrowed and (provider_id is None or not has_work):
        ctx.ledger.instance_destroying(claim.ledger_id, note)
        ctx.ledger.instance_destroyed(claim.ledger_id, "nothing was created on the host")
        return Destroyed(True, provider_id, existed=False)
    done = destroy_confirmed(ctx.provider, ctx.ledger, claim.ledger_id, provider_id, claim.label, note=note,
                             deadline=deadline_in(ctx.opts.destroy_deadline_s), say=ctx.say,
                             give_up=lambda: ctx.signals >= 2,
                             probe=inst or (Instance(provider_id, ctx.provider.name, "running", label=ctx.job_id)
                                            if provider_id else None),
                             settle_s=ctx.opts.create_settle_s, usd_per_hour=claim.offer.usd_per_hour)
    if not done.confirmed:
        ctx.unconfirmed = done.provider_id or claim.label
        backstop = ("the on-instance watchdog keeps trying to destroy it; " if watchdog_started
                    and capability(ctx.provider, "watchdog_api").supported else "")
        ctx.say(f"could NOT confirm that {done.provider_id or claim.label} is gone: it may still bill. {backstop}"
                f"check {ctx.console_link()} and run `lorapod down {ctx.job_id}`")
    return done


def fetch_logs(ctx: JobContext, work: RemoteWork) -> None:
    """job.log and watchdog.log sit beside the run folder on the instance: keep a copy."""
    for name in ("job.log", "watchdog.log"):
        try:
            out = work.sh(f"cd {work.q()} && {guarded_read('cat', name)}", timeout=30, check=False)
            if out.returncode == 0 and out.stdout:
                dest = ctx.run.root / name
                if dest.is_symlink() or (dest.exists() and not dest.is_file()):
                    dest.unlink()
                dest.write_bytes(out.stdout)
        except Exception:
            continue


def mark_keep(ctx: JobContext, work: RemoteWork, keep: bool) -> None:
    """KEEP in the work folder: the watchdog on a borrowed host leaves the folder alone."""
    cmd = f"touch {work.q('KEEP')}" if keep else f"rm -f {work.q('KEEP')}"
    with contextlib.suppress(Exception):
        ctx.remote(lambda: work.sh(cmd, timeout=30, check=False), "mark the results kept")


def salvage(ctx: JobContext, pulls: Any) -> None:
    """On an error, bring home whatever is there before the instance goes (best effort)."""
    try:
        st = pulls.pull("salvage")
        ctx.say(f"salvaged {st.files_transferred} files before teardown")
    except Exception as exc:
        ctx.say(f"could not salvage files: {exc}")


def teardown(ctx: JobContext, work: RemoteWork | None, *, why: str, pulled: bool, keep_results: bool,
             last_pull_at: float | None, watchdog_started: bool) -> float | None:
    """Logs (unless a second Ctrl-C), then the instance: destroyed with confirmation, or, on a
    borrowed host whose results could not come home (``keep_results``), kept with KEEP until
    ``lorapod pull``; then the job's own key, once nothing needs it. Returns how long the
    instance billed after the last pull (None: not known)."""
    if work is not None and not pulled and ctx.signals < 2:
        fetch_logs(ctx, work)
    claim, billed_after_pull = ctx.claim, None
    if claim is not None and keep_results and ctx.provider.traits.borrowed and work is not None:
        mark_keep(ctx, work, True)
        ctx.say(f"the results stay on {ctx.target} in {work.dir} (this machine's disk is full): free "
                f"space here, then `lorapod pull {ctx.job_id}` and `lorapod down {ctx.job_id}`")
        ctx.ledger.event("instance", "kept: results not yet home (this machine's disk is full)",
                         job_id=ctx.job_id, instance_id=claim.ledger_id)
    elif claim is not None:
        done = destroy_claim(ctx, claim, why, work is not None, watchdog_started)
        if done.confirmed:
            ctx.claim = None
            if done.existed and last_pull_at is not None:
                billed_after_pull = time.monotonic() - last_pull_at
    if claim is not None and claim.transport is not None:
        with contextlib.suppress(Exception):
            claim.transport.close()
    if ctx.opts.identity is None and ctx.claim is None:  # destroyed: the job's own key is no longer needed
        remove_job_key(ctx.job_id)
    return billed_after_pull


def remove_job_key(job_id: str) -> None:
    for f in (lorapod_home() / "keys" / job_id).glob("id_ed25519*"):
        f.unlink(missing_ok=True)


def job_key_dir(job_id: str) -> Path:
    return lorapod_home() / "keys" / job_id
