"""The whole life of a remote job, in one place, with every wait bounded.

``ledger row -> create (never blindly retried) -> wait for SSH (deadline; else destroy, next
offer) -> start the watchdog -> bootstrap -> sync data -> start the job detached -> follow
metrics and pull as things appear -> (budget: STOP, wait, pull) -> final pull verified by size +
sha256 -> PULLED -> destroy -> provider confirms -> ledger``.

Teardown is guaranteed from several sides: a ``finally`` here; SIGINT/SIGTERM handlers that turn
into the same orderly stop (a second one skips straight to destroy and ends this process after
the destroy call); the on-instance watchdog (:mod:`lorapod.compute.watchdog`), running from the
moment SSH answers, if this process dies; and ``lorapod down --orphans``. A destroy the provider
does not confirm is never reported as success: :attr:`Summary.unconfirmed` names the instance.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapod.compute.bootstrap import bootstrap_for
from lorapod.compute.guards import beat_limit_s, guard_script, restart_watchdog
from lorapod.compute.httpapi import ApiError
from lorapod.compute.ledger import Ledger, LedgerBusy, instance_label, lorapod_home
from lorapod.compute.ledger_repair import backup as backup_ledger
from lorapod.compute.metrics_feed import POLL_BYTES, MetricsFeed
from lorapod.compute.offers import choose_offers
from lorapod.compute.provider import CreatedButUnusable, Instance, InstanceSpec, NoCapacity, Offer, Provider
from lorapod.compute.pulls import LocalDiskFull, PullGuard
from lorapod.compute.pulls import cap_bytes as pull_cap_bytes
from lorapod.compute.remote import PULL_EXCLUDES, Bootstrap, RemoteWork, job_command_from_env, local_manifest
from lorapod.compute.secrets import secrets_for
from lorapod.compute.transport import (
    AuthRefused,
    ConnectionLost,
    SSHTransport,
    Transport,
    ephemeral_key,
    public_key,
)
from lorapod.compute.trust import guarded_read
from lorapod.compute.wait import WaitTimedOut, backoff_until, retrying
from lorapod.errors import BudgetError, LorapodError, ProviderError, RemoteError
from lorapod.fsutil import append_text
from lorapod.rundir import RunDir, new_job_id

JobCommand = Callable[[str, str, str, bool], list[str]]


class Interrupted(LorapodError):
    """Ctrl-C or SIGTERM: the job is stopped in order (checkpoint, pull, destroy)."""

    exit_code = 130


@dataclass
class RunOptions:
    """Knobs of one remote run. Defaults suit real providers; tests shrink the intervals."""

    identity: Path | None = None
    gpu: str | None = None
    max_usd: float | None = None
    max_hours: float | None = None
    bootstrap: Bootstrap = field(default_factory=Bootstrap)
    job_command: JobCommand = job_command_from_env
    poll_s: float = 5.0
    pull_every_s: float = 30.0
    #: create -> SSH answers. dstack waits 20 min for RunPod ("a large image is pulled"), SkyPilot's
    #: Vast provisioner 30; the default images are 10+ GB devel images a host may not have cached.
    ready_deadline_s: float = 1500.0
    #: more time, at most this much, while the provider still reports the image being pulled
    pull_extension_s: float = 1200.0
    #: "Permission denied" is retried this long once SSH answers, where the provider declares
    #: ``key_arrives_late``: Vast.ai's key reaches the
    #: container seconds after the attach ("try again after a few seconds", its SSH banner)
    auth_grace_s: float = 120.0
    #: how long the first SSH route (Vast.ai: direct) may stay silent before the next (its proxy)
    direct_ssh_s: float = 60.0
    progress_every_s: float = 60.0  # a line while waiting for the instance, with what the wait cost
    max_offers: int = 3  # offers that gave an instance, tried before giving up (no-capacity refusals don't count)
    reconnect_s: float = 600.0  # keep retrying a dropped connection this long
    stop_margin_s: float = 120.0  # ask for a checkpoint this long before a cap
    stop_wait_s: float = 300.0  # how long the job may take to save after STOP
    destroy_deadline_s: float = 300.0
    watchdog: dict[str, float] = field(default_factory=dict)  # overrides of watchdog.DEFAULTS
    #: variables sent in the 0600 secrets.env; None: only what the job needs (compute/secrets.py)
    forward_env: tuple[str, ...] | None = None
    create_attempts: int = 3  # create calls per offer when the provider's answer is uncertain
    create_settle_s: float = 30.0  # how long to look for an instance whose create did not answer
    default_cap_hours: float = 24.0  # the watchdog's hour cap when no cap is set and no estimate exists
    trainer: str | None = None  # the external trainer the job runs (recorded in the run folder for --resume)
    watchdog_restarts: int = 5  # times the controller starts a dead watchdog again (compute/guards.py)
    disk_full_grace_s: float = 900.0  # how long a full local disk may keep the instance (within the caps)
    disk_full_retry_s: float = 15.0  # pull again this often while this machine's disk is full


@dataclass
class Summary:
    job_id: str
    run_dir: Path
    state: str  # done | stopped | failed | interrupted
    last_step: int | None
    usd: float
    message: str
    first_step_s: float | None = None  # seconds from start to the first metrics line
    billed_after_pull_s: float | None = None  # seconds the instance lived after the last pull
    unconfirmed: str | None = None  # provider id of an instance whose destroy was not confirmed
    console: str | None = None  # where to check it by hand

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "run_dir": str(self.run_dir), "state": self.state,
                "last_step": self.last_step, "usd": round(self.usd, 4), "message": self.message,
                "first_step_s": self.first_step_s, "billed_after_pull_s": self.billed_after_pull_s,
                "unconfirmed": self.unconfirmed, "console": self.console, "wandb_url": self.wandb_url}

    @property
    def wandb_url(self) -> str | None:
        """The run's W&B page, from the pulled tracking.json (None: W&B off, or offline)."""
        from lorapod.engine.trackers import wandb_url

        return wandb_url(self.run_dir)


class Session:
    def __init__(self, spec, provider: Provider, target: str, opts: RunOptions | None = None,
                 ledger: Ledger | None = None, spec_path: str | None = None,
                 say: Callable[[str], None] = print, resume_job: str | None = None) -> None:
        self.spec = spec
        self.provider = provider
        self.target = target
        self.opts = opts or RunOptions()
        self.ledger = ledger or Ledger()
        self.spec_path = spec_path
        self._say = say
        self.resume_job = resume_job
        self.inst: Instance | None = None
        self.iid: str | None = None
        self.identity: Path | None = None
        self.work: RemoteWork | None = None
        self.transport: Transport | None = None
        self.last_step: int | None = None
        self.metrics_offset = 0
        self.feed = MetricsFeed()
        self.first_step_at: float | None = None
        self.view = None  # engine.progress.MetricsView, made when the first metrics arrive (max_usd known)
        self.last_pull_at: float | None = None
        self.stop_reason: str | None = None
        self.stop_requested_at: float | None = None
        self._signals = 0
        self.t0 = time.monotonic()
        self.offer: Offer | None = None
        self.label: str | None = None
        self.unconfirmed: str | None = None
        self.watchdog_started = False
        if resume_job:
            row = self.ledger.job(resume_job)
            if row is None:
                raise LorapodError(f"no job '{resume_job}' in the ledger", hint="`lorapod ps` lists jobs")
            # One controller per run folder (rundir.WriterLock), taken before the ledger says
            # anything: it holds even when the ledger was rebuilt or another home names the folder.
            self._writer = RunDir(Path(row.run_dir)).lock(f"lorapod run --resume {row.id} ({target})", say=say)
            other = self.ledger.job_claim(row.id)  # this process follows it now: `ps`, `down --orphans`
            if other is not None:
                self._writer.release()
                raise LorapodError(f"job {row.id} is already followed by a running controller ({other})",
                                   hint=f"follow it with `lorapod logs -f {row.id}`, or stop it with "
                                        f"`lorapod down {row.id}`")
            self.job_id = row.id
            self.run = RunDir(Path(row.run_dir))
            # The uploaded run folder carries the old metrics: follow only what is new.
            self.last_step = row.last_step
            if self.run.metrics_file.is_file():
                self.metrics_offset = _end_of_last_line(self.run.metrics_file)
            self.feed = MetricsFeed(offset=self.metrics_offset)  # floor None: it restarts at its checkpoint
        else:
            self.run = RunDir.create(spec.output.dir, spec.output.name or "job")
            self._writer = self.run.lock(f"lorapod run {self.run.job_id} ({target})", say=say)
            self.job_id = self.run.job_id
            self.run.write_spec(spec)
            if self.opts.trainer:
                self.run.write_trainer(self.opts.trainer)

    # ------------------------------------------------------------------ small helpers

    def say(self, msg: str) -> None:
        self._say(msg)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with contextlib.suppress(OSError):  # a full local disk must not stop teardown
            append_text(self.run.root / "remote-events.log", f"{stamp} {msg}\n")
        self.ledger.event("session", msg, job_id=self.job_id, instance_id=self.iid)

    def phase(self, name: str, seconds: float, note: str = "") -> None:
        """A setup step's duration, in the events log and the ledger (``lorapod ps`` and the
        planner's "boot + install" read them back)."""
        self.say(f"phase {name}: {seconds:.1f} s" + (f" - {note}" if note else ""))
        self.ledger.event("phase", json.dumps({"phase": name, "s": round(seconds, 2), "note": note,
                                               "provider": self.provider.name}),
                          job_id=self.job_id, instance_id=self.iid)

    def deadline(self, seconds: float) -> float:
        return time.monotonic() + seconds

    _hard_deadline: float | None = None  # set once stopping: nothing may wait past it

    def remote(self, fn: Callable[[], Any], what: str) -> Any:
        """A remote operation that survives connection drops for up to ``reconnect_s``."""
        deadline = self.deadline(self.opts.reconnect_s)
        if self._hard_deadline is not None:
            deadline = min(deadline, self._hard_deadline)
        return retrying(fn, deadline, what,
                        on_retry=lambda e: self.say(f"connection lost during {what}; reconnecting"))

    # ------------------------------------------------------------------ entry point

    def run_job(self) -> Summary:
        o = self.opts
        max_usd = o.max_usd or self.spec.compute.max_usd
        max_hours = o.max_hours or self.spec.compute.max_hours
        self.max_usd, self.max_hours = max_usd, max_hours
        if self.resume_job:
            self.ledger.job_update(self.job_id, state="starting", ended_at=None)
        else:
            self.ledger.job_started(self.job_id, str(self.run.root), self.provider.name, self.target,
                                    self.spec_path, max_usd, max_hours)
        if self.ledger.pending:  # locked (or unwritable) before anything is rented: say so now, rent nothing
            self._writer.release()
            raise LedgerBusy(f"the ledger {self.ledger.path} is locked by another process (or cannot be written); "
                             f"job {self.job_id} was not started and nothing was rented",
                             hint="close the program holding it (a `sqlite3` shell, a backup), or free the disk / "
                                  "make LORAPOD_HOME writable, then run again")
        if max_usd is not None and self.ledger.usd(self.job_id) >= max_usd:
            raise BudgetError(f"job {self.job_id} already spent ${self.ledger.usd(self.job_id):.2f} of ${max_usd:.2f}",
                              hint="raise --max-usd to continue")
        if self.ledger.notice:
            self._say(f"warning: {self.ledger.notice}")
        with contextlib.suppress(OSError, sqlite3.Error):  # a backup that fails never stops a run
            backup_ledger(self.ledger)
        writer = self._writer
        old = self._install_signal_handlers()
        state, message = "failed", "did not start"
        try:
            self._acquire()
            self._start_watchdog()
            self._setup()
            state, message = self._follow()
        except Interrupted as exc:
            state, message = "interrupted", str(exc.message)
            self._orderly_stop("interrupted")
        except LorapodError as exc:
            state, message = "failed", exc.message
            self._salvage()
            raise
        except BaseException as exc:
            state, message = "failed", f"{type(exc).__name__}: {exc}"
            self._salvage()
            raise
        finally:
            try:
                self._in_teardown = True
                self._teardown()
            finally:
                writer.release()
                self._restore_signal_handlers(old)
                usd = self.ledger.usd(self.job_id)
                resume = f"; resume with `lorapod run --resume {self.job_id}`" if state != "done" else ""
                if state != "done" and self.disk_full and not any(self.run.checkpoints.glob("*-*")):
                    resume = "; no checkpoint reached this machine (its disk is full), so nothing here resumes"
                summary_msg = f"{message} (last step {self.last_step}, ${usd:.4f}){resume}"
                if self.feed.dropped_total:
                    summary_msg += f"; {self.feed.dropped_total} metrics line(s) from the instance ignored"
                if self.unconfirmed:
                    summary_msg += (f"; instance {self.unconfirmed} NOT confirmed destroyed: check "
                                    f"{self.console_link()} and run `lorapod down {self.job_id}`")
                self.ledger.job_ended(self.job_id, state, summary_msg)
                self.ledger.job_update(self.job_id, last_step=self.last_step)
                self._learn()
                if not self.ledger.flush(wait_s=self.ledger.busy_s):
                    summary_msg += (f"; the ledger stayed locked by another process and {self.ledger.pending} "
                                    "record(s) of this job were not written: once it is free, `lorapod down "
                                    "--orphans` reconciles it with the provider")
                self.summary = Summary(self.job_id, self.run.root, state, self.last_step, usd, summary_msg,
                                       self.first_step_at - self.t0 if self.first_step_at else None,
                                       self._billed_after_pull, self.unconfirmed,
                                       self.console_link() if self.unconfirmed else None)
        return self.summary

    def _learn(self) -> None:
        """Measure the ended job for the planner now (plan/learned.py), not at the next plan; never
        in the way of the summary: a run it cannot read is only logged."""
        from lorapod.plan.learned import record_job

        try:
            record_job(self.ledger, self.job_id)
        except (LorapodError, OSError, sqlite3.Error) as exc:
            self.ledger.event("job", f"not measured for the planner: {exc}", job_id=self.job_id)

    _billed_after_pull: float | None = None
    base_boot: Bootstrap | None = None  # the bootstrap this job used (the provider may change --python)
    job_started_at: float | None = None
    created_at_mono = 0.0
    _in_teardown = False
    job_started = False
    _hb_stop: threading.Event | None = None
    pulled = False

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            # 1st: orderly stop (checkpoint, pull, destroy). 2nd: skip the pull. During teardown:
            # never interrupted, because that is the part that stops the bill.
            self._signals += 1
            if self._in_teardown:
                self._say("destroying the instance; please wait" if self._signals < 2 else
                          "stopping after this destroy call, confirmed or not")
                return
            if self._signals == 1:
                raise Interrupted(f"stopped by {signal.Signals(signum).name}")
            if self._signals == 2:
                raise Interrupted("interrupted again: skipping the final pull")

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, handler)
        return old

    def _restore_signal_handlers(self, old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    # ------------------------------------------------------------------ acquire

    def _acquire(self) -> None:
        o = self.opts
        offers = choose_offers(self.spec, self.provider, o.gpu, self.max_usd, self.max_hours)
        self.ledger.record_prices(offers)
        key_dir = lorapod_home() / "keys" / self.job_id
        if o.identity is not None:
            self.identity = Path(o.identity).expanduser()
            pub = public_key(self.identity)
        elif getattr(self.provider, "borrowed", False):
            # Your own host: your usual SSH keys and agent apply (no -i).
            self.identity, pub = None, ""
        else:
            self.identity = ephemeral_key(key_dir, f"lorapod-{self.job_id}")
            self.say("made a fresh ed25519 key pair for this job")
            pub = public_key(self.identity)
        errors = []
        tried = 0
        for offer in offers:
            if tried >= o.max_offers:
                break
            try:
                self._create(offer, pub)
                tried += 1
                self._wait_ready()
                return
            except NoCapacity as exc:  # nothing was rented: this offer does not count
                errors.append(f"{offer.gpu_name} ({offer.id}): {exc.message}")
                self.say(f"offer {offer.id}: {exc.message}; trying the next")
                self.inst, self.iid = None, None
                continue
            except (AuthRefused, BudgetError, Interrupted):
                raise
            except (WaitTimedOut, ProviderError, ConnectionLost) as exc:
                if getattr(exc, "fatal", False):  # bad key, no balance: no other offer will do better
                    if self.iid is not None:
                        self._destroy_instance("create refused")
                    raise
                errors.append(f"{offer.gpu_name} ({offer.id}): {exc.message}")
                self.say(f"offer {offer.id} failed: {exc.message}")
                if self.inst is not None or self.iid is not None:
                    self._destroy_instance("not ready before the deadline")
                self.inst, self.iid = None, None
        raise ProviderError("no offer gave a usable instance:\n  " + "\n  ".join(errors),
                            hint="try again later, another --gpu, or another provider")

    def _create(self, offer: Offer, pub: str) -> None:
        """Create, with the ledger row written first. Never blindly retried: when the provider's
        answer is uncertain (timeout, 5xx, Ctrl-C), the instance is looked up by its label first."""
        # Invariant 1: the row exists before create() returns to any of our code.
        self.offer = offer
        self.iid = self.ledger.instance_creating(self.provider.name, self.job_id, offer.usd_per_hour,
                                                 offer.gpu_name, offer.to_dict())
        self.ledger.job_update(self.job_id, instance_id=self.iid)
        self.ledger.instance_access(self.iid, {"target": self.target,
                                               "identity": str(self.identity) if self.identity else None})
        self.label = instance_label(self.iid, self.job_id)
        spec = InstanceSpec(label=self.job_id, ssh_public_key=pub, disk_gb=self.spec.compute.disk_gb,
                            name=self.label, image=self.spec.compute.image)
        self.say(f"creating {offer.gpu_name} on {self.provider.name} at ${offer.usd_per_hour:.3f}/h")
        self.created_at_mono = time.monotonic()
        for attempt in range(1, self.opts.create_attempts + 1):
            try:
                self._created(self.provider.create(offer, spec))
                return
            except CreatedButUnusable as exc:
                self._created(exc.instance)  # recorded: teardown destroys it with confirmation
                raise
            except Interrupted:
                found = self._find_by_label(self.opts.create_settle_s)
                if found is not None:
                    self._created(found)
                raise  # not found: the row stays 'creating'; teardown looks again
            except ApiError as exc:
                if not exc.uncertain:
                    self._create_refused(exc)
                    raise
                self.say(f"create did not answer clearly ({exc.message}); looking for the instance by its label")
                found = self._find_by_label(self.opts.create_settle_s)
                if found is not None:
                    self._created(found)
                    return
                if attempt == self.opts.create_attempts:
                    raise
                self.say(f"no instance labelled {self.label}: creating again ({attempt + 1}/{self.opts.create_attempts})")
            except LorapodError as exc:
                self._create_refused(exc)
                raise

    def _created(self, inst: Instance) -> None:
        assert self.iid is not None and self.offer is not None
        self.inst = inst
        self.ledger.instance_created(self.iid, inst.id, inst.usd_per_hour or self.offer.usd_per_hour)

    def _create_refused(self, exc: LorapodError) -> None:
        assert self.iid is not None
        self.ledger.instance_create_failed(self.iid, exc.message)
        self.iid = None

    def _find_by_label(self, within_s: float) -> Instance | None:
        """The provider's instance labelled ``self.label``, looked for until ``within_s`` passes
        (a create the provider accepted can take a moment to be listed)."""
        if getattr(self.provider, "borrowed", False) or not self.label:
            return None
        deadline = self.deadline(within_s)
        delay = 0.5
        while True:
            try:
                for inst in self.provider.list_instances():
                    if inst.label == self.label and inst.live:
                        return inst
            except LorapodError as exc:
                self.say(f"cannot list {self.provider.name} instances: {exc.message}")
            if time.monotonic() + delay > deadline or (self._signals >= 2 and self._in_teardown):
                return None
            time.sleep(delay)
            delay = min(5.0, delay * 2)

    def _wait_ready(self) -> None:
        """Boot, then SSH, under one deadline (``ready_deadline_s``), extended by at most
        ``pull_extension_s`` while the provider reports an image pull; a progress line every
        ``progress_every_s`` says what the wait has cost. Once SSH answers, "Permission denied" is
        retried for ``auth_grace_s`` (Vast.ai's key arrives late); a first route that stays silent
        for ``direct_ssh_s`` gives way to the next (Vast.ai: direct, then its proxy)."""
        assert self.inst is not None and self.iid is not None
        o = self.opts
        start = time.monotonic()
        limit = {"deadline": start + o.ready_deadline_s, "most": start + o.ready_deadline_s + o.pull_extension_s}
        hint = "the provider may be short of capacity; lorapod destroys it and tries the next offer"
        last_note = [start]

        def progress(what: str) -> None:
            now = time.monotonic()
            if now - last_note[0] >= o.progress_every_s:
                last_note[0] = now
                usd = self.ledger.usd(self.job_id)
                self.say(f"still waiting for {what} after {now - start:.0f} s (${usd:.3f} so far; gives up after "
                         f"{limit['deadline'] - start:.0f} s)")

        def ready() -> bool:
            assert self.inst is not None
            self.inst = self.provider.refresh(self.inst)
            if self.inst.state in ("error", "exited", "gone"):
                raise ProviderError(f"instance {self.inst.id} is {self.inst.state}: {self.inst.message or ''}")
            if self.inst.pulling and limit["deadline"] < limit["most"]:
                # the provider says the image is still coming: keep its time, within the extension
                limit["deadline"] = min(limit["most"], max(limit["deadline"], time.monotonic() + 60.0))
            if not self.inst.ssh_ready:
                progress("the image pull" if self.inst.pulling else f"instance {self.inst.id} to boot")
            return self.inst.ssh_ready

        backoff_until(ready, limit, f"instance {self.inst.id} to boot", hint, most=10)
        self.phase("boot", time.monotonic() - self.created_at_mono)
        self._bill_at_the_providers_price()
        inst = self.inst
        routes = [(inst.ssh_host or "", inst.ssh_port), *inst.ssh_alternates]
        self.transport = self._transport_for(inst)
        booted = time.monotonic()
        state = {"route": 0, "since": booted, "auth_since": None}

        def ssh_answers() -> bool:
            assert self.transport is not None and self.inst is not None
            try:
                self.transport.run("true", timeout=max(2.0, min(15.0, limit["deadline"] - time.monotonic())))
                return True
            except AuthRefused:
                # sshd answered but does not know the key yet: wait for it, for a bounded time
                now = time.monotonic()
                state["auth_since"] = state["auth_since"] or now
                # only where the provider installs the key after the instance starts (a trait it
                # declares); elsewhere a refused key is the user's to fix, said at once
                if not getattr(self.provider, "key_arrives_late", False) or now - state["auth_since"] > o.auth_grace_s:
                    raise
                progress("the instance to accept the job's SSH key")
                return False
            except ConnectionLost:
                now = time.monotonic()
                if state["route"] + 1 < len(routes) and now - state["since"] >= o.direct_ssh_s:
                    state["route"] += 1
                    state["since"] = now
                    host, port = routes[state["route"]]
                    self.say(f"SSH on {self.inst.ssh_host}:{self.inst.ssh_port} does not answer; trying {host}:{port}")
                    self.inst = self.inst.with_(ssh_host=host, ssh_port=port)
                    with contextlib.suppress(Exception):
                        self.transport.close()
                    self.transport = self._transport_for(self.inst)
                progress(f"SSH on {self.inst.ssh_host}:{self.inst.ssh_port}")
                return False

        backoff_until(ssh_answers, limit, f"SSH on {inst.ssh_host}:{inst.ssh_port}", hint, most=5)
        inst = self.inst
        self.phase("ssh ready", time.monotonic() - booted)
        self.ledger.instance_ready(self.iid, inst.ssh_host or "", inst.ssh_port, inst.ssh_user)
        self.say(f"instance {inst.id} answers on {inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port}")

    def _bill_at_the_providers_price(self) -> None:
        """Money is counted at the provider's price for this instance (invariant 4): when the
        running instance reports another $/h than the offer said (Vast.ai prices a search for the
        storage it names), the ledger, and with it the caps and the watchdog, take the instance's."""
        assert self.inst is not None and self.iid is not None
        row = self.ledger.instance(self.iid)
        billed = self.inst.usd_per_hour
        if row is None or not billed or abs(billed - row.usd_per_hour) <= 0.005 * max(billed, row.usd_per_hour):
            return
        self.ledger.instance_created(self.iid, self.inst.id, billed)
        self.say(f"{self.provider.name} bills ${billed:.4f}/h for instance {self.inst.id}, not the offered "
                 f"${row.usd_per_hour:.4f}/h; the caps count the billed price")

    def _transport_for(self, inst: Instance) -> Transport:
        return transport_for(self.provider, inst, self.identity, self.iid or "x")

    # ------------------------------------------------------------------ setup on the instance

    def _start_watchdog(self) -> None:
        """The first thing after SSH answers: the work folder and the watchdog (standard library
        only, so before any bootstrap), with the job's caps, then the heartbeat thread."""
        assert self.transport is not None and self.inst is not None
        from lorapod.compute.runpod.volume_mount import cache_root_of

        work = self.work = RemoteWork(self.transport, self.job_id, cache_root=cache_root_of(self.provider))
        self.ledger.job_update(self.job_id, remote_dir=work.dir, state="running")
        boot = bootstrap_for(self.opts.bootstrap, self.provider, self.spec)
        host = None
        if not getattr(self.provider, "runs_here", False):  # the image's facts, in its first seconds
            container = not getattr(self.provider, "borrowed", False)  # ssh://: your PATH first
            boot, host, choice = self.remote(lambda: work.probe(boot, container), "probe the instance")
            self.say(f"instance facts: {host.describe()}")
            self.say(f"Python on the instance: {choice.why}")
        self.base_boot = boot
        wd = self.wd_cfg = self._watchdog_config()
        # The watchdog runs under the instance's base interpreter: standard library only.
        self.remote(lambda: work.start_watchdog(wd, boot.python), "start the watchdog")
        pid = self.remote(work.watchdog_alive, "check the watchdog")  # or WatchdogNotRunning: teardown destroys
        self.watchdog_started = True
        self.say(f"watchdog started on the instance ({self.cap_note}; running, pid {pid})")
        self._start_heartbeat(float(wd.get("heartbeat_timeout_s", 600.0)))
        if host is not None:  # after the watchdog: a slow apt-get is already guarded
            self.say(self.remote(lambda: work.provide_rsync(host), "provide rsync"))

    def _setup(self) -> None:
        assert self.transport is not None and self.inst is not None and self.work is not None
        o = self.opts
        work = self.work
        boot = self.base_boot or bootstrap_for(o.bootstrap, self.provider, self.spec)
        work.local_log = self.run.root / "env.log"
        t = time.monotonic()
        facts = self.remote(lambda: work.bootstrap(boot, lorapod_home() / "wheels"), "bootstrap")
        self.say(f"bootstrapped: Python {facts['python']}, lorapod {facts['lorapod']} ({boot.strategy}), "
                 f"GPU: {', '.join(facts['gpus']) or 'none'}")
        self.phase("environment", time.monotonic() - t, facts["env"].describe())
        t = time.monotonic()
        remote_spec = self._sync_inputs()
        self.phase("data sync", time.monotonic() - t)
        files = {"spec.yaml": (remote_spec.to_yaml().encode(), 0o600),
                 "guard.sh": (guard_script(boot.python, float(self.wd_cfg.get("heartbeat_timeout_s", 600.0)),
                                           float(self.wd_cfg.get("poll_s", 10.0))), 0o700)}
        names, withheld = secrets_for(self.spec, self.offer, o.forward_env)
        if withheld:
            self.say(withheld)
        secrets = "".join(f"{k}={_shell_value(os.environ[k])}\n" for k in names if os.environ.get(k))
        if secrets:
            files["secrets.env"] = (secrets.encode(), 0o600)
            self.say(f"sending {', '.join(k for k in names if os.environ.get(k))} to the instance (0600 file)")
        if self.resume_job and any(self.run.checkpoints.glob("*")):
            st = self.remote(lambda: work.push_path(self.run.root, "run", delete=False, excludes=PULL_EXCLUDES),
                             "upload checkpoints")
            self.say(f"uploaded the run folder to resume ({st.literal_bytes} bytes sent)")
        argv = o.job_command(facts["job_python"], "spec.yaml", "run", bool(self.resume_job))
        self.remote(lambda: work.start_job(files, argv), "start the job")
        self.job_started = True
        self.job_started_at = time.monotonic()
        self.say(f"job started on the instance: {' '.join(argv)}")

    def _start_heartbeat(self, timeout_s: float) -> None:
        """Touch HEARTBEAT from a thread as well, so a long pull (many GB of checkpoints) never
        looks like a silent controller to the watchdog."""
        assert self.work is not None
        work, every = self.work, max(0.5, min(60.0, timeout_s / 4))
        self._hb_stop = threading.Event()

        def beat() -> None:
            while not self._hb_stop.wait(every):
                try:
                    work.sh(f"touch {work.q('HEARTBEAT')} 2>/dev/null || true", timeout=30, check=False)
                except Exception:  # a dropped connection: the main loop reports and reconnects
                    continue

        threading.Thread(target=beat, name="lorapod-heartbeat", daemon=True).start()

    def _sync_inputs(self):
        """Upload data (and a local base model or prompt file); the spec points at the copies."""
        assert self.work is not None
        work = self.work
        self.sync_stats = []

        def up(path: str, idx: int) -> str:
            local = Path(path)
            if not local.exists():
                raise LorapodError(f"{local} does not exist", hint="fix data.path in the spec")
            dest = f"data/{idx}-{local.name}"
            st = self.remote(lambda: work.push_path(local, dest), f"upload {local.name}")
            self.sync_stats.append(st)
            self.say(f"synced {local.name}: {st.files_transferred} files, {st.literal_bytes} bytes sent")
            return dest

        return self.spec.relocated(up)

    def _watchdog_config(self) -> dict[str, Any]:
        assert self.inst is not None and self.iid is not None
        o = self.opts
        row = self.ledger.instance(self.iid)
        assert row is not None
        now = time.time()
        other_usd = self.ledger.usd(self.job_id, now) - row.usd(now)
        max_usd, max_hours, self.cap_note = self._effective_caps()
        self.max_usd, self.max_hours = max_usd, max_hours  # the controller stops the job at them too
        cfg: dict[str, Any] = {
            **self.provider.watchdog_config(self.inst),
            "elapsed_at_start_s": max(0.0, now - row.created_at),
            "usd_per_hour": row.usd_per_hour,
            "max_usd": (max_usd - other_usd) if max_usd else None,
            "max_hours": max_hours,
            # The controller asks first (stop_margin_s before a cap); the watchdog's own STOP is the
            # fallback for a controller that is gone, so it comes later.
            "cap_margin_s": o.stop_margin_s / 2,
            "stop_wait_s": o.stop_wait_s,
        }
        cfg.update(o.watchdog)
        return cfg

    cap_note = ""

    def _effective_caps(self) -> tuple[float | None, float | None, str]:
        """The caps the job runs under: the user's; else twice the planner's estimate for the
        chosen offer; else ``default_cap_hours``. Said at launch, so nobody is surprised."""
        if self.max_usd or self.max_hours:
            parts = [f"${self.max_usd:g}" if self.max_usd else "", f"{self.max_hours:g} h" if self.max_hours else ""]
            return self.max_usd, self.max_hours, "cap " + " / ".join(p for p in parts if p)
        extra = self.offer.extra if self.offer else {}
        if extra.get("plan_usd"):
            usd, hours = 2 * float(extra["plan_usd"]), 2 * float(extra["plan_hours"])
            return usd, hours, (f"default cap ${usd:.2f} / {hours:.1f} h: twice the planner's estimate; "
                                "set --max-usd / --max-hours to change it")
        hours = self.opts.default_cap_hours
        return None, hours, (f"default cap {hours:g} h: the planner cannot estimate this job; "
                             "set --max-usd / --max-hours to change it")

    def console_link(self) -> str:
        return getattr(self.provider, "console_url", None) or f"the {self.provider.name} host ({self.target})"

    # ------------------------------------------------------------------ follow

    def _follow(self) -> tuple[str, str]:
        assert self.work is not None
        o = self.opts
        next_pull = time.monotonic() + o.pull_every_s
        while True:
            st = self.remote(lambda: self.work.poll(self.metrics_offset, limit=POLL_BYTES,  # type: ignore[union-attr]
                                                    watchdog_beat_s=beat_limit_s(self.wd_cfg)), "poll")
            more = self._take_metrics(st.metrics)
            self._check_watchdog(st)
            if st.gone:
                raise RemoteError("the job's work folder vanished on the instance (the watchdog or someone "
                                  "removed it)", hint="see `lorapod logs JOB`; resume with `lorapod run --resume JOB`")
            if st.stop and not self.stop_reason:
                self.stop_reason = f"the watchdog asked the job to stop: {st.stop}"
                self.stop_requested_at = time.monotonic()
                self.say(self.stop_reason)
            if st.done and not more:  # done, and every metrics line read
                break
            self._check_budget()
            if self.stop_requested_at and time.monotonic() - self.stop_requested_at > o.stop_wait_s:
                self.say(f"the job did not stop within {o.stop_wait_s:.0f} s of STOP; stopping it")
                break
            if time.monotonic() >= next_pull:
                try:
                    self._pull("progress")
                except LocalDiskFull as exc:  # the job goes on; the final pull waits for space
                    self.say(f"progress pull skipped: {exc.message}; {exc.hint}")
                next_pull = time.monotonic() + o.pull_every_s
            if not more:  # a full chunk of metrics: read the rest now, not a poll later
                time.sleep(o.poll_s)
        self._final_pull()
        if st.exit and st.exit.startswith("killed:"):
            raise RemoteError(f"the on-instance watchdog stopped the job at step {self.last_step} "
                              f"({st.exit.split(':', 1)[1].strip()})",
                              hint=f"see {self.run.root}/job.log; resume with `lorapod run --resume {self.job_id}`")
        if self.stop_reason:
            return "stopped", f"stopped at step {self.last_step}: {self.stop_reason}"
        if st.exit and st.exit.strip() == "0":
            return "done", f"finished at step {self.last_step}"
        tail = self.remote(lambda: self.work.job_log_tail(), "job log")  # type: ignore[union-attr]
        self.say("job log (last lines):\n" + tail)
        raise RemoteError(f"the job failed on the instance (exit {st.exit or 'unknown'}) at step {self.last_step}",
                          hint=f"see {self.run.root}/job.log; fix, then `lorapod run --resume {self.job_id}`")

    def _take_metrics(self, data: bytes) -> bool:
        """Use one poll's metrics bytes, bounded and validated (compute/metrics_feed.py): a
        forged or broken line is dropped and counted, never fatal. True when the poll's chunk was
        full (more is waiting on the instance)."""
        if not data:
            return False
        before = self.feed.dropped_total
        records, full = self.feed.take(data)
        self.metrics_offset = self.feed.offset
        if records:
            row = self.ledger.instance(self.iid) if self.iid is not None else None
            usd, rate = self.ledger.usd(self.job_id), (row.usd_per_hour if row is not None else None)
            if self.view is None:
                from lorapod.engine.progress import MetricsView

                self.view = MetricsView(usd_cap=self.max_usd)
        for rec in records:
            if self.first_step_at is None:
                self.first_step_at = time.monotonic()
                self.say(f"first training step after {self.first_step_at - self.t0:.1f} s")
                if self.job_started_at is not None:
                    self.phase("first step", self.first_step_at - self.job_started_at,
                               "job start to its first step: model download, load, caching")
            self.last_step = rec["step"]
            shown = self.view.feed(rec, usd=usd, usd_per_hour=rate)  # engine/progress.py: one rendering
            if shown:
                self._say(shown)
        if self.feed.dropped_total > before:
            self.say(f"ignored {self.feed.dropped_total - before} metrics line(s) from the instance "
                     f"(so far: {self.feed.describe_dropped()})")
        if records:
            self.ledger.job_update(self.job_id, last_step=self.last_step)
        return full

    _wd_unknown_since: float | None = None
    _wd_grace_until = 0.0
    _wd_restarts = 0
    _wd_down_said = False
    wd_cfg: dict[str, Any] = {}

    def _check_watchdog(self, st: Any) -> None:
        """The watchdog must live while the job runs (DESIGN invariant 9): checked on every poll,
        started again when it is gone (a host may kill it), said, and recorded for `ps`."""
        now = time.monotonic()
        limit = beat_limit_s(self.wd_cfg)
        if st.done or st.watchdog is True or now < self._wd_grace_until:
            self._wd_unknown_since = None
            return
        if st.watchdog is None:  # no pid file: starting, or removed
            self._wd_unknown_since = self._wd_unknown_since or now
            if now - self._wd_unknown_since < limit:
                return
        if self._wd_restarts >= self.opts.watchdog_restarts:
            if not self._wd_down_said:
                self._wd_down_said = True
                self.say(f"WARNING: the watchdog on the instance is down and was restarted {self._wd_restarts} "
                         "time(s) already; nothing on the instance destroys it if this controller dies: keep "
                         f"this process running, or `lorapod down {self.job_id}`")
                self.ledger.event("watchdog", "down: not restarted again", job_id=self.job_id, instance_id=self.iid)
            return
        self._wd_restarts += 1
        self.say(f"the watchdog on the instance is not running (killed?); starting it again "
                 f"({self._wd_restarts}/{self.opts.watchdog_restarts})")
        self.ledger.event("watchdog", "down: restarting", job_id=self.job_id, instance_id=self.iid)
        cfg = self._watchdog_config()  # the caps counted from the instance's creation, as before
        python = (self.base_boot or self.opts.bootstrap).python
        self.remote(lambda: restart_watchdog(self.work, cfg, python), "restart the watchdog")
        self.ledger.event("watchdog", "restarted", job_id=self.job_id, instance_id=self.iid)
        self._wd_unknown_since = None
        self._wd_grace_until = time.monotonic() + limit

    def _check_budget(self) -> None:
        if self.stop_reason or self.iid is None:
            return
        row = self.ledger.instance(self.iid)
        assert row is not None
        now = time.time()
        left = []
        if self.max_usd and row.usd_per_hour > 0:
            left.append((self.max_usd - self.ledger.usd(self.job_id, now)) / row.usd_per_hour * 3600)
        if self.max_hours:
            hours_used = sum(max(0.0, (r.destroyed_at or now) - r.created_at) for r in self.ledger.job_instances(self.job_id))
            left.append(self.max_hours * 3600 - hours_used)
        if left and min(left) <= self.opts.stop_margin_s:
            which = "max-usd" if self.max_usd and len(left) and min(left) == left[0] else "max-hours"
            self._request_stop(f"{which} cap is {max(0, min(left)):.0f} s away")

    def _request_stop(self, reason: str) -> None:
        assert self.work is not None
        self.stop_reason = reason
        self.stop_requested_at = time.monotonic()
        self.say(f"asking the job to checkpoint and stop: {reason}")
        self.remote(lambda: self.work.request_stop(reason), "write STOP")  # type: ignore[union-attr]

    _pulls: PullGuard | None = None
    disk_full = False  # this machine's disk could not take the results (compute/pulls.py)

    @property
    def pulls(self) -> PullGuard:
        """Every pull goes through one guard: bounded, sparse-aware, free space checked first."""
        if self._pulls is None:
            assert self.work is not None
            plan_gb = (self.offer.extra if self.offer else {}).get("plan_pull_gb")
            self._pulls = PullGuard(self.work, self.run.root, (self.base_boot or self.opts.bootstrap).python,
                                    pull_cap_bytes(self.spec, plan_gb), self.say)
        return self._pulls

    def _pull(self, why: str, newest_only: bool = False) -> None:
        assert self.work is not None
        st = self.remote(lambda: self.pulls.pull(why, newest_only=newest_only), f"pull ({why})")
        self.last_pull_at = time.monotonic()
        if st.files_transferred:
            self.say(f"pulled {st.files_transferred} files ({why})")

    def _final_pull(self) -> None:
        """Pull, then compare sizes and sha256 of every file with the instance's; pull again on a mismatch."""
        assert self.work is not None
        py = (self.base_boot or self.opts.bootstrap).python
        for attempt in range(3):
            self._pull_through_full_disk("final")
            remote = self.remote(lambda: self.work.manifest(py), "checksums")  # type: ignore[union-attr]
            local = local_manifest(self.run.root)
            bad = [k for k, v in remote.items() if local.get(k) != v and not self.pulls.leaves(k)]
            if not bad:
                self._fetch_logs()  # before PULLED: the watchdog may remove the folder right after it
                self.remote(self.work.mark_pulled, "mark pulled")
                self.pulled = True
                self.last_pull_at = time.monotonic()
                self.say(f"final pull verified: {len(remote)} files, sizes and sha256 match")
                return
            self.say(f"final pull: {len(bad)} files differ (e.g. {bad[0]}); pulling again ({attempt + 1}/3)")
        raise RemoteError("the pulled files do not match the instance's after 3 tries",
                          hint=f"the instance is being destroyed; check {self.run.root}")

    # ------------------------------------------------------------------ stopping

    def _orderly_stop(self, why: str) -> None:
        """Interrupted: STOP -> wait (bounded) -> final pull. A second signal skips to destroy."""
        if self.work is None or not self.job_started:
            return  # interrupted before the job ran: nothing to checkpoint or pull
        self._hard_deadline = self.deadline(self.opts.stop_wait_s + self.opts.reconnect_s)
        try:
            self.stop_reason = why
            self.say("interrupted: asking the job to checkpoint, then pulling and destroying "
                     "(Ctrl-C again to skip the pull)")
            self.remote(lambda: self.work.request_stop(why), "write STOP")  # type: ignore[union-attr]
            deadline = self.deadline(self.opts.stop_wait_s)
            while time.monotonic() < deadline:
                st = self.remote(lambda: self.work.poll(self.metrics_offset, limit=POLL_BYTES), "poll")  # type: ignore[union-attr]
                if not self._take_metrics(st.metrics) and st.done:
                    break
                time.sleep(self.opts.poll_s)
            self._final_pull()
        except Interrupted:
            self.say("skipping the final pull")
        except LorapodError as exc:
            self.say(f"could not pull everything before destroying: {exc.message}")

    def _pull_through_full_disk(self, why: str) -> None:
        """A pull that finds this machine's disk full: say so and what to free, bring the newest
        checkpoint and the adapter first (the smallest set that resumes), and keep the instance,
        within the caps, for ``disk_full_grace_s`` while retrying; then give up (teardown follows)."""
        try:
            self._pull(why)
            return
        except LocalDiskFull as exc:
            full = exc
        self.disk_full = True
        o = self.opts
        borrowed = bool(getattr(self.provider, "borrowed", False))
        if borrowed:  # the host's watchdog must not remove the only copy meanwhile
            self._mark_keep(True)
        grace = max(0.0, min(o.disk_full_grace_s, self._seconds_to_cap() - o.stop_margin_s))
        span = f"{grace / 60:.1f} min" if grace >= 120 else f"{grace:.0f} s"
        self.say(f"{full.message}; {full.hint}. lorapod keeps the instance for up to {span} "
                 f"(within the caps), retrying every {o.disk_full_retry_s:g} s, the newest checkpoint and the "
                 "adapter first")
        deadline = time.monotonic() + grace
        newest_home = False
        while True:
            try:
                self._pull(f"{why}: newest checkpoint and adapter", newest_only=True)
                if not newest_home:
                    newest_home = True
                    self.say("the newest checkpoint and the adapter are home (enough to resume); the rest waits "
                             "for space")
                self._pull(why)
                self.disk_full = False
                if borrowed:
                    self._mark_keep(False)
                self.say("space was freed: everything is pulled")
                return
            except LocalDiskFull as exc:
                full = exc
            if time.monotonic() + o.disk_full_retry_s > deadline:
                raise LocalDiskFull(full.folder, full.needed, full.free)
            time.sleep(o.disk_full_retry_s)

    def _seconds_to_cap(self) -> float:
        """Seconds before the job's dollar or hour cap (inf without a cap)."""
        if self.iid is None:
            return float("inf")
        row = self.ledger.instance(self.iid)
        now = time.time()
        left = [float("inf")]
        if row is not None and self.max_usd and row.usd_per_hour > 0:
            left.append((self.max_usd - self.ledger.usd(self.job_id, now)) / row.usd_per_hour * 3600)
        if self.max_hours:
            left.append(self.max_hours * 3600 - sum(max(0.0, (r.destroyed_at or now) - r.created_at)
                                                    for r in self.ledger.job_instances(self.job_id)))
        return min(left)

    def _salvage(self) -> None:
        """On an error, bring home whatever is there before the instance goes (best effort)."""
        if self.work is None:
            return
        try:
            st = self.pulls.pull("salvage")
            self.say(f"salvaged {st.files_transferred} files before teardown")
        except Exception as exc:
            self.say(f"could not salvage files: {exc}")

    def _teardown(self) -> None:
        if self._hb_stop is not None:
            self._hb_stop.set()
        if self.work is not None and not self.pulled and self._signals < 2:
            self._fetch_logs()
        if self.iid is not None and self.disk_full and getattr(self.provider, "borrowed", False) \
                and self.work is not None:
            self._keep_on_host()
        elif self.iid is not None:
            self._destroy_instance(self.stop_reason or "job over")
        if self.transport is not None:
            with contextlib.suppress(Exception):
                self.transport.close()
        if self.opts.identity is None and self.iid is None:  # destroyed: the job's own key is no longer needed
            key_dir = lorapod_home() / "keys" / self.job_id
            for f in key_dir.glob("id_ed25519*"):
                f.unlink(missing_ok=True)

    def _mark_keep(self, keep: bool) -> None:
        """KEEP in the work folder: the watchdog on a borrowed host leaves the folder alone."""
        assert self.work is not None
        cmd = f"touch {self.work.q('KEEP')}" if keep else f"rm -f {self.work.q('KEEP')}"
        with contextlib.suppress(Exception):
            self.remote(lambda: self.work.sh(cmd, timeout=30, check=False), "mark the results kept")  # type: ignore[union-attr]

    def _keep_on_host(self) -> None:
        """An ssh:// host whose results could not come home: its work folder stays (KEEP tells the
        watchdog there not to remove it) until `lorapod pull`; nothing bills on a borrowed host."""
        assert self.work is not None
        self._mark_keep(True)
        self.say(f"the results stay on {self.target} in {self.work.dir} (this machine's disk is full): free "
                 f"space here, then `lorapod pull {self.job_id}` and `lorapod down {self.job_id}`")
        self.ledger.event("instance", "kept: results not yet home (this machine's disk is full)",
                          job_id=self.job_id, instance_id=self.iid)

    def _fetch_logs(self) -> None:
        """job.log and watchdog.log sit beside the run folder on the instance: keep a copy."""
        assert self.work is not None
        for name in ("job.log", "watchdog.log"):
            try:
                out = self.work.sh(f"cd {self.work.q()} && {guarded_read('cat', name)}", timeout=30, check=False)
                if out.returncode == 0 and out.stdout:
                    dest = self.run.root / name
                    if dest.is_symlink() or (dest.exists() and not dest.is_file()):
                        dest.unlink()
                    dest.write_bytes(out.stdout)
            except Exception:
                continue

    def _destroy_instance(self, note: str) -> bool:
        """destroy -> confirm with the provider -> ledger. Retried with backoff up to the deadline;
        a second signal ends the retries after the current call. False (and ``self.unconfirmed``)
        when the provider did not confirm: never reported as success."""
        iid, inst = self.iid, self.inst
        if iid is None:
            return True
        self.ledger.instance_destroying(iid, note)
        row = self.ledger.instance(iid)
        provider_id = inst.id if inst else (row.provider_id if row else None)
        if provider_id is None and not getattr(self.provider, "borrowed", False):
            # create() never answered: the instance may exist all the same; its label finds it.
            found = self._find_by_label(self.opts.create_settle_s)
            if found is None:
                self.ledger.instance_create_failed(iid, f"no instance labelled {self.label} at the provider")
                self.say(f"no instance labelled {self.label} at {self.provider.name}: nothing was created")
                self.iid = None
                return True
            self._created(found)
            inst, provider_id = found, found.id
            self.ledger.instance_destroying(iid, note)
        if provider_id is None or (getattr(self.provider, "borrowed", False) and self.work is None):
            # A borrowed host where nothing was set up: the "instance" was only a name.
            self.ledger.instance_destroyed(iid, "nothing was created on the host")
            self.iid = None
            return True
        deadline = self.deadline(self.opts.destroy_deadline_s)
        delay = 1.0
        while True:
            try:
                self.provider.destroy(provider_id)
                probe = inst or Instance(provider_id, self.provider.name, "running", label=self.job_id)
                if self.provider.refresh(probe).state == "gone":  # confirmed by the provider, not assumed
                    self.ledger.instance_destroyed(iid)
                    if self.last_pull_at is not None:
                        self._billed_after_pull = time.monotonic() - self.last_pull_at
                    self.say(f"instance {provider_id} destroyed (confirmed)")
                    self.iid = None
                    return True
                self.say(f"destroy of {provider_id}: the provider still lists it")
            except AuthRefused as exc:
                self.say(f"destroy of {provider_id} impossible: {exc.message}")
                break
            except LorapodError as exc:
                self.say(f"destroy of {provider_id} failed: {exc.message}")
            if time.monotonic() + delay > deadline or self._signals >= 2:
                break
            time.sleep(delay)
            delay = min(30.0, delay * 2)
        self.unconfirmed = provider_id
        backstop = ("the on-instance watchdog keeps trying to destroy it; " if self.watchdog_started
                    and self.provider.name in ("runpod", "vast") else "")
        self.say(f"could NOT confirm that {provider_id} is gone: it may still bill. {backstop}check "
                 f"{self.console_link()} and run `lorapod down {self.job_id}`")
        return False


def _end_of_last_line(path: Path, chunk: int = 1 << 16) -> int:
    """The offset just after the last newline of ``path``, read backwards in bounded chunks
    (the pulled metrics file may be large; it is never read whole)."""
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            cut = fh.read(pos - start).rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            pos = start
    return 0


def transport_for(provider: Provider, inst: Instance, identity: Path | None, iid: str) -> Transport:
    """SSH to the instance with a known_hosts file of its own (host key pinned on first use),
    unless the provider brings its own transport (local shell, or an SSH host's shared pin)."""
    make = getattr(provider, "transport", None)
    known = lorapod_home() / "known_hosts" / iid
    if make is not None:
        return make(inst, identity, known)
    return SSHTransport(inst.ssh_host or "", inst.ssh_port, inst.ssh_user, identity, known)


def _shell_value(v: str) -> str:
    import shlex

    return shlex.quote(v)


def run_remote(spec, provider: Provider, target: str, opts: RunOptions | None = None, ledger: Ledger | None = None,
               spec_path: str | None = None, say: Callable[[str], None] = print,
               resume_job: str | None = None) -> Summary:
    """Run ``spec`` on ``provider`` and bring the run folder home; see :class:`Session`."""
    s = Session(spec, provider, target, opts, ledger, spec_path, say, resume_job)
    return s.run_job()


__all__ = ["Interrupted", "RunOptions", "Session", "Summary", "new_job_id", "run_remote"]
