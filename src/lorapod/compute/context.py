"""What every stage of a remote job shares: the options, the job's identity and its log.

The stages (:mod:`~lorapod.compute.acquire`, :mod:`~lorapod.compute.provision`,
:mod:`~lorapod.compute.follow`, :mod:`~lorapod.compute.teardown`) each take a :class:`JobContext`
and the results of the stages before them; :mod:`lorapod.compute.session` runs them in order.
The context holds only what is the job's for its whole life (spec, provider, ledger, run folder,
caps) and the two signals every wait must hear (a second Ctrl-C, the stop's hard deadline).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lorapod.compute.deadman import DeadMan
from lorapod.compute.provider import Instance, Offer, Provider
from lorapod.compute.remote import Bootstrap, job_command_from_env
from lorapod.compute.transport import Transport
from lorapod.compute.wait import deadline_in, retrying
from lorapod.errors import LorapodError
from lorapod.fsutil import append_text
from lorapod.rundir import RunDir
from lorapod.store.ledger import Ledger

if TYPE_CHECKING:
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

JobCommand = Callable[[str, str, str, bool], list[str]]


class Referee(Protocol):
    """Decides what a dropped connection means before any reconnect (compute/verdict.py ``Judge``)."""

    def on_lost(self, exc: Exception, since: float) -> None: ...

    def check_down(self) -> None:
        """Raise when the user asked ``lorapod down`` for this job: nothing more is rented or waited for."""
        ...


class Interrupted(LorapodError):
    """Ctrl-C or SIGTERM: the job is stopped in order (checkpoint, pull, destroy)."""

    exit_code = 130


WEEK_S = 7 * 24 * 3600.0
#: RunOptions' numbers and the range each may take (seconds unless named otherwise)
BOUNDS: dict[str, tuple[float, float]] = {
    "max_usd": (1e-6, 1e6), "max_hours": (1e-6, 24 * 365.0), "poll_s": (0.01, 3600.0),
    "pull_every_s": (0.01, 86400.0), "ready_deadline_s": (1.0, WEEK_S), "pull_extension_s": (0.0, WEEK_S),
    "auth_grace_s": (0.0, 86400.0), "direct_ssh_s": (0.0, 86400.0), "progress_every_s": (0.01, 86400.0),
    "max_offers": (1, 1000), "reconnect_s": (0.0, WEEK_S), "stop_margin_s": (0.0, WEEK_S),
    "stop_wait_s": (0.0, WEEK_S), "destroy_deadline_s": (0.0, WEEK_S), "create_attempts": (1, 100),
    "create_settle_s": (0.0, 86400.0), "default_cap_hours": (1e-6, 24 * 365.0), "watchdog_restarts": (0, 1000),
    "disk_full_grace_s": (0.0, WEEK_S), "disk_full_retry_s": (0.01, 86400.0), "preempt_confirm_s": (0.0, 3600.0),
    "spot_resume_wait_s": (0.0, WEEK_S), "max_preemptions": (0, 10_000), "deadman_s": (0.0, WEEK_S),
}


def bounded(name: str, value: Any, lo: float, hi: float) -> float:
    """``value`` as a float when it is a finite number in ``lo..hi``; a :class:`SpecError` that
    says so otherwise (never a traceback, never an infinite wait)."""
    from lorapod.errors import SpecError

    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise SpecError(f"{name} = {value!r}: must be a finite number from {lo:g} to {hi:g}",
                        hint="a NaN, an infinity or a value out of range would wait forever or bill without end")
    return float(value)


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
    #: a progress line per step (True), or as `lorapod train` prints (None: every step on a terminal;
    #: piped, the first, one every 30 s and the last: engine/progress.LineEvery). A library caller
    #: whose ``say`` acts on each step's line passes True.
    every_step: bool | None = None
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
    #: spot (compute/recovery.py): the tier policy of this run (never | auto | always, after
    #: ``--spot``) and whether it starts on spot (the plan's tier choice, prepare.py)
    spot_policy: str = "never"
    spot: bool = False
    #: after a job on a spot instance dies, how long the provider may take to report the stop
    #: (RunPod: 5 s SIGTERM before SIGKILL) before it is called a crash
    preempt_confirm_s: float = 20.0
    #: a paused (outbid) instance that resumes by itself is waited for this long, then once more
    #: after its bid is raised within the ceiling, before its husk is destroyed
    spot_resume_wait_s: float = 600.0
    max_preemptions: int = 6  # then the rest of the job runs on-demand
    #: the dead man's switch (compute/deadman.py): an instance no controller has reached this many
    #: seconds after its container started destroys itself with its scoped key; None or 0: no switch
    #: (``prepare_run`` sets the plan's: plan/cost.py ``deadman_minutes``)
    deadman_s: float | None = None

    def __post_init__(self) -> None:
        """Every number a user (or a script) can pass is finite and bounded, before anything is
        rented: ``--preempt-confirm-s nan`` once waited forever on a crashed spot job while it billed."""
        for name, (lo, hi) in BOUNDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            bounded(f"{name} (--{name.replace('_', '-')})", value, lo, hi)
        for name, value in self.watchdog.items():
            bounded(f"the watchdog's {name}", value, 0.0, WEEK_S)


@dataclass
class Claim:
    """What the job holds at the provider right now: the ledger row written before create, the
    instance once the provider named it, the connection once one was opened. Teardown destroys
    exactly this; acquire fills it in as it goes and drops it when an offer is given back."""

    ledger_id: str
    label: str
    offer: Offer
    identity: Path | None
    instance: Instance | None = None
    transport: Transport | None = None
    created_at_mono: float = 0.0
    #: the dead man's switch the create gave the instance (compute/deadman.py); disarmed once reached
    deadman: DeadMan | None = None


@dataclass
class JobContext:
    spec: JobSpec
    provider: Provider
    target: str
    opts: RunOptions
    ledger: Ledger
    run: RunDir
    job_id: str
    emit: Callable[[str], None] = print  # the caller's console; :meth:`say` also logs
    resume: bool = False
    t0: float = field(default_factory=time.monotonic)
    max_usd: float | None = None  # the caps the job runs under (provision may set the defaults)
    max_hours: float | None = None
    claim: Claim | None = None
    unconfirmed: str | None = None  # an instance whose destroy the provider did not confirm
    signals: int = 0  # SIGINT/SIGTERM/SIGHUP received so far
    in_teardown: bool = False
    hard_deadline: float | None = None  # set once stopping: nothing may wait past it
    #: the planner's job for ``spec``, planned once per run (None: the planner cannot estimate it)
    job: Job | None = None
    #: what decides a symptom's meaning (compute/verdict.py ``Judge``, installed by the session):
    #: asked before every reconnect, so no reconnect waits for a stopped, destroyed or downed machine
    referee: Referee | None = None

    @property
    def ledger_id(self) -> str | None:
        return self.claim.ledger_id if self.claim else None

    def say(self, msg: str) -> None:
        self.emit(msg)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with contextlib.suppress(OSError):  # a full local disk must not stop teardown
            append_text(self.run.root / "remote-events.log", f"{stamp} {msg}\n")
        self.ledger.event("session", msg, job_id=self.job_id, instance_id=self.ledger_id)

    def phase(self, name: str, seconds: float, note: str = "") -> None:
        """A setup step's duration, in the events log and the ledger (``lorapod ps`` and the
        planner's "boot + install" read them back)."""
        self.say(f"phase {name}: {seconds:.1f} s" + (f" - {note}" if note else ""))
        self.ledger.event("phase", json.dumps({"phase": name, "s": round(seconds, 2), "note": note,
                                               "provider": self.provider.name}),
                          job_id=self.job_id, instance_id=self.ledger_id)

    def remote(self, fn: Callable[[], Any], what: str) -> Any:
        """A remote operation that survives connection drops for up to ``reconnect_s``; before each
        reconnect the referee asks the provider (and the ledger for the user's ``down``) whether
        there is still something to reconnect to."""
        deadline = deadline_in(self.opts.reconnect_s)
        if self.hard_deadline is not None:
            deadline = min(deadline, self.hard_deadline)
        first_lost: list[float] = []

        def lost(exc: Exception) -> None:
            first_lost[:1] = first_lost[:1] or [time.time()]
            if self.referee is not None:
                self.referee.on_lost(exc, first_lost[0])
            self.say(f"connection lost during {what}; reconnecting")

        return retrying(fn, deadline, what, on_retry=lost)

    def check_down(self) -> None:
        """The user's ``lorapod down JOB`` wins over any wait or rental (raises; compute/verdict.py)."""
        if self.referee is not None:
            self.referee.check_down()

    def console_link(self) -> str:
        return self.provider.traits.console_url or f"the {self.provider.name} host ({self.target})"
