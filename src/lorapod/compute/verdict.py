"""What became of the job's instance, decided in one place: running, preempted, gone, failed.

The controller sees only symptoms: an SSH command that drops, a job that died, a work folder
that vanished. Which it is only the provider can say, and only the user can say they asked for it,
so every stage that meets a symptom hands it here (:class:`Judge`, installed once per job as
``JobContext.referee``) and acts on the typed answer, never on its own guess:

* :func:`ask` is the one reading of the provider's word about an instance (:class:`Fate`):
  ``exited`` for an instance rented interruptible is a **preemption** (RunPod's stopped spot pod,
  Vast.ai's paused outbid instance); ``gone`` is an instance that no longer exists (its watchdog,
  ``lorapod down``, the provider destroyed it); ``running`` is a lost connection, or a crash
  when the job died; anything else is not a preemption; no answer is ``unknown``, never taken
  for one.
* :meth:`Judge.on_lost`, before every reconnect: the user's ``lorapod down`` ends the job
  (:class:`DownRequested`), a preempted instance raises :class:`Preempted`, a gone one
  :class:`InstanceGone`, and only a running (or silent) one is reconnected to. A gone instance
  is recorded destroyed at the moment the connection first failed (the provider's own answer is
  the confirm rule of compute/teardown.py), so the ledger bills what the provider billed.
* :meth:`Judge.settle` waits, at most ``preempt_confirm_s``, for the provider to report a stop
  (RunPod reports it after its 5 s SIGTERM grace) before a job that died counts as a crash, and
  remembers that it waited, so a second look right after need not wait again.
* :meth:`Judge.requests` is the user's word: ``lorapod down JOB`` and ``lorapod stop JOB`` are
  ledger events (kinds ``down`` and ``stop``) newer than this controller, read at every poll,
  before every rental and on every symptom: ``down`` wins over recovery (nothing more is rented,
  the job ends destroyed at the user's request), ``stop`` ends it at the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import enum
import time
from dataclasses import dataclass

from lorapod.compute.context import JobContext
from lorapod.compute.provider import Instance, Provider
from lorapod.errors import LorapodError, RemoteError

#: ledger event kinds of the user's requests (compute/jobs.py writes them)
DOWN, STOP = "down", "stop"


class Fate(enum.Enum):
    RUNNING = "running"  # reachable in principle: a lost connection, or a crash if the job died
    PREEMPTED = "preempted"  # interruptible, taken back by the provider (stopped, paused)
    GONE = "gone"  # no longer exists at the provider
    FAILED = "failed"  # exited or in error, not interruptible
    UNKNOWN = "unknown"  # the provider did not answer, or says it is still starting


@dataclass(frozen=True)
class Verdict:
    fate: Fate
    instance: Instance


class Preempted(RemoteError):
    """The provider took the job's interruptible instance back (stopped / paused / outbid)."""

    def __init__(self, message: str, instance: Instance) -> None:
        super().__init__(message, hint="lorapod resumes the job from its newest checkpoint on another instance")
        self.instance = instance
        self.noticed_at = time.time()


class InstanceGone(RemoteError):
    """The provider says the instance no longer exists: its watchdog, ``lorapod down`` or the
    provider destroyed it. Never reconnected to; ``at`` is when the connection first failed."""

    def __init__(self, message: str, instance: Instance, at: float) -> None:
        super().__init__(message, hint="see `lorapod logs JOB`; resume with `lorapod run --resume JOB`")
        self.instance = instance
        self.at = at


class DownRequested(LorapodError):
    """``lorapod down JOB`` (or the dashboard's Destroy) asked for this job: nothing more is
    rented, what is saved is brought home within the grace ``down`` gives, and the instance is
    destroyed. The job ends ``stopped``, destroyed at the user's request."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"destroyed at your request ({reason})")
        self.reason = reason


def ask(provider: Provider, inst: Instance) -> Verdict:
    """The provider's word about ``inst`` now (the module docstring's table)."""
    try:
        now = provider.refresh(inst)
    except LorapodError:
        return Verdict(Fate.UNKNOWN, inst)
    if now.state == "exited" and (now.interruptible or inst.interruptible):
        return Verdict(Fate.PREEMPTED, now.with_(interruptible=True))
    if now.state == "gone":
        return Verdict(Fate.GONE, now)
    if now.state in ("exited", "error"):
        return Verdict(Fate.FAILED, now)
    return Verdict(Fate.RUNNING if now.state == "running" else Fate.UNKNOWN, now)


class Judge:
    """The one place that decides what a symptom means for one job (``ctx.referee``)."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        #: the user's requests count from this controller's start: an old ``down`` does not end a resume
        self.since = time.time()
        self.ruled_out_at: float | None = None  # the last full wait that found no preemption (monotonic)
        self.stop_taken: float = 0.0  # the newest ``stop`` request already acted on (its time)

    # ------------------------------------------------------------------ the user's word

    def requests(self) -> tuple[str | None, str | None]:
        """(down reason, stop reason) the user asked for since this controller started; a ledger
        that cannot be read answers nothing (the provider's word still holds)."""
        ledger, job = self.ctx.ledger, self.ctx.job_id
        try:
            down = ledger.last_event(job, DOWN, self.since)
            stop = ledger.last_event(job, STOP, max(self.since, self.stop_taken))
        except Exception:  # a locked or damaged ledger never stops a run
            return None, None
        return (down["message"] if down else None,
                stop["message"] if stop and stop["ts"] > self.stop_taken else None)

    def check_down(self) -> None:
        """Raise :class:`DownRequested` once the user asked to bring the job down."""
        down, _ = self.requests()
        if down is not None:
            raise DownRequested(down)

    def take_stop(self) -> str | None:
        """The user's ``lorapod stop`` not yet acted on (its reason), marked taken."""
        ledger, job = self.ctx.ledger, self.ctx.job_id
        try:
            stop = ledger.last_event(job, STOP, max(self.since, self.stop_taken))
        except Exception:
            return None
        if stop is None or stop["ts"] <= self.stop_taken:
            return None
        self.stop_taken = float(stop["ts"])
        return str(stop["message"])

    # ------------------------------------------------------------------ the provider's word

    def on_lost(self, exc: Exception, since: float) -> None:
        """Before a reconnect: raises :class:`DownRequested`, :class:`Preempted` or
        :class:`InstanceGone`; returns when reconnecting is right (running, or no answer)."""
        self.check_down()
        claim = self.ctx.claim
        inst = claim.instance if claim is not None else None
        if inst is None or self.ctx.provider.traits.runs_here:
            return
        v = ask(self.ctx.provider, inst)
        if v.fate is Fate.PREEMPTED:
            raise Preempted(f"the provider took instance {inst.id} back ({v.instance.message or 'stopped'})", v.instance)
        if v.fate is Fate.GONE:
            self.gone(v.instance, since)
            self.check_down()  # `lorapod down` may have been the one: it wrote its request first
            raise InstanceGone(f"instance {inst.id} no longer exists at {self.ctx.provider.name} (its watchdog, "
                               "`lorapod down` or the provider destroyed it)", v.instance, since)

    def gone(self, inst: Instance, at: float) -> None:
        """The provider confirmed ``inst`` gone: the ledger stops billing it at ``at`` (when the
        controller first lost it, not when it noticed), and there is nothing left to destroy."""
        claim = self.ctx.claim
        if claim is None or claim.instance is None or claim.instance.id != inst.id:
            return
        ledger = self.ctx.ledger
        row = ledger.instance(claim.ledger_id)
        if row is not None and row.live:
            ledger.instance_destroyed(claim.ledger_id, "gone: the provider reports it no longer exists",
                                      at=max(row.created_at, min(at, time.time())))
        if claim.transport is not None:
            with contextlib.suppress(Exception):
                claim.transport.close()
        self.ctx.claim = None

    def settle(self, wait_s: float, every_s: float = 1.0) -> Verdict | None:
        """After the job died on an interruptible instance: ask for up to ``wait_s`` until the
        provider reports a preemption (raised as :class:`Preempted`); the verdict it gave
        otherwise (None: not interruptible, nothing to ask)."""
        claim = self.ctx.claim
        inst = claim.instance if claim is not None else None
        if inst is None or not inst.interruptible:
            return None
        if wait_s > 0 and self.ruled_out_at is not None and time.monotonic() - self.ruled_out_at < 60:
            wait_s = 0.0  # the whole wait was just done: a second look need not wait again
        deadline = time.monotonic() + wait_s
        while True:
            v = ask(self.ctx.provider, inst)
            if v.fate is Fate.PREEMPTED:
                raise Preempted(f"the provider took instance {inst.id} back ({v.instance.message or 'stopped'})",
                                v.instance)
            if v.fate in (Fate.GONE, Fate.FAILED) or time.monotonic() + every_s > deadline:
                if wait_s > 0:
                    self.ruled_out_at = time.monotonic()
                return v
            time.sleep(every_s)

    def preempted(self, exc: LorapodError) -> Preempted | None:
        """Whatever a stage raised on an interruptible instance (an rsync killed mid-pull, a
        command cut off, a job that died): the :class:`Preempted` the provider says it was, or None."""
        if isinstance(exc, Preempted):
            return exc
        if isinstance(exc, InstanceGone | DownRequested):
            return None
        try:
            self.settle(self.ctx.opts.preempt_confirm_s)
        except Preempted as pre:
            first = exc.message.splitlines()[0] if exc.message else type(exc).__name__
            self.ctx.say(f"{first}: the instance was preempted")
            return pre
        return None
