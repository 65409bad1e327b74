"""Provision: make the leased instance run the job, guarded from its first second.

``work folder -> probe the image -> watchdog (standard library only, so before any install) and
its proof of life -> heartbeat -> rsync if missing -> bootstrap -> sync data -> secrets -> start
the job detached``. :func:`start_watchdog` comes first (DESIGN invariant 5); :func:`provision`
then does everything that may be slow, already guarded.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any

from lorapod.compute.acquire import Lease
from lorapod.compute.bootstrap import bootstrap_for
from lorapod.compute.context import JobContext
from lorapod.compute.guards import guard_script
from lorapod.compute.remote import PULL_EXCLUDES, Bootstrap, RemoteWork, with_device
from lorapod.compute.secrets import secrets_for
from lorapod.errors import LorapodError
from lorapod.home import lorapod_home


@dataclass(frozen=True)
class Watched:
    """The instance once its watchdog runs: the bootstrap with the Python the probe chose, the
    watchdog's config, the caps it enforces (and how they were chosen), the heartbeat's stop, and
    the image's facts (None where the job runs here)."""

    boot: Bootstrap
    watchdog: dict[str, Any]
    cap_note: str
    heartbeat: threading.Event
    host: Any = None  # hostfacts.HostFacts


@dataclass(frozen=True)
class Started:
    """The job runs detached on the instance."""

    argv: list[str]
    at: float  # monotonic


def open_work(ctx: JobContext, lease: Lease) -> RemoteWork:
    """The job's work folder on the instance (nothing is sent yet)."""
    work = RemoteWork(lease.transport, ctx.job_id, cache_root=ctx.provider.cache_root())
    ctx.ledger.job_update(ctx.job_id, remote_dir=work.dir, state="running")
    return work


def start_watchdog(ctx: JobContext, lease: Lease, work: RemoteWork) -> Watched:
    """The first thing after SSH answers: the image's facts and the watchdog (standard library
    only, so before any bootstrap), with the job's caps, then the heartbeat thread."""
    provider = ctx.provider
    boot = bootstrap_for(ctx.opts.bootstrap, provider, ctx.spec)
    host = None
    if not provider.traits.runs_here:  # the image's facts, in its first seconds
        container = not provider.traits.borrowed  # ssh://: your PATH first
        boot, host, choice = ctx.remote(lambda: work.probe(boot, container), "probe the instance")
        ctx.say(f"instance facts: {host.describe()}")
        ctx.say(f"Python on the instance: {choice.why}")
    wd, cap_note = watchdog_config(ctx, lease)
    python = boot.python
    # The watchdog runs under the instance's base interpreter: standard library only.
    ctx.remote(lambda: work.start_watchdog(wd, python), "start the watchdog")
    pid = ctx.remote(work.watchdog_alive, "check the watchdog")  # or WatchdogNotRunning: teardown destroys
    ctx.say(f"watchdog started on the instance ({cap_note}; running, pid {pid})")
    return Watched(boot, wd, cap_note, _start_heartbeat(work, float(wd.get("heartbeat_timeout_s", 600.0))), host)


def provision(ctx: JobContext, lease: Lease, work: RemoteWork, watched: Watched) -> Started:
    """Bootstrap at the controller's versions, upload the data (and, to resume, the run folder),
    write the spec, the guard and the secrets, and start the job detached."""
    o, boot, host = ctx.opts, watched.boot, watched.host
    if host is not None:  # after the watchdog: a slow apt-get is already guarded
        ctx.say(ctx.remote(lambda: work.provide_rsync(host), "provide rsync"))
    work.local_log = ctx.run.root / "env.log"
    t = time.monotonic()
    facts = ctx.remote(lambda: work.bootstrap(boot, lorapod_home() / "wheels"), "bootstrap")
    ctx.say(f"bootstrapped: Python {facts['python']}, lorapod {facts['lorapod']} ({boot.strategy}), "
            f"GPU: {', '.join(facts['gpus']) or 'none'}")
    if facts["env"].torch_note:
        ctx.say(facts["env"].torch_note)
    ctx.phase("environment", time.monotonic() - t, facts["env"].describe())
    t = time.monotonic()
    remote_spec = _sync_inputs(ctx, work)
    ctx.phase("data sync", time.monotonic() - t)
    wd = watched.watchdog
    files = {"spec.yaml": (remote_spec.to_yaml().encode(), 0o600),
             "guard.sh": (guard_script(boot.python, float(wd.get("heartbeat_timeout_s", 600.0)),
                                       float(wd.get("poll_s", 10.0))), 0o700)}
    names, withheld = secrets_for(ctx.spec, lease.offer, o.forward_env)
    if withheld:
        ctx.say(withheld)
    secrets = "".join(f"{k}={shlex.quote(os.environ[k])}\n" for k in names if os.environ.get(k))
    if secrets:
        files["secrets.env"] = (secrets.encode(), 0o600)
        ctx.say(f"sending {', '.join(k for k in names if os.environ.get(k))} to the instance (0600 file)")
    if ctx.resume and any(ctx.run.checkpoints.glob("*")):
        sent = ctx.remote(lambda: work.push_path(ctx.run.root, "run", delete=False, excludes=PULL_EXCLUDES),
                          "upload checkpoints")
        ctx.say(f"uploaded the run folder to resume ({sent.literal_bytes} bytes sent)")
    argv = with_device(o.job_command(facts["job_python"], "spec.yaml", "run", ctx.resume), facts["device"])
    ctx.remote(lambda: work.start_job(files, argv), "start the job")
    started = Started(argv, time.monotonic())
    ctx.say(f"job started on the instance: {' '.join(argv)}")
    return started


def _start_heartbeat(work: RemoteWork, timeout_s: float) -> threading.Event:
    """Touch HEARTBEAT from a thread as well, so a long pull (many GB of checkpoints) never
    looks like a silent controller to the watchdog. Returns the event that stops it."""
    every, stop = max(0.5, min(60.0, timeout_s / 4)), threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            try:
                work.sh(f"touch {work.q('HEARTBEAT')} 2>/dev/null || true", timeout=30, check=False)
            except Exception:  # a dropped connection: the main loop reports and reconnects
                continue

    threading.Thread(target=beat, name="lorapod-heartbeat", daemon=True).start()
    return stop


def _sync_inputs(ctx: JobContext, work: RemoteWork) -> Any:
    """Upload data (and a local base model or prompt file); the spec points at the copies."""
    from pathlib import Path

    def up(path: str, idx: int) -> str:
        local = Path(path)
        if not local.exists():
            raise LorapodError(f"{local} does not exist", hint="fix data.path in the spec")
        dest = f"data/{idx}-{local.name}"
        sent = ctx.remote(lambda: work.push_path(local, dest), f"upload {local.name}")
        ctx.say(f"synced {local.name}: {sent.files_transferred} files, {sent.literal_bytes} bytes sent")
        return dest

    return ctx.spec.relocated(up)


def watchdog_config(ctx: JobContext, lease: Lease) -> tuple[dict[str, Any], str]:
    """The watchdog's config for this instance, with the job's caps counted from the instance's
    creation (a restarted watchdog gets the same), and the line that says which caps apply.
    Sets ``ctx.max_usd``/``ctx.max_hours``: the controller stops the job at them too."""
    o, ledger = ctx.opts, ctx.ledger
    row = ledger.instance(lease.ledger_id)
    now = time.time()
    # the row is ours; while a locked ledger queues its writes it may not be readable yet
    created_at = row.created_at if row else now - (time.monotonic() - lease.created_at_mono)
    rate = row.usd_per_hour if row else (lease.instance.usd_per_hour or lease.offer.usd_per_hour)
    other_usd = ledger.usd(ctx.job_id, now) - (row.usd(now) if row else 0.0)
    max_usd, max_hours, cap_note = _effective_caps(ctx, lease)
    ctx.max_usd, ctx.max_hours = max_usd, max_hours
    cfg: dict[str, Any] = {
        **ctx.provider.watchdog_config(lease.instance),
        "elapsed_at_start_s": max(0.0, now - created_at),
        "usd_per_hour": rate,
        "max_usd": (max_usd - other_usd) if max_usd else None,
        "max_hours": max_hours,
        # The controller asks first (stop_margin_s before a cap); the watchdog's own STOP is the
        # fallback for a controller that is gone, so it comes later.
        "cap_margin_s": o.stop_margin_s / 2,
        "stop_wait_s": o.stop_wait_s,
    }
    cfg.update(o.watchdog)
    return cfg, cap_note


def _effective_caps(ctx: JobContext, lease: Lease) -> tuple[float | None, float | None, str]:
    """The caps the job runs under: the user's; else twice the planner's estimate for the
    chosen offer; else ``default_cap_hours``. Said at launch, so nobody is surprised."""
    if ctx.max_usd or ctx.max_hours:
        parts = [f"${ctx.max_usd:g}" if ctx.max_usd else "", f"{ctx.max_hours:g} h" if ctx.max_hours else ""]
        return ctx.max_usd, ctx.max_hours, "cap " + " / ".join(p for p in parts if p)
    est = lease.estimate
    if est is not None and est.usd_total > 0:
        usd, hours = 2 * est.usd_total, 2 * est.hours_total
        return usd, hours, (f"default cap ${usd:.2f} / {hours:.1f} h: twice the planner's estimate; "
                            "set --max-usd / --max-hours to change it")
    hours = ctx.opts.default_cap_hours
    return None, hours, (f"default cap {hours:g} h: the planner cannot estimate this job; "
                         "set --max-usd / --max-hours to change it")
